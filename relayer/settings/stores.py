"""One store's settings (``[stores.NAME]``): its database, schema, table prefix, transports
and tuning, each checked at start-up against the rules in docs/configuration.md."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from relayer.deadlines import Deadlines
from relayer.errors import ConfigurationError
from relayer.identifiers import StoreNames, check_plain_identifier, check_table_prefix
from relayer.lanes import MAX_LANES
from relayer.pooler import Pooler, check_pooler, dsn_sets_options, same_pool
from relayer.redact import redact, redact_mapping
from relayer.settings.values import (
    Count,
    Duration,
    OptionalDuration,
    RelationError,
    check_dsn,
    listed_names,
)

STORE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
STORE_NAME_RULE = (
    "a store name is 1-63 characters: letters, digits, '_', '.' or '-', starting with a letter "
    "or digit (names are case-sensitive)"
)
MIN_LEASE = timedelta(seconds=1)
MAX_LEASE = timedelta(hours=1)
MAX_BATCH = 10_000
MAX_BACKOFF = timedelta(days=7)
_RANGES = {
    "lanes": (1, MAX_LANES),
    "batch_size": (1, MAX_BATCH),
    "max_attempts": (1, 1_000_000),
    "max_body_bytes": (1, 1024 * 1024 * 1024),
}

# Destructive retentions (dropping parked keys, forgetting sequence counters) below this are
# refused: a typo such as '30s' for '30d' must not delete what an operator still needs.
MIN_DESTRUCTIVE_RETENTION = timedelta(hours=1)
MAX_WAKE_LINGER = timedelta(seconds=1)


# How a store's workers learn that rows were written (docs/configuration.md#wake-ups).
Notify = Literal["after_commit", "in_transaction", "off"]
NOTIFY_MODES: tuple[Notify, ...] = ("after_commit", "in_transaction", "off")
NOTIFY_RULE = (
    "must be 'after_commit' (the workers are woken right after the application's commit, by a "
    "connection of relayer's own: the default), 'in_transaction' (a NOTIFY in the application's "
    "transaction, which serializes its commits) or 'off' (the workers find rows by polling)"
)


# How a store keeps its outbox (docs/storage.md): "delete" removes each sent row; "partitioned"
# appends into range partitions, advances each lane's progress and drops passed partitions.
Storage = Literal["delete", "partitioned"]
STORAGE_MODES: tuple[Storage, ...] = ("delete", "partitioned")
STORAGE_RULE = (
    "must be 'delete' (each sent row is deleted: the default) or 'partitioned' (rows are "
    "appended into range partitions, each lane's progress advances, passed partitions are "
    "dropped; docs/storage.md)"
)
MIN_PARTITION_SPAN = timedelta(minutes=1)
MAX_PARTITION_SPAN = timedelta(days=1)


def check_storage(value: object) -> object:
    """``storage``'s value: one of STORAGE_MODES."""
    if value in STORAGE_MODES:
        return value
    raise ValueError(STORAGE_RULE)


def check_notify(value: object) -> object:
    """``notify``'s value: one of NOTIFY_MODES; true is the default mode, false is 'off'."""
    if value is True:
        return "after_commit"
    if value is False:
        return "off"
    if value in NOTIFY_MODES:
        return value
    raise ValueError(NOTIFY_RULE)


class TransportSettings(BaseModel):
    """One named transport of a store: its ``type`` and the options its factory accepts.

    Options other than ``type`` pass through unchanged to the transport (librdkafka settings
    for Kafka, the connection URL for RabbitMQ, ...). Secret-looking values never show in reprs.
    """

    model_config = ConfigDict(extra="allow", frozen=True)

    type: str = Field(min_length=1)

    @property
    def options(self) -> dict[str, Any]:
        return dict(self.model_extra or {})

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:
        yield "type", self.type
        yield "options", redact_mapping(self.options)


class StoreSettings(BaseModel):
    """One outbox store: a PostgreSQL database, a schema and a table prefix, and its tuning."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    name: str = "default"
    dsn: str | None = Field(default=None, repr=False)
    # A pooler in front of dsn (relayer.pooler): "transaction" keeps no session state.
    pooler: Annotated[Pooler, BeforeValidator(check_pooler)] = "none"
    # Where LISTEN runs (a direct connection or a session-mode pool), and where the schema
    # commands connect; both default to dsn (LISTEN: not through a transaction pooler).
    listen_dsn: str | None = Field(default=None, repr=False)
    admin_dsn: str | None = Field(default=None, repr=False)
    db_schema: str = Field(default="public", alias="schema")
    table_prefix: str = "relayer_"
    lanes: Count = 64
    lease_duration: Duration = timedelta(seconds=30)
    poll_interval: Duration = timedelta(seconds=1)
    batch_size: Count = 500
    max_attempts: Count = 10
    retry_backoff: Duration = timedelta(seconds=1)
    retry_backoff_max: Duration = timedelta(minutes=5)
    max_body_bytes: Count = 16 * 1024 * 1024
    notify: Annotated[Notify, BeforeValidator(check_notify)] = "after_commit"
    # How sent rows leave the outbox (docs/storage.md); a partition's span of ids (time).
    storage: Annotated[Storage, BeforeValidator(check_storage)] = "delete"
    partition_span: Duration = timedelta(minutes=10)
    # Wake-ups (writers' notifications) that arrive within this window are served together:
    # one probe-free pass and shared batch transactions instead of one each (0: at once).
    wake_linger: Duration = timedelta(milliseconds=3)
    default_transport: str | None = None
    transports: dict[str, TransportSettings] = Field(default_factory=dict)
    # Unordered rows and maintenance (docs/unordered.md, docs/operations.md).
    unordered_grace: Duration = timedelta(seconds=30)
    maintenance_interval: Duration = timedelta(seconds=5)
    cleanup_interval: Duration = timedelta(minutes=1)
    parked_retention: OptionalDuration = None
    # The consumer inbox and per-key sequence numbers (docs/inbox.md).
    inbox_retention: OptionalDuration = timedelta(days=7)
    sequence_numbers: bool = False
    sequence_retention: OptionalDuration = None

    @field_validator("dsn", "listen_dsn", "admin_dsn")
    @classmethod
    def _check_dsn(cls, value: str | None) -> str | None:
        return check_dsn(value)

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        if not STORE_NAME.fullmatch(value):
            raise ValueError(STORE_NAME_RULE)
        return value

    @field_validator("lanes", "batch_size", "max_attempts", "max_body_bytes")
    @classmethod
    def _check_ranges(cls, value: int, info: ValidationInfo) -> int:
        low, high = _RANGES[str(info.field_name)]
        if not low <= value <= high:
            raise ValueError(f"must be an integer from {low:,} to {high:,}")
        return value

    @field_validator("db_schema")
    @classmethod
    def _check_schema(cls, value: str) -> str:
        value = _as_value_error(check_plain_identifier, "schema", value)
        if value == "information_schema" or value.startswith("pg_"):
            raise ValueError(
                "is a PostgreSQL system schema (pg_* and information_schema are reserved, and "
                "pg_dump leaves them out); use a schema of your own, such as 'relayer' or 'public'"
            )
        return value

    @field_validator("table_prefix")
    @classmethod
    def _check_prefix(cls, value: str) -> str:
        return _as_value_error(check_table_prefix, "table_prefix", value)

    @field_validator("lease_duration")
    @classmethod
    def _check_lease(cls, value: timedelta) -> timedelta:
        if not MIN_LEASE <= value <= MAX_LEASE:
            raise ValueError("must be from 1 second to 1 hour")
        return value

    @field_validator("poll_interval", "retry_backoff", "retry_backoff_max")
    @classmethod
    def _check_positive(cls, value: timedelta) -> timedelta:
        if value <= timedelta(0):
            raise ValueError("must be greater than 0")
        if value > MAX_BACKOFF:
            raise ValueError("must be at most 7 days")
        return value

    @field_validator("unordered_grace")
    @classmethod
    def _check_grace(cls, value: timedelta) -> timedelta:
        if not timedelta(0) <= value <= timedelta(days=1):
            raise ValueError("must be from 0 seconds to 1 day")
        return value

    @field_validator("wake_linger")
    @classmethod
    def _check_linger(cls, value: timedelta) -> timedelta:
        if not timedelta(0) <= value <= MAX_WAKE_LINGER:
            raise ValueError("must be from 0 (off) to 1 second")
        return value

    @field_validator("maintenance_interval", "cleanup_interval")
    @classmethod
    def _check_interval(cls, value: timedelta) -> timedelta:
        if not timedelta(0) < value <= timedelta(days=1):
            raise ValueError("must be greater than 0 and at most 1 day")
        return value

    @field_validator("partition_span")
    @classmethod
    def _check_partition_span(cls, value: timedelta) -> timedelta:
        if not MIN_PARTITION_SPAN <= value <= MAX_PARTITION_SPAN:
            raise ValueError("must be from 1 minute to 1 day")
        if value.total_seconds() % 60:
            raise ValueError("must be a whole number of minutes")
        return value

    @field_validator("inbox_retention")
    @classmethod
    def _check_inbox_retention(cls, value: timedelta | None) -> timedelta | None:
        if value is not None and value <= timedelta(0):
            raise ValueError("must be greater than 0, or 'off' to keep inbox entries forever")
        return value

    @field_validator("parked_retention", "sequence_retention")
    @classmethod
    def _check_destructive_retention(cls, value: timedelta | None) -> timedelta | None:
        if value is not None and value < MIN_DESTRUCTIVE_RETENTION:
            raise ValueError(
                "must be at least 1 hour (it deletes data an operator may still need), "
                "or 'off' (the default)"
            )
        return value

    @model_validator(mode="after")
    def _check_relations(self) -> StoreSettings:
        deadlines = Deadlines.of(self.lease_duration)
        if self.poll_interval.total_seconds() >= deadlines.heartbeat:
            raise RelationError(
                "poll_interval",
                _as_text(self.poll_interval),
                "must be less than lease_duration / 3 "
                f"({deadlines.heartbeat:g} s for lease_duration {deadlines.lease:g} s)",
            )
        if self.wake_linger >= self.poll_interval:
            raise RelationError(
                "wake_linger",
                _as_text(self.wake_linger),
                f"must be less than poll_interval ({self.poll_interval.total_seconds():g} s)",
            )
        if self.retry_backoff_max < self.retry_backoff:
            raise RelationError(
                "retry_backoff_max",
                _as_text(self.retry_backoff_max),
                f"must be at least retry_backoff ({self.retry_backoff.total_seconds():g} s)",
            )
        if self.default_transport is not None and self.default_transport not in self.transports:
            raise RelationError(
                "default_transport",
                self.default_transport,
                f"must name one of this store's transports ({listed_names(self.transports)})",
            )
        self.check_pooled(self.dsn, "dsn")
        return self

    def check_pooled(self, dsn: str | None, field: str) -> None:
        """Refuse what a transaction pooler cannot serve: ``options`` in a DSN it is in front
        of, and a ``listen_dsn`` that reaches the same pool (LISTEN would never fire)."""
        if self.pooler != "transaction" or not dsn:
            return
        if dsn_sets_options(dsn):
            raise RelationError(
                field,
                dsn,
                "sets options, which a pooler in transaction mode refuses at connect (pooler = "
                "'transaction'); set them on the role (ALTER ROLE ... SET) or remove them",
            )
        if self.listen_dsn and same_pool(self.listen_dsn, dsn):
            raise RelationError(
                "listen_dsn",
                self.listen_dsn,
                "reaches the same pool as dsn, which pools by transaction (pooler = "
                "'transaction'), where LISTEN never fires; point it at the database directly "
                "or at a session-mode pool, or leave it out to poll",
            )

    @property
    def names(self) -> StoreNames:
        return StoreNames(self.db_schema, self.table_prefix)

    def require_dsn(self) -> str:
        """The store's DSN, or a configuration error saying how to set it."""
        if not self.dsn:
            raise ConfigurationError(
                f"stores.{self.name}.dsn",
                None,
                f"is required to connect; set it in [stores.{self.name}] or with "
                f"RELAYER_STORES__{self.name.upper()}__DSN (or RELAYER_DSN for every store)",
            )
        return self.dsn

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:
        yield "name", self.name
        for field in type(self).model_fields:
            value = getattr(self, field)
            if field.endswith("dsn"):
                yield field, redact(value) if value else None
            elif field != "name":
                yield field, value


def _as_value_error(check: Any, field: str, value: str) -> str:
    try:
        result: str = check(field, value)
    except ConfigurationError as exc:
        raise ValueError(exc.rule) from None
    return result


def _as_text(value: timedelta) -> str:
    return f"{value.total_seconds():g}s"
