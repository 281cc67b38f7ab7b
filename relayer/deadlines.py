"""Every time bound of a store derived from its ``lease_duration``, in one place.

A lane lease lasts ``lease_duration``; everything a member does under it is bounded by a
fraction of it, so that the lease never runs out while a batch still holds its lanes, and a
member that stops frees its lanes before another would take them over (docs/protocol.md):

- a batch admits rows for a quarter of the lease, waits for acknowledgements until an eighth
  before half of it and is over (committed or rolled back) at half of it (``batch``);
- a stopping worker waits for its batches that long (``stop``), and so do the transports'
  delivery timeouts and closes;
- a member beats three times a lease (``heartbeat``) and is dead a lease after its last beat;
- retries after database or broker trouble, and an idle store's fallback poll, wait at most a
  third of it;
- the server ends a session idle in a transaction after three quarters of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta


@dataclass(frozen=True, slots=True)
class Deadlines:
    """The bounds derived from one ``lease_duration`` (seconds)."""

    lease: float

    @classmethod
    def of(cls, lease_duration: timedelta) -> Deadlines:
        return cls(lease_duration.total_seconds())

    @property
    def batch(self) -> float:
        """A batch transaction's whole life: committed or rolled back by then."""
        return self.lease / 2

    @property
    def stop(self) -> float:
        """How long a stop waits for the batches in flight (each ends within ``batch``)."""
        return self.lease / 2

    @property
    def admission(self) -> float:
        """How long after its start a batch still hands new rows to a transport."""
        return self.lease / 4

    @property
    def commit_reserve(self) -> float:
        """Kept back from ``batch`` for the outcome statement and the commit."""
        return self.lease / 8

    @property
    def heartbeat(self) -> float:
        """A member's heartbeat period (it is dead a lease after its last beat)."""
        return self.lease / 3

    @property
    def longest_retry(self) -> float:
        """The longest wait before a lane is tried again after database or broker trouble,
        and the longest wait of an idle store's fallback poll."""
        return self.lease / 3

    @property
    def connection_wait(self) -> float:
        """How long a worker waits for a database connection of its budget before it reports
        the database as unavailable."""
        return self.lease / 4

    @property
    def idle_in_transaction(self) -> float:
        """The server ends a session idle in a transaction after this long."""
        return self.lease * 3 / 4
