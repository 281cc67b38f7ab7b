"""The exception tree: one root, a subtree per concern.

Driver errors are translated once, at the edge (store, transports), with
``raise ... from exc`` so the original stays reachable for debugging.
"""

from __future__ import annotations

from collections.abc import Mapping

# The name relayer is installed under (the import package and the command are ``relayer``).
DISTRIBUTION = "relayer-outbox"


def install_command(extra: str) -> str:
    """The pip command that installs one of relayer's extras, for messages that name it."""
    return f"pip install '{DISTRIBUTION}[{extra}]'"


class RelayerError(Exception):
    """Root of every error relayer raises on purpose."""


class Shown:
    """A value shown in an error as this text (a size, the start of a long value, the names of
    a table's settings) instead of its whole repr."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text

    @classmethod
    def names_of(cls, table: object) -> Shown:
        """A table (mapping) as ``{name, name, ...}``: which settings it holds, not their values."""
        names = list(table) if isinstance(table, Mapping) else []
        shown = ", ".join(str(name) for name in names[:8]) + (", ..." if len(names) > 8 else "")
        return cls("{" + shown + "}")


class ConfigurationError(RelayerError, ValueError):
    """A setting, argument or identifier is invalid. The CLI exits 2 with its message."""

    def __init__(self, field: str, value: object, rule: str) -> None:
        self.field = field
        self.value = value
        self.rule = rule
        super().__init__(f"{field}: {value!r} is invalid: {rule}")


class UsageError(RelayerError, ValueError):
    """The caller used an API or a command the wrong way (exit 2 from the CLI)."""


class StoreError(RelayerError):
    """Talking to the outbox store in PostgreSQL failed or found it in an unexpected state."""


class ConnectionsBusy(StoreError):
    """Every connection a worker's budget allows (``worker.max_connections``) was in use for
    as long as a caller could wait: not a database fault, so nothing is counted against rows."""


class DatabaseSilentError(StoreError):
    """PostgreSQL answered nothing within the time a use allowed (a stalled server, or a
    network that drops packets while the connection stays open); the connection was closed."""


class SchemaNotAppliedError(StoreError):
    """The store's tables do not exist (yet) in the configured schema."""


class MissingPrivilegeError(StoreError):
    """The role lacks a privilege the command needs; the message says which and what to grant
    (the CLI exits 2: the command was run as the wrong role)."""


class SchemaDriftError(StoreError):
    """The database's tables differ from what this version of relayer expects."""


class LaneCountMismatchError(StoreError):
    """Writers or workers are configured with a lane count the store was not created with."""

    def __init__(self, store: str, configured: int, recorded: int) -> None:
        self.store = store
        self.configured = configured
        self.recorded = recorded
        super().__init__(
            f"store {store!r}: configured lanes={configured} but the store was created with "
            f"lanes={recorded}; use lanes={recorded}, or drain the outbox and re-apply the "
            "schema to change the lane count"
        )


class FencedWriteError(StoreError):
    """A write made under a lease matched fewer rows than expected: the lease was lost."""


class InvalidMessageError(RelayerError, ValueError):
    """An outbox message was rejected before anything was written."""

    def __init__(self, field: str, value: object, rule: str) -> None:
        self.field = field
        self.value = value
        self.rule = rule
        super().__init__(f"{field}: {value!r} is invalid: {rule}")


class TransportError(RelayerError):
    """A transport could not be created, configured or reached."""


class DispatchError(RelayerError):
    """The dispatch layer was misconfigured or its cluster state is unusable."""
