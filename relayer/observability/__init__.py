"""Observability: what relayer tells its operators about itself.

- ``logs``: the CLI's logging set-up (text or JSON lines, secrets redacted);
- ``throttle``: one line per cause per interval, with a count;
- ``metrics``: a worker's Prometheus metrics (the ``metrics`` extra).
"""
