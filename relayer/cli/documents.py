"""The JSON documents of the read commands' ``--json`` (docs/cli.md#json-output lists them).

One builder per shape, shared by the commands that show it (a parked key looks the same in
``status`` and ``parked list``). Timestamps are ISO 8601 in UTC with milliseconds
(``2025-01-31T12:00:00.123Z``), durations are seconds in fields ending ``_seconds``, absent
values are ``null``. New fields may be added; none is renamed or removed within a major
version.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the commands import these when they run; the parser need not
    from relayer.dispatch.control import QueueStatus
    from relayer.operations.health import StoreHealth
    from relayer.operations.parked import ParkedKey
    from relayer.operations.partitions import RotationReport
    from relayer.operations.schema import Drift
    from relayer.operations.status import StoreStatus, StoreSummary

Document = dict[str, Any]


def iso(moment: datetime | None) -> str | None:
    """``moment`` in UTC as ISO 8601 with milliseconds and a ``Z``; None stays None."""
    if moment is None:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)  # the database's timestamps are all timestamptz
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def dumps(document: Document) -> str:
    return json.dumps(document, indent=2, ensure_ascii=False)


def now() -> str:
    stamp = iso(datetime.now(UTC))
    assert stamp is not None
    return stamp


def parked_key(key: ParkedKey) -> Document:
    return {
        "key": key.key,
        "lane": key.lane,
        "pending": key.pending,
        "attempts": key.attempts,
        "waiting_for_operator": key.waiting_for_operator,
        "retry_at": iso(key.retry_at),
        "parked_at": iso(key.parked_at),
        "head_id": str(key.head_id),
        "last_error": key.last_error,
    }


def parked_list(store: str, keys: list[ParkedKey]) -> Document:
    return {"store": store, "read_at": now(), "parked": [parked_key(key) for key in keys]}


def health(found: StoreHealth) -> Document:
    return {
        "oldest_due_age_seconds": found.oldest_due_age_seconds,
        "tables": [
            {
                "table": table.table,
                "live_rows": table.live_rows,
                "dead_rows": table.dead_rows,
                "dead_ratio": table.dead_ratio,
                "last_vacuum": iso(table.last_vacuum),
                "size_bytes": table.size_bytes,
                "partitions": table.partitions,
            }
            for table in found.tables
        ],
        "partitions_ahead_seconds": found.partitions_ahead_seconds,
        "unordered_failing": found.unordered_failing,
        "unordered_max_attempts": found.unordered_max_attempts,
        "unordered_last_error": found.unordered_last_error,
        "warnings": list(found.warnings),
    }


def rotation(report: RotationReport) -> Document:
    """``relayer partitions rotate --json``: what the rotation did, and the partitions after."""
    done, found = report.rotation, report.partitions
    return {
        "store": report.store,
        "read_at": now(),
        "created": list(done.created),
        "dropped": list(done.dropped),
        "finalized": list(done.finalized),
        "skipped": done.skipped,
        "partitions": found.partitions,
        "size_bytes": found.size_bytes,
        "partitions_ahead_seconds": found.ahead_seconds,
    }


def fleet(summaries: list[StoreSummary]) -> Document:
    """``relayer status --all``: one entry per store, worst first; ``error`` is null for a
    store that was read."""
    return {
        "read_at": now(),
        "stores": [
            {
                "store": summary.store,
                "pending": summary.pending,
                "oldest_age_seconds": summary.oldest_age_seconds,
                "parked": summary.parked,
                "waiting_for_operator": summary.waiting_for_operator,
                "members": summary.members,
                "error": summary.error or None,
            }
            for summary in summaries
        ],
    }


def status(found: StoreStatus) -> Document:
    """One store's ``relayer status`` (``owners`` keys are lane numbers as strings, as JSON
    requires; ``lane`` null in ``pending`` is the unordered rows)."""
    owned: dict[str, int] = {}
    for owner in found.owners.values():
        owned[owner] = owned.get(owner, 0) + 1
    return {
        "store": found.store,
        "read_at": now(),
        "lanes": found.lanes,
        "members": [
            {
                "instance": member.instance,
                "lanes": owned.get(member.instance, 0),
                "expires_at": iso(member.expires_at),
                "age_seconds": member.age_seconds,
            }
            for member in found.members
        ],
        "owners": {str(lane): owner for lane, owner in found.owners.items()},
        "leased": list(found.leased),
        "total_pending": found.total_pending,
        "oldest_age_seconds": found.oldest_age_seconds,
        "pending": [
            {"lane": lane.lane, "rows": lane.rows, "oldest_age_seconds": lane.oldest_age_seconds}
            for lane in found.pending
        ],
        "parked": [parked_key(key) for key in found.parked],
        "health": None if found.health is None else health(found.health),
    }


def queue_status(store: str, table: str, states: tuple[QueueStatus, ...]) -> Document:
    """``queue`` ``*`` is the pause of every queue; ``paused_by_all`` says a queue is held by it."""
    from relayer.dispatch.policies import ALL_QUEUES

    every = next((state for state in states if state.queue == ALL_QUEUES), None)
    all_paused = every is not None and every.paused
    return {
        "store": store,
        "table": table,
        "read_at": now(),
        "queues": [
            {
                "queue": state.queue,
                "paused": state.paused,
                "paused_by_all": all_paused and state.queue != ALL_QUEUES,
                "limit": state.limit,
                "slots_in_use": state.slots_in_use,
                "changed_by": state.changed_by,
                "changed_at": iso(state.changed_at),
                "reason": state.reason,
            }
            for state in states
        ],
    }


def schema_check(store: str, version: int, lanes: int, drift: list[Drift]) -> Document:
    return {
        "store": store,
        "schema_version": version,
        "lanes": lanes,
        "matches": not drift,
        "differences": [{"subject": item.subject, "detail": item.detail} for item in drift],
    }
