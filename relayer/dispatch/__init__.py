"""relayer.dispatch: queues, dispatch policies and worker groups, with cluster-wide state.

A library of its own and the scheduler of the relay's lane scans:

- :class:`MemoryQueue` (and the :class:`JobSource` protocol): keyed jobs claimed in due order;
- policies :class:`Strict`, :class:`Weighted`, :class:`Priority`, :class:`RoundRobin`,
  :class:`MaxLen`, :class:`MinLen`, planned by the pure :class:`Planner`;
- :class:`WorkerGroup`: a pool of slots running async handlers, with backpressure;
- :class:`PostgresClusterState`: pause and concurrency limits shared by every process, and
  :class:`QueueControl` to change them (``relayer queue pause|resume|limit|status``).
"""

from relayer.dispatch.clock import Clock, ManualClock, MonotonicClock
from relayer.dispatch.cluster import (
    ClaimRequest,
    ClaimResult,
    ClusterState,
    GateState,
    Grant,
    MemoryClusterState,
    QueueGate,
    RoutedClusterState,
    Slot,
)
from relayer.dispatch.control import QueueControl, QueueEvent, QueueStatus, default_actor
from relayer.dispatch.group import Handler, WorkerGroup
from relayer.dispatch.planner import Plan, Planner
from relayer.dispatch.policies import (
    DEFAULT_POOL_SIZE,
    DEFAULT_QUEUE,
    InvalidDispatchError,
    MaxLen,
    MinLen,
    Policy,
    Priority,
    RoundRobin,
    Strict,
    Weighted,
    validate,
)
from relayer.dispatch.postgres import PostgresClusterState
from relayer.dispatch.queue import Job, JobSource, MemoryQueue
from relayer.dispatch.telemetry import PassReport, QueueTelemetry

__all__ = [
    "DEFAULT_POOL_SIZE",
    "DEFAULT_QUEUE",
    "ClaimRequest",
    "ClaimResult",
    "Clock",
    "ClusterState",
    "GateState",
    "Grant",
    "Handler",
    "InvalidDispatchError",
    "Job",
    "JobSource",
    "ManualClock",
    "MemoryClusterState",
    "MaxLen",
    "MemoryQueue",
    "MinLen",
    "MonotonicClock",
    "PassReport",
    "Plan",
    "Planner",
    "Policy",
    "PostgresClusterState",
    "Priority",
    "QueueControl",
    "QueueEvent",
    "QueueGate",
    "QueueStatus",
    "QueueTelemetry",
    "RoundRobin",
    "RoutedClusterState",
    "Slot",
    "Strict",
    "Weighted",
    "WorkerGroup",
    "default_actor",
    "validate",
]
