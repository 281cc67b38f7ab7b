"""The relay over every transport: one lane batch with a bad destination in it, in each
storage mode (docs/storage.md).

The transport-level suite checks outcomes; this one checks what the protocol makes of them:
the key sent to the bad destination is parked with the transport's actionable message, and the
other keys of the same lane reach the consumer, complete and in order. On each path of
relayer.store.wire (libpq's pipeline, psycopg's cursors).
"""

from __future__ import annotations

from typing import Any

import pytest

from relayer.relay.batch import LaneRelay
from relayer.relay.results import Scan
from relayer.settings import StoreSettings
from relayer.store.driver import connect
from relayer.transports.base import Transport
from relayer.transports.routing import Routing
from tests.conftest import apply_schema, make_store
from tests.contract.brokers import Broker
from tests.integration.relay.helpers import keys_in_lane, parked, pending, write
from tests.pgbouncer import PgBouncer


async def relay_store(dsn: str, transport: Transport, **overrides: Any) -> StoreSettings:
    store = make_store(
        dsn,
        lanes=4,
        lease_duration="20s",
        poll_interval="0.5s",
        transports={transport.name: {"type": "memory"}},  # the name rows refer to
        default_transport=transport.name,
        **overrides,
    )
    await apply_schema(store)
    return store


@pytest.fixture(params=["direct", "pgbouncer_strict"])
def database(request: pytest.FixtureRequest, pg_dsn: str) -> tuple[str, dict[str, Any]]:
    """The relay's way to its database: directly, or through PgBouncer pooling by transaction
    (two server connections, DISCARD ALL whenever one changes hands); DSN and settings."""
    if request.param == "direct":
        return pg_dsn, {}
    bouncer: PgBouncer = request.getfixturevalue(request.param)
    return bouncer.dsn_for(pg_dsn), {"pooler": "transaction"}


@pytest.mark.usefixtures("wire_path")
@pytest.mark.parametrize("storage", ["delete", "partitioned"])
async def test_a_bad_destination_parks_only_its_key(
    broker: Broker, transport: Transport, database: tuple[str, dict[str, Any]], storage: str
) -> None:
    dsn, pooling = database
    store = await relay_store(dsn, transport, storage=storage, **pooling)
    good_destination = await broker.destination()
    bad_key, *good_keys = keys_in_lane(store, 2, 4)
    write(store, good_keys, per_key=5, destination=good_destination)
    write(store, [bad_key], per_key=3, destination=broker.bad_destination())
    relay = LaneRelay(store, Routing(store, {transport.name: transport}), "member-a")
    conn = await connect(store, autocommit=False, purpose="contract")  # as relayer opens them
    try:
        [result] = await relay.send_lanes(conn, [2])
    finally:
        await conn.close()
    assert result.scan is Scan.SENT
    assert result.sent == 15
    reasons = parked(store)
    assert list(reasons) == [bad_key]
    attempts, error, _ = reasons[bad_key]
    assert attempts == 1
    assert "destination" in error  # says which destination to fix
    assert pending(store) == 3
    received = await broker.consume(good_destination, 15)
    sequences: dict[str, list[int]] = {}
    for message in received:
        key, number = message.body.decode().rsplit("#", 1)
        sequences.setdefault(key, []).append(int(number))
    assert sequences == {key: [0, 1, 2, 3, 4] for key in good_keys}
