"""The chaos harness's account of lost rows (tests/chaos/harness.py): what the workers'
delivery reports said of each row and what the broker served at that offset."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.chaos.harness import (
    acknowledgements_of,
    lost_account,
    recorder_env,
    unplaced_reports,
)
from tests.contract.brokers import Received


def received(message_id: str, partition: int, offset: int) -> Received:
    return Received(b"", {"relayer-message-id": message_id}, "k", partition, offset)


def test_a_lost_rows_reports_and_the_offsets_no_read_returned(tmp_path: Path) -> None:
    (tmp_path / "deliveries-101.txt").write_text(
        "a 0 0 ok\nlost-1 0 1 ok\nb 0 2 ok\nlost-2 3 -1001 ok\n"
    )
    (tmp_path / "deliveries-102.txt").write_text("lost-1 0 7 _MSG_TIMED_OUT\n")
    read = [received("a", 0, 0), received("b", 0, 2), received("c", 0, 4)]
    lines = acknowledgements_of(
        tmp_path, ["lost-1", "lost-2", "lost-3"], read, ["partition 0 offset 3: Bad message"]
    )
    assert lines == [
        "lost-1: worker 101 got ok at partition 0 offset 1; the read found nothing there",
        "lost-1: worker 102 got _MSG_TIMED_OUT at partition 0 offset 7; the read found "
        "nothing there",
        "lost-2: worker 101 got ok at partition 3 offset -1001; the read found nothing there",
        "lost-3: no delivery report recorded",
        "partition 0: offsets [1, 3] not read (2)",
        "consumer error: partition 0 offset 3: Bad message",
    ]


def test_the_recorder_is_put_ahead_of_the_workers_path(tmp_path: Path) -> None:
    env = recorder_env(tmp_path)
    assert env["RELAYER_TEST_DELIVERIES_DIR"] == str(tmp_path)
    first = env["PYTHONPATH"].split(os.pathsep)[0]
    assert (Path(first) / "sitecustomize.py").is_file()


def test_a_worker_started_with_the_recorder_writes_each_report(tmp_path: Path) -> None:
    code = (
        "from relayer.transports.kafka import deliveries\n"
        "from relayer.transports.kafka.placement import Placements\n"
        "class Report:\n"
        "    def topic(self): return 'orders'\n"
        "    def partition(self): return 5\n"
        "    def offset(self): return 42\n"
        "settles = []\n"
        "deliveries.record_report(settles, Placements(), (None, 3, 'id-1'), None, Report())\n"
        "assert len(settles) == 1\n"
    )
    env = {**os.environ, **recorder_env(tmp_path)}
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)
    [written] = tmp_path.glob("deliveries-*.txt")
    assert written.read_text() == "id-1 5 42 ok\n"


def test_reports_without_an_offset_are_read_and_the_unplaced_successes_counted(
    tmp_path: Path,
) -> None:
    # confluent-kafka shows a negative offset (and a purged message's) as None.
    (tmp_path / "deliveries-101.txt").write_text(
        "a 2 None ok\nb 2 0 ok\nc None None _PURGE_QUEUE\nd 2 5 ok\n"
    )
    assert unplaced_reports(tmp_path) == 1
    lines = acknowledgements_of(tmp_path, ["a", "c"], [received("b", 2, 0)], [])
    assert lines == [
        "a: worker 101 got ok at partition 2 offset None; the read found nothing there",
        "c: worker 101 got _PURGE_QUEUE at partition None offset None; the read found "
        "nothing there",
    ]


def test_the_whole_account_lists_the_report_then_every_message_read() -> None:
    read = [received("b", 1, 0), received("a", 0, 3), received("c", 0, 1)]
    assert lost_account(["lost-1: no delivery report recorded"], read) == (
        "lost-1: no delivery report recorded\n\nread (partition offset id):\n0 1 c\n0 3 a\n1 0 b\n"
    )
