"""The Prometheus endpoint: the backlog falling to 0 during a run, scraped over HTTP."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import urllib.error
import urllib.request

import psycopg
import pytest

from relayer.dispatch.control import QueueControl
from relayer.embedded import free_port
from relayer.observability.metrics import WorkerMetrics
from relayer.settings import StoreSettings, WorkerSettings
from relayer.transports.memory import MemoryTransport
from relayer.worker import Worker
from tests.acceptance.cli import command, environment
from tests.conftest import apply_schema, make_store
from tests.integration.observability.scraping import Scrape, scrape, scrape_until
from tests.integration.relay.helpers import write
from tests.integration.unordered.helpers import backdate

LANES = 8
KEYS = [f"order-{number}" for number in range(40)]
PER_KEY = 3
ROWS = len(KEYS) * PER_KEY
UNORDERED = 5
TOP_LANES = 3  # fewer than LANES: the detail is cut, the totals are not


@pytest.fixture
async def memory_store(pg_dsn: str) -> StoreSettings:
    store = make_store(
        pg_dsn,
        lanes=LANES,
        lease_duration="3s",
        poll_interval="0.1s",
        transports={"memory": {"type": "memory"}},
        default_transport="memory",
    )
    await apply_schema(store)
    return store


async def set_paused(store: StoreSettings, paused: bool) -> None:
    async with await psycopg.AsyncConnection.connect(store.require_dsn(), autocommit=True) as conn:
        control = QueueControl(conn, store.names)
        await (control.pause if paused else control.resume)(store.name, by="metrics test")


def per_lane(result: Scrape, name: str) -> dict[str, float]:
    """``name``'s value per ordered lane ("unordered" is the keyless rows' pseudo-lane)."""
    values = result.by_label(name, "lane", store="orders")
    values.pop("unordered", None)
    return values


def lag_everywhere(result: Scrape) -> bool:
    """Every lane has rows; the totals count them all, whatever the per-lane detail shows."""
    return (
        result.value("relayer_pending_lanes", store="orders") == LANES
        and result.value("relayer_pending_rows", store="orders") >= ROWS
        and len(per_lane(result, "relayer_lane_pending_rows")) == TOP_LANES
    )


def drained(result: Scrape) -> bool:
    return (
        result.value("relayer_pending_rows", store="orders") == 0
        and result.value("relayer_pending_lanes", store="orders") == 0
        and result.value("relayer_oldest_pending_age_seconds", store="orders") == 0
        and not result.by_label("relayer_lane_pending_rows", "lane")  # empty lanes: no series
        and result.value("relayer_messages_sent_total", store="orders") == ROWS
        and result.value("relayer_unordered_recovered_total", store="orders") == UNORDERED
    )


def probe(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
            return response.status, response.read().decode().strip()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode().strip()


def test_relayer_run_metrics_show_the_lag_per_lane_falling_to_zero(
    memory_store: StoreSettings,
) -> None:
    asyncio.run(set_paused(memory_store, True))  # rows wait, so the first scrapes must show them
    write(memory_store, KEYS, per_key=PER_KEY)
    # Unordered rows whose application died before sending them: the worker recovers them.
    unordered = write(memory_store, [None] * UNORDERED)  # type: ignore[list-item]
    backdate(memory_store, unordered, seconds=60)
    port = free_port()
    env = environment(
        memory_store,
        RELAYER_STORES__ORDERS__LEASE_DURATION="3s",
        RELAYER_STORES__ORDERS__POLL_INTERVAL="0.1s",
        RELAYER_STORES__ORDERS__MAINTENANCE_INTERVAL="0.2s",
        RELAYER_STORES__ORDERS__TRANSPORTS__MEMORY__TYPE="memory",
        RELAYER_STORES__ORDERS__DEFAULT_TRANSPORT="memory",
        # Every option of `relayer run` from the environment, as a container would set them.
        RELAYER_METRICS_PORT=str(port),
        RELAYER_METRICS_HOST="127.0.0.1",
        RELAYER_METRICS_INTERVAL="200ms",
        RELAYER_METRICS_TOP_LANES=str(TOP_LANES),
        RELAYER_INSTANCE_ID="metrics-test",
    )
    process = subprocess.Popen(
        command("run", "orders"),
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        before = scrape_until(port, lag_everywhere)
        ages = per_lane(before, "relayer_lane_oldest_pending_age_seconds")
        assert set(ages) == set(per_lane(before, "relayer_lane_pending_rows"))
        assert all(age >= 0 for age in ages.values())
        # The detail lanes are those whose head row is oldest: none left out is older.
        assert before.value("relayer_oldest_pending_age_seconds", store="orders") >= max(
            ages.values()
        )
        # Recovery runs in the maintenance queue, which the pause does not hold.
        unordered = before.by_label("relayer_lane_pending_rows", "lane").get("unordered", 0)
        assert unordered in (0, UNORDERED)
        assert before.value("relayer_pending_rows", store="orders") == ROWS + unordered
        assert before.by_label("relayer_worker_info", "member") == {"metrics-test": 1}
        assert before.value("relayer_messages_sent_total", store="orders") == 0
        assert before.value("relayer_dispatch_gate", queue="orders", state="paused") == 1
        asyncio.run(set_paused(memory_store, False))
        after = scrape_until(port, drained)
        assert probe(port, "/healthz") == (200, "ok")
        assert probe(port, "/readyz") == (200, "ready")
        assert probe(port, "/nothing-here")[0] == 404
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
    assert process.returncode == 0, stderr
    assert after.value("relayer_write_to_ack_seconds_count", store="orders") == ROWS
    assert after.value("relayer_write_to_ack_seconds_bucket", store="orders", le="+Inf") == ROWS
    # Lanes due together share a batch transaction: fewer batches than lane scans that sent.
    sent_scans = after.value("relayer_lane_scans_total", store="orders", result="sent")
    assert sent_scans >= LANES
    assert 1 <= after.value("relayer_batch_duration_seconds_count", store="orders") <= sent_scans
    assert after.value("relayer_messages_failed_total", store="orders") == 0
    assert after.value("relayer_unordered_recovery_failed_total", store="orders") == 0
    assert after.value("relayer_owned_lanes", store="orders") == LANES
    assert after.value("relayer_live_members", store="orders") == 1
    assert after.value("relayer_parked_keys", store="orders", waiting="operator") == 0
    assert 0 < after.value("relayer_dispatch_share", queue="orders") <= 1  # + maintenance queues
    assert after.value("relayer_dispatch_jobs_total", queue="orders") >= LANES
    assert "metrics on http://127.0.0.1:" in stderr


async def test_two_workers_in_one_process_export_disjoint_lanes(
    memory_store: StoreSettings,
) -> None:
    broker = MemoryTransport("memory")
    write(memory_store, KEYS, per_key=PER_KEY)
    await set_paused(memory_store, True)
    workers = [
        Worker(
            [memory_store],
            transports={"orders": {"memory": broker}},
            settings=WorkerSettings(pool_size=2),
            instance_id=f"worker-{number}",
        )
        for number in range(2)
    ]
    exporters = [WorkerMetrics(worker, interval=0.1) for worker in workers]
    ports = [await exporter.serve("127.0.0.1", 0) for exporter in exporters]
    stop = asyncio.Event()
    tasks = [asyncio.create_task(worker.run(stop)) for worker in workers]
    tasks += [asyncio.create_task(exporter.run(stop)) for exporter in exporters]

    def split_evenly(result: Scrape) -> bool:
        # The detail follows the share at once, the totals at the refresh that a change of
        # share brings forward.
        pending = per_lane(result, "relayer_lane_pending_rows")
        members = result.value("relayer_live_members", store="orders")
        lanes = result.value("relayer_pending_lanes", store="orders")
        return len(pending) == lanes == LANES // 2 and members == 2

    try:
        views = [await asyncio.to_thread(scrape_until, port, split_evenly) for port in ports]
        lanes = [set(per_lane(view, "relayer_lane_pending_rows")) for view in views]
        assert lanes[0].isdisjoint(lanes[1]) and len(lanes[0] | lanes[1]) == LANES
        # Summed over the workers, the totals count every row once.
        assert sum(view.value("relayer_pending_rows", store="orders") for view in views) == ROWS
        assert sum(view.value("relayer_pending_lanes", store="orders") for view in views) == LANES
        await set_paused(memory_store, False)
        async with asyncio.timeout(30):
            while len(broker.received("events")) < ROWS:
                await asyncio.sleep(0.05)
        # A batch counts its rows once its outcomes committed, a moment after the broker got
        # them (and the exporters refresh every 0.1 s): wait for the counts to catch up.
        async with asyncio.timeout(10):
            while True:
                totals = [
                    (await asyncio.to_thread(scrape, port)).value(
                        "relayer_messages_sent_total", store="orders"
                    )
                    for port in ports
                ]
                if sum(totals) >= ROWS:
                    break
                await asyncio.sleep(0.1)
        assert sum(totals) == ROWS
        members = {view.by_label("relayer_worker_info", "member").popitem()[0] for view in views}
        assert members == {"worker-0", "worker-1"}
    finally:
        stop.set()
        await asyncio.gather(*tasks)


def test_metrics_port_without_the_extra_exits_2_naming_it(memory_store: StoreSettings) -> None:
    hide = "import sys; sys.modules['prometheus_client'] = None; from relayer.cli import run; run()"
    result = subprocess.run(
        [sys.executable, "-c", hide, "run", "orders", "--metrics-port", str(free_port())],
        env=environment(
            memory_store,
            RELAYER_STORES__ORDERS__TRANSPORTS__MEMORY__TYPE="memory",
            RELAYER_STORES__ORDERS__DEFAULT_TRANSPORT="memory",
        ),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert "relayer-outbox[metrics]" in result.stderr and "prometheus-client" in result.stderr
    assert result.stderr.count("\n") == 1  # one line, no traceback


async def test_a_taken_metrics_port_fails_start_up(memory_store: StoreSettings) -> None:
    first = WorkerMetrics(Worker([memory_store], transports={"orders": {}}))
    port = await first.serve("127.0.0.1", 0)
    try:
        result = await asyncio.to_thread(
            subprocess.run,
            command("run", "orders", "--metrics-port", str(port), "--metrics-host", "127.0.0.1"),
            env=environment(memory_store),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        await first.close()
    assert result.returncode == 1, result.stderr
    assert f"cannot serve metrics on 127.0.0.1:{port}" in result.stderr
