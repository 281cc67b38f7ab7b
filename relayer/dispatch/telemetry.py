"""What a worker group reports about each of its queues, as immutable snapshots."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from relayer.dispatch.cluster import GateState


@dataclass(frozen=True, slots=True)
class QueueTelemetry:
    """One queue of a worker group at one moment.

    ``share`` is the fraction of all jobs the group started that came from this queue;
    compare it with ``configured_share`` (weight / total weight for Weighted, None for the
    policies that do not promise a share). ``oldest_due_age`` is how long the oldest due job
    has waited past its due time, in seconds (0.0 when no job is due).
    """

    queue: str
    served: int
    share: float
    configured_share: float | None
    oldest_due_age: float
    running: int
    gate: GateState | None  # the cluster gate's last answer (None: not asked yet)


@dataclass(frozen=True, slots=True)
class PassReport:
    """The outcome of one pass of a worker group, for tests, logs and operators."""

    number: int
    free: int  # free slots when the pass started
    claimed: tuple[int, ...]  # jobs started, per queue in the policy's order
    gates: tuple[GateState | None, ...]  # the gate's answer per queue (None: not asked)

    @property
    def total(self) -> int:
        return sum(self.claimed)


def snapshot(
    *,
    queues: Sequence[str],
    served: Sequence[int],
    configured: Sequence[float | None],
    next_due: Sequence[float | None],
    running: Sequence[int],
    gates: Sequence[GateState | None],
    now: float,
) -> tuple[QueueTelemetry, ...]:
    total = sum(served)
    return tuple(
        QueueTelemetry(
            queue=queue,
            served=served[index],
            share=served[index] / total if total else 0.0,
            configured_share=configured[index],
            oldest_due_age=_age(next_due[index], now),
            running=running[index],
            gate=gates[index],
        )
        for index, queue in enumerate(queues)
    )


def _age(due: float | None, now: float) -> float:
    return max(0.0, now - due) if due is not None else 0.0
