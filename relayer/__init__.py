"""relayer: a transactional-outbox relay for PostgreSQL with per-key ordered delivery."""

from relayer.after_commit import BackgroundDispatcher, UnorderedDispatcher
from relayer.errors import (
    ConfigurationError,
    InvalidMessageError,
    LaneCountMismatchError,
    RelayerError,
    SchemaNotAppliedError,
    StoreError,
    TransportError,
)
from relayer.ids import uuid7
from relayer.inbox import Claim, Inbox, Outcome
from relayer.lanes import fnv1a_32, lane_for
from relayer.settings import RelayerSettings, StoreSettings, TransportSettings, load_settings
from relayer.writer import Outbox, OutboxMessage

__version__ = "0.1.0.dev0"

__all__ = [
    "BackgroundDispatcher",
    "Claim",
    "Inbox",
    "Outcome",
    "UnorderedDispatcher",
    "ConfigurationError",
    "InvalidMessageError",
    "LaneCountMismatchError",
    "Outbox",
    "OutboxMessage",
    "RelayerError",
    "RelayerSettings",
    "SchemaNotAppliedError",
    "StoreError",
    "StoreSettings",
    "TransportError",
    "TransportSettings",
    "__version__",
    "fnv1a_32",
    "lane_for",
    "load_settings",
    "uuid7",
]
