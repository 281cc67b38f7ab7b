"""The relay: one store's ordered relay end to end (docs/protocol.md), a module per step.

In the order the data flows:

- ``runtime``: ``StoreRelay``, the parts of one store's relay put together, opened and closed;
- ``membership``: heartbeats and this member's share of the lanes;
- ``wakeups``: notifications, wake-up probes, the fallback poll and the wake_linger window;
- ``schedule``: ``LaneSchedule``, the one owner of queued, known-due and held lanes;
- ``scanner`` and ``probes``: one lane scan, probing unless its head is known due;
- ``grouping``: coalesce, spread and widen lanes into batch transactions on connections;
- ``batch``: ``LaneRelay``, one batch (lock, read, send, fenced outcome, commit);
- ``pipeline``: ``BatchSender``, per-row outcomes with per-key order;
- ``outcomes``: each scan's result counted, logged and handed back to the schedule;
- ``results``, ``stats``, ``trace``: what a scan says, what the relay counts, its spans;
- ``unordered``: ``UnorderedSender``, rows without an ordering key (claim, send, settle).

Nothing here imports metrics, the dashboard or the worker: they read the relay.
"""
