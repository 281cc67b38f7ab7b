"""The invariants of docs/protocol.md, computed from what a chaos run wrote and what the broker
got, and the table of results printed at the end of the session (copied to docs/chaos.md).

- I1: every committed row (recorded in ``chaos_written`` by the writer's own transaction, so a
  commit whose outcome the writer never learned still counts) reached the broker.
- I2: per key, first deliveries in id order. An inversion counts as the documented Kafka
  message-timeout case only if a worker parked that key with a timeout error. A dead relay
  connection cannot invert first deliveries: a row is deleted only after the broker
  acknowledged it, and whoever sends the lane next resends every row still there ahead of the
  later ones. Its late send shows up as a *late copy*: a duplicate that lands after a newer
  row of its key (counted, not an error; consumers deduplicate).
- I3: duplicates per lane at most batch_size for each fault injected.
- I4: no row is left pending, apart from parked keys (reported). Pending as ``relayer status``
  counts it: in delete mode the outbox's rows; in partitioned mode the held rows and the
  outbox rows above their lane's progress (sent rows stay in the partitions until rotation
  drops them).
- I5: every committed removal of a row from the pending set was made by the transaction that
  held its lane's lease row, and each committed row was removed once: in delete mode its
  delete from the outbox; in partitioned mode the advance of its lane's progress past it, its
  copy into the held table and its delete from there (tests/chaos/audit.py). The audit
  triggers record whether the lease row's current version was written by the removing
  transaction, or is locked by it (a batch whose lease has more than half left only locks the
  row); either way the row stays locked until the transaction ends. A stale owner's removal
  would be recorded with ``lease_mine = false``.
"""

from __future__ import annotations

import uuid
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from relayer import lane_for
from tests.contract.brokers import Received


@dataclass(frozen=True, slots=True)
class Written:
    key: str
    seq: int


@dataclass(frozen=True, slots=True)
class Audit:
    deletes: int  # committed removals of rows from the pending set (I5 above)
    stale: int  # removals (partitioned mode: advances too) made without the lane's lease row


@dataclass(slots=True)
class Report:
    scenario: str
    fault: str
    transport: str
    workers: int
    batch_size: int
    injections: int
    rows: int = 0
    deliveries: int = 0
    lost: int = 0
    # Committed rows a first read of a Kafka topic did not give back, before a second read
    # (harness.Run.finish): only what the second read lacks too is lost.
    first_read_missed: int = 0
    # Kafka reports of success without an offset the workers recorded: not trusted, the rows
    # went again (relayer.transports.kafka.placement).
    unplaced: int = 0
    inversions: int = 0
    documented: int = 0
    late_copies: int = 0
    duplicates: int = 0
    max_lane_duplicates: int = 0
    pending: int = 0
    parked: int = 0
    audit: Audit = field(default_factory=lambda: Audit(0, 0))
    stale_rollbacks: int = 0  # "fenced delete matched" lines in the workers' logs
    unclean_exits: int = 0  # workers whose exit status was not 0 (or killed after 30 s)
    seconds: float = 0.0
    command: str = ""
    lost_examples: list[str] = field(default_factory=list)
    inversion_examples: list[str] = field(default_factory=list)

    @property
    def duplicate_bound(self) -> int:
        return self.batch_size * self.injections

    @property
    def drained(self) -> bool:
        return self.pending == 0

    def problems(self) -> list[str]:
        """Every invariant this run broke, in words (empty: all held)."""
        found = []
        if self.lost:
            found.append(
                f"I1: {self.lost} committed rows never reached the broker "
                f"(e.g. {self.lost_examples})"
            )
        if self.inversions - self.documented:
            found.append(
                f"I2: {self.inversions - self.documented} first deliveries out of id order "
                f"(e.g. {self.inversion_examples[:3]})"
            )
        if self.max_lane_duplicates > self.duplicate_bound:
            found.append(
                f"I3: a lane got {self.max_lane_duplicates} duplicates, more than "
                f"batch_size x faults = {self.duplicate_bound}"
            )
        if self.pending:
            found.append(f"I4: {self.pending} rows still pending ({self.parked} parked keys)")
        if self.audit.stale or self.audit.deletes != self.rows:
            found.append(
                f"I5: {self.audit.stale} removals by a stale owner; {self.audit.deletes} "
                f"removals audited for {self.rows} committed rows"
            )
        if self.unclean_exits:
            found.append(f"{self.unclean_exits} workers exited with an error or were killed")
        return found


def check(
    report: Report,
    written: Mapping[uuid.UUID, Written],
    received: Sequence[Received],
    *,
    lanes: int,
    timed_out_keys: Iterable[str] = (),
) -> Report:
    """Fill ``report`` with I1-I3 (I4 and I5 come from the database)."""
    report.rows = len(written)
    report.deliveries = len(received)
    ids = [uuid.UUID(message.message_id) for message in received]
    delivered = set(ids)
    missing = [row for row in written if row not in delivered]
    report.lost = len(missing)
    report.lost_examples = [str(row) for row in missing[:5]]

    copies = Counter(ids)
    per_lane: dict[int, int] = defaultdict(int)
    for message_id, count in copies.items():
        if count > 1:
            row = written.get(message_id)
            key = row.key if row is not None else ""
            per_lane[lane_for(key, lanes)] += count - 1
    report.duplicates = sum(per_lane.values())
    report.max_lane_duplicates = max(per_lane.values(), default=0)

    timed_out = set(timed_out_keys)
    newest: dict[str, uuid.UUID] = {}
    seen: set[uuid.UUID] = set()
    for message_id, message in zip(ids, received, strict=True):
        key = message.key or ""
        latest = newest.get(key)
        behind = latest is not None and message_id < latest
        if message_id in seen:
            report.late_copies += behind
            continue
        seen.add(message_id)
        if behind:
            report.inversions += 1
            report.documented += key in timed_out
            report.inversion_examples.append(f"{key}: {message_id} after {latest}")
        else:
            newest[key] = message_id
    return report


RESULTS: list[Report] = []

_COLUMNS = (
    "scenario",
    "fault",
    "transport",
    "workers",
    "rows",
    "lost",
    "inversions (documented)",
    "late copies",
    "max dup/lane (bound)",
    "drained",
    "I5 stale deletes",
    "seconds",
)


def table(reports: Sequence[Report]) -> str:
    """The results as a Markdown table, then the command of each scenario."""
    lines = ["| " + " | ".join(_COLUMNS) + " |", "|" + "---|" * len(_COLUMNS)]
    for report in reports:
        cells = (
            report.scenario,
            report.fault,
            report.transport,
            str(report.workers),
            f"{report.rows:,}",
            str(report.lost),
            f"{report.inversions} ({report.documented})",
            str(report.late_copies),
            f"{report.max_lane_duplicates} ({report.duplicate_bound})",
            "yes" if report.drained else f"no: {report.pending} left",
            f"{report.audit.stale} of {report.audit.deletes:,}",
            f"{report.seconds:.0f}",
        )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
