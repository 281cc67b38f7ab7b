"""The worker side: a process that serves stores.

- ``worker``: ``Worker``, stores joining and leaving, one worker group, run and stop;
- ``served``: ``ServedStore``, one store's relay, maintenance, gate and transports;
- ``queues``: the stores' dispatch queues, the group's policy, their gates;
- ``maintenance``: unordered recovery and retention, as jobs beside the lane scans.
"""

from relayer.worker.worker import Worker

__all__ = ["Worker"]
