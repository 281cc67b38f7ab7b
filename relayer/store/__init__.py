"""The store gateway: the part of relayer that runs statements, and the connections they run
on (the relay's, membership's, unordered sending's and maintenance's; those of ``relayer
status``, ``parked``, ``schema`` and ``queue``; the backlog gauges', the dashboard's and the
dispatch layer's; the application's, for the writer and the inbox). Outside this package
nothing opens a connection, runs a statement or catches a driver error:
tests/unit/test_architecture.py checks every other module (and names the few driver imports,
and the one catch of a DSN libpq cannot parse, that it allows, with their reasons). The gateway
sits below the code that uses it: its modules import none of dispatch, operations, relay,
worker, the dashboard, the CLI, fleet or the writer (tests/unit/test_store_layering.py); it
returns the values it reads, and what they mean (warnings, views, policies) is decided above
it.

Errors. Callers get relayer errors: psycopg, socket and pool errors are translated once, here,
into StoreError (or the relayer error the calling API promises), with redacted messages and
the driver's error chained. The operator's reads and changes (status, parked, backlog,
dashboard, inspection) keep the driver's own words in the StoreError
(driver.translated_verbatim): a store's line of ``status --all`` and a dashboard page show
them as the server said them. Statements on a connection the caller holds and passes in (the
schema's reads and checks, the queue controls, the table health, the writer's rows in the
application's transaction, the inbox's claim in the consumer's) leave a driver error as the
caller's own statements on it would, except where the gateway says what went wrong itself (a
missing schema or table: SchemaNotAppliedError; another lane count: LaneCountMismatchError; a
failed ``schema apply``: StoreError). Callers get frozen value objects (or typed rows), never
a cursor.

- ``driver``: opening connections, the connection type and the translation of driver errors;
- ``connections``: the pool of transaction connections, autocommit sessions, LISTEN;
- ``budget``: a worker's connection budget and the batch pool each database shares;
- ``listener``: one LISTEN connection for the stores of a database;
- ``databases``: the connections the stores of one database share in a worker;
- ``housekeeping``: the heartbeats and idle probes those stores send together;
- ``relay``: the ordered protocol's statements (membership, probes, lane batches);
- ``wire``: a lane batch's (and a queue claim's) statements run on a connection: through
  ``libpq_pipeline`` with the psycopg releases it was tested with, else psycopg's cursors;
- ``unordered``: claiming and settling unordered rows;
- ``maintenance``: retention and the table health (its values, without warnings);
- ``schema``: a store's recorded metadata, the operator's check of it, ``schema apply``;
- ``drift``: the drift check, and the worker's check of a store before serving it;
- ``dispatch``: queue slots on a dispatcher connection, and the queue controls' statements;
- ``caller``: the psycopg connection behind what an application passes (psycopg's,
  SQLAlchemy's, Django's), and whether it is in a transaction;
- ``outbox``: the writer's rows (insert, COPY, NOTIFY, sequence numbers, the lane-count check);
- ``inbox``: a consumer's claim of a message id;
- ``catalog``: reading a template's catalog of stores (relayer.fleet);
- ``status``: ``relayer status`` (members, leases, pending rows) and a line of ``status --all``;
- ``parked``: the parked keys, and the guarded redrive or drop of one with its audit row;
- ``backlog``: the backlog gauges' totals and oldest lanes (the metrics);
- ``dashboard``: the dashboard's pool and its sampler's snapshot and refinement;
- ``inspection``: what the dashboard reads on request (a lane, parked pages, a key, a body,
  the holders of queue slots, index sizes, schema drift, the audit trail).
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
from relayer.store.partitions import Rotation, rotate
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
    "Rotation",
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
    "rotate",
    "unordered_settings",
]
