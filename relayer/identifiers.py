"""Validation of the PostgreSQL identifiers relayer creates, and the names of a store's objects.

Schema and table-prefix values come from configuration, so they are checked against a strict
rule before any SQL is built, and then only ever reach SQL through ``psycopg.sql.Identifier``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from relayer.errors import ConfigurationError
from relayer.lanes import fnv1a_32

PLAIN_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]*")
POSTGRES_NAME_LIMIT = 63  # NAMEDATALEN - 1: longer names are silently truncated by PostgreSQL

# Every table relayer creates for a store, by role. Suffixes are appended to the table prefix.
TABLE_SUFFIXES: dict[str, str] = {
    "outbox": "outbox",
    "leases": "leases",
    "parked": "parked",
    "meta": "meta",
    "migrations": "migrations",
    "queues": "queues",
    "queue_events": "queue_events",
    "inbox": "inbox",
    "inbox_keys": "inbox_keys",
    "sequences": "sequences",
    "audit": "audit",
    # Partitioned storage only (docs/storage.md): each lane's progress, and the rows a lane
    # passed without finishing them.
    "progress": "progress",
    "held": "held",
}
# Every index relayer creates, by role. Counted in the length rule, since a truncated index name
# would make `schema check` report drift forever.
INDEX_SUFFIXES: dict[str, str] = {
    "parked_lane": "parked_lane",
    "leases_lane": "leases_lane",
    "leases_members": "lease_members",
    "queue_events_queue": "queue_events_q",
    "inbox_received": "inbox_received",
    "inbox_keys_updated": "inbox_keys_upd",
    "sequences_updated": "sequences_upd",
    "audit_key": "audit_key",
    "parked_since": "parked_since",
    # Partitioned storage only (docs/storage.md): a lane's late rows, by writing transaction.
    "outbox_xid": "outbox_xid",
}
# Every function relayer creates, by role; a version in the name lets two relayer versions
# logic live side by side (a new version adds a new name).
FUNCTION_SUFFIXES: dict[str, str] = {
    "claim_slots": "claim_slots_v1",
}
LONGEST_SUFFIX = max(
    (*TABLE_SUFFIXES.values(), *INDEX_SUFFIXES.values(), *FUNCTION_SUFFIXES.values()), key=len
)


def check_plain_identifier(field: str, value: object) -> str:
    """Return ``value`` if it is a plain, lowercase PostgreSQL identifier of at most 63 bytes."""
    if not isinstance(value, str):
        raise ConfigurationError(field, value, "must be a string")
    if not PLAIN_IDENTIFIER.fullmatch(value):
        raise ConfigurationError(
            field,
            value,
            "must be a plain identifier: a lowercase letter or '_' followed by lowercase "
            "letters, digits or '_' (pattern ^[a-z_][a-z0-9_]*$)",
        )
    size = len(value.encode("utf-8"))
    if size > POSTGRES_NAME_LIMIT:
        raise ConfigurationError(
            field, value, f"is {size} bytes; PostgreSQL names are at most {POSTGRES_NAME_LIMIT}"
        )
    return value


def check_table_prefix(field: str, prefix: object) -> str:
    """Check ``prefix`` and that every object name built from it fits PostgreSQL's limit."""
    checked = check_plain_identifier(field, prefix)
    longest = checked + LONGEST_SUFFIX
    size = len(longest.encode("utf-8"))
    if size > POSTGRES_NAME_LIMIT:
        raise ConfigurationError(
            field,
            prefix,
            f"the longest table or index name it produces, {longest!r}, would be {size} bytes; "
            f"PostgreSQL names are at most {POSTGRES_NAME_LIMIT} bytes, so use a prefix of at "
            f"most {POSTGRES_NAME_LIMIT - len(LONGEST_SUFFIX)} bytes",
        )
    return checked


@dataclass(frozen=True, slots=True)
class StoreNames:
    """The validated schema and object names of one store."""

    schema: str
    prefix: str

    @classmethod
    def create(cls, schema: str, prefix: str) -> StoreNames:
        return cls(
            check_plain_identifier("schema", schema), check_table_prefix("table_prefix", prefix)
        )

    def table(self, role: str) -> str:
        return self.prefix + TABLE_SUFFIXES[role]

    def index(self, role: str) -> str:
        return self.prefix + INDEX_SUFFIXES[role]

    def function(self, role: str) -> str:
        return self.prefix + FUNCTION_SUFFIXES[role]

    @property
    def notify_channel(self) -> str:
        """The LISTEN/NOTIFY channel writers use to wake idle workers of this store."""
        channel = f"{self.schema}.{self.prefix}outbox"
        if len(channel) <= POSTGRES_NAME_LIMIT:
            return channel
        return f"relayer_{fnv1a_32(channel.encode()):08x}"

    @property
    def lock_key(self) -> int:
        """A stable 63-bit advisory-lock key for schema changes of this store."""
        high = fnv1a_32(self.schema.encode())
        low = fnv1a_32(self.prefix.encode())
        return ((high << 32) | low) & 0x7FFF_FFFF_FFFF_FFFF
