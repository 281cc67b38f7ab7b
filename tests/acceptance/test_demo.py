"""``relayer demo`` end to end, on the test services (the README's first command)."""

from __future__ import annotations

from tests.acceptance.cli import environment, relayer


def test_demo_relays_and_verifies_per_key_order(pg_dsn: str, kafka_bootstrap: str) -> None:
    result = relayer(
        "demo",
        "--dsn",
        pg_dsn,
        "--kafka-bootstrap",
        kafka_bootstrap,
        "--live-orders",
        "40",
        "--backlog-orders",
        "3000",
        env=environment(),
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "two workers running" in out
    assert "worker-1 sent lanes [" in out and "worker-2 sent lanes [" in out
    assert "rows written per lane" in out and "  0: " in out
    assert "orders/s end to end" in out
    assert "verified: 3,040 of 3,040 orders received" in out
    assert "customers' events in order" in out
