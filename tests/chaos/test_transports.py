"""Chaos smokes of the NATS JetStream and Redis Streams transports: three workers, two steady
writers, and the proxy in front of the server stalling every connection past the batch
deadline, then resetting them all, twice. Nothing lost, no first delivery out of order (I1-I5,
tests/chaos/checker.py). Marked ``chaos_smoke``: ``make test`` runs them."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos.brokers import NatsTarget, RedisTarget
from tests.chaos.harness import Run
from tests.chaos.proxy import LoopThread, Proxy
from tests.chaos.test_chaos import SETTINGS, SMOKE, Scenario, hold, relay, until

FAULTS = "proxy: a stall past the batch deadline, then resets (x2)"


def stall_then_resets(proxy: Proxy) -> Scenario:
    def scenario(run: Run, seconds: float) -> None:
        until(run, seconds / 5)
        run.loop.call(proxy.stall)
        hold(run, SETTINGS.lease * 0.6)  # past the batch deadline (lease / 2)
        run.loop.call(proxy.resume)
        run.injected()
        for at in (seconds / 2, seconds * 3 / 4):
            until(run, at)
            assert run.loop.call(proxy.reset) > 0
            run.injected()

    return scenario


@pytest.mark.chaos_smoke
def test_smoke_nats_stall_and_resets(
    request: pytest.FixtureRequest,
    nats_target: NatsTarget,
    pg_dsn: str,
    tmp_path: Path,
    loop: LoopThread,
) -> None:
    scenario = stall_then_resets(nats_target.proxy)
    relay(request, FAULTS, nats_target, pg_dsn, tmp_path, loop, scenario, SMOKE)


@pytest.mark.chaos_smoke
def test_smoke_redis_stall_and_resets(
    request: pytest.FixtureRequest,
    redis_target: RedisTarget,
    pg_dsn: str,
    tmp_path: Path,
    loop: LoopThread,
) -> None:
    scenario = stall_then_resets(redis_target.proxy)
    relay(request, FAULTS, redis_target, pg_dsn, tmp_path, loop, scenario, SMOKE)
