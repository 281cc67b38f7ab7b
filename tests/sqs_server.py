"""moto's SQS server for the tests, on a free loopback port, in a process of its own.

    python -m tests.sqs_server      # prints the port, serves until killed

moto computes every attribute of a queue (message counts that look at every message) each time
``send_message`` reads one of them, and reads the clock through datetime arithmetic for each
message of the queue on every receive, so n messages cost n^2 slow steps: 5,000 take minutes.
Here the approximate counts are counted without looking at each message's clock (they are
approximate in SQS too), attribute names are converted once, and the clock is ``time.time()``
(the same value, without moto's support for frozen time, which the tests do not use); what SQS
does with messages is moto's, unchanged.
"""

from __future__ import annotations

import functools
import sys
import time

from moto.server import ThreadedMotoServer
from moto.sqs import models
from moto.sqs.models import Queue


def _patch_counts() -> None:
    def count(queue: Queue) -> int:
        return len(queue._messages)

    def none(queue: Queue) -> int:
        return 0

    Queue.approximate_number_of_messages = property(count)  # type: ignore[assignment]
    Queue.approximate_number_of_messages_not_visible = property(none)  # type: ignore[assignment]
    Queue.approximate_number_of_messages_delayed = property(none)  # type: ignore[assignment]

    def unix_time(dt: object = None) -> float:
        assert dt is None
        return time.time()

    def unix_time_millis(dt: object = None) -> float:
        assert dt is None
        return time.time() * 1000.0

    # A pure function moto calls for each attribute of each queue attribute lookup.
    models.camelcase_to_underscores = functools.lru_cache(maxsize=256)(  # type: ignore[assignment]
        models.camelcase_to_underscores
    )
    models.unix_time = unix_time  # type: ignore[assignment]
    models.unix_time_millis = unix_time_millis  # type: ignore[assignment]


def main() -> None:
    _patch_counts()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    print(server._server.server_port, flush=True)  # type: ignore[union-attr]
    sys.stdin.read()  # until the test session closes our stdin (or kills us)
    server.stop()


if __name__ == "__main__":
    main()
