"""The dispatcher connection of one database, shared by the cluster gates of its stores.

Each store's :class:`~relayer.dispatch.postgres.PostgresClusterState` keeps its own slots (the
session advisory locks of its queues' keys, distinct per store and queue) and its own schema
check; the connection, its lock, its generation (``epoch``: slots die with the connection that
holds them) and, behind a transaction pooler, its open transaction are the database's. So the
statements of the stores take turns on one connection, a lost connection loses the slots of
every store on it, and behind a transaction pooler the transaction stays open while any store
holds a slot (it ends once none does).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol

from relayer.store.driver import Connection, hang_up

if TYPE_CHECKING:
    from relayer.store.budget import ConnectionBudget

Connector = Callable[[], Awaitable[Connection]]


class Gate(Protocol):
    """What the connection needs of a store's gate that uses it."""

    def lost_connection(self) -> None:
        """The connection (and with it every slot it held) is gone."""
        ...

    def holds_slots(self) -> bool:
        """Slots held or released but not unlocked yet."""
        ...


class DispatcherConnection:
    """One dispatcher connection and its lock, shared by the gates ``attach``-ed to it.

    ``pinned`` (behind a transaction pooler): slots are held only inside an open transaction.
    With a ``budget``, the first gate in reserves a unit of it and the last one out gives it
    back (closing the connection).
    """

    def __init__(
        self, connector: Connector, *, pinned: bool, budget: ConnectionBudget | None = None
    ) -> None:
        self.connector = connector
        self.pinned = pinned
        self.budget = budget
        self.lock = asyncio.Lock()
        self.conn: Connection | None = None
        self.epoch = 0
        self.gates: list[Gate] = []
        self._reserved = False

    def __repr__(self) -> str:
        return f"DispatcherConnection(gates={len(self.gates)}, epoch={self.epoch})"

    async def attach(self, gate: Gate) -> None:
        if gate in self.gates:
            return
        if not self.gates and self.budget is not None and not self._reserved:
            await self.budget.reserve()
            self._reserved = True
        self.gates.append(gate)

    def detach(self, gate: Gate) -> bool:
        """Forget ``gate``; True when it was the last one (the caller closes the connection
        and then calls :meth:`closed`)."""
        if gate in self.gates:
            self.gates.remove(gate)
        return not self.gates

    def closed(self) -> None:
        """The connection was closed by the last gate out: give its unit back."""
        if not self.gates and self._reserved and self.budget is not None:
            self._reserved = False
            self.budget.unreserve()

    def open(self) -> Connection | None:
        """The connection if it is open (call under ``lock``)."""
        if self.conn is not None and not self.conn.closed:
            return self.conn
        return None

    async def connect(self) -> Connection:
        """A new connection, replacing a lost one (call under ``lock``)."""
        self.forget()
        self.epoch += 1  # a generation per connection: slots of an earlier one are void
        self.conn = await self.connector()
        return self.conn

    def forget(self) -> None:
        """The connection is gone or is being replaced: every slot it held is lost."""
        if self.conn is None and not any(gate.holds_slots() for gate in self.gates):
            return
        self.conn = None
        self.epoch += 1
        for gate in self.gates:
            gate.lost_connection()

    def idle(self) -> bool:
        """No gate holds a slot or has one to unlock."""
        return not any(gate.holds_slots() for gate in self.gates)

    async def close(self) -> None:
        """Close the connection (call under ``lock``), which frees whatever it holds."""
        conn, self.conn = self.conn, None
        if conn is not None and not conn.closed:
            await hang_up(conn)  # until its server process is gone (and its locks with it)
        self.epoch += 1
