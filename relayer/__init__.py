"""relayer: a transactional-outbox relay for PostgreSQL with per-key ordered delivery."""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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
    from relayer.worker.worker import Worker
    from relayer.writer.after_commit import BackgroundDispatcher, UnorderedDispatcher
    from relayer.writer.messages import OutboxMessage
    from relayer.writer.outbox import Outbox

# The public names, imported on first use (PEP 562): ``relayer --version`` or ``import
# relayer.errors`` need not load psycopg, pydantic and the relay.
_LAZY = {
    "BackgroundDispatcher": "relayer.writer.after_commit",
    "UnorderedDispatcher": "relayer.writer.after_commit",
    "ConfigurationError": "relayer.errors",
    "InvalidMessageError": "relayer.errors",
    "LaneCountMismatchError": "relayer.errors",
    "RelayerError": "relayer.errors",
    "SchemaNotAppliedError": "relayer.errors",
    "StoreError": "relayer.errors",
    "TransportError": "relayer.errors",
    "uuid7": "relayer.ids",
    "Claim": "relayer.inbox",
    "Inbox": "relayer.inbox",
    "Outcome": "relayer.inbox",
    "fnv1a_32": "relayer.lanes",
    "lane_for": "relayer.lanes",
    "RelayerSettings": "relayer.settings",
    "StoreSettings": "relayer.settings",
    "TransportSettings": "relayer.settings",
    "load_settings": "relayer.settings",
    "Worker": "relayer.worker.worker",
    "Outbox": "relayer.writer.outbox",
    "OutboxMessage": "relayer.writer.messages",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'relayer' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])


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
    "Worker",
    "__version__",
    "fnv1a_32",
    "lane_for",
    "load_settings",
    "uuid7",
]
