"""The store gateway: every statement the relay, membership, unordered sending and maintenance
run, and the connections they run on.

Callers get frozen value objects and relayer errors only: psycopg, socket and pool errors are
translated once, here, into StoreError (with redacted messages and the driver's error chained).

- ``driver``: the connection type and the translation of driver errors;
- ``connections``: the pool of transaction connections, autocommit sessions, LISTEN;
- ``budget``: a worker's connection budget and the batch pool each database shares;
- ``listener``: one LISTEN connection for the stores of a database;
- ``databases``: the connections the stores of one database share in a worker;
- ``housekeeping``: the heartbeats and idle probes those stores send together;
- ``relay``: the ordered protocol's statements (membership, probes, lane batches);
- ``unordered``: claiming and settling unordered rows;
- ``maintenance``: retention and the health check.
"""

from relayer.store.connections import (
    Connect,
    Notifications,
    Session,
    StorePool,
    Transactions,
    Turns,
    batch_settings,
    can_listen,
    listen,
    local_settings,
    unordered_settings,
)
from relayer.store.driver import Connection
from relayer.store.maintenance import DroppedKey, MaintenanceStore
from relayer.store.relay import (
    FENCE_MARK,
    LaneHead,
    LaneRows,
    Outcomes,
    RelayStore,
    RowFailure,
    abandon,
)
from relayer.store.unordered import Claimed, Failure, UnorderedStore

__all__ = [
    "FENCE_MARK",
    "Claimed",
    "Connect",
    "Connection",
    "DroppedKey",
    "Failure",
    "LaneHead",
    "LaneRows",
    "MaintenanceStore",
    "Notifications",
    "Outcomes",
    "RelayStore",
    "RowFailure",
    "Session",
    "StorePool",
    "Transactions",
    "Turns",
    "UnorderedStore",
    "abandon",
    "batch_settings",
    "can_listen",
    "listen",
    "local_settings",
    "unordered_settings",
]
