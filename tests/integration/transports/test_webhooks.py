"""The webhook transport against a local receiver: what each kind of answer (or none) means,
the concurrency limit, a stalled endpoint and a bounded close."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest

from relayer.relay.batch import LaneRelay
from relayer.store.driver import connect
from relayer.testing.pipeline import relay_messages
from relayer.transports import stalls
from relayer.transports.base import OutgoingMessage, TransportUnavailableError
from relayer.transports.routing import Routing
from relayer.transports.webhooks import WebhookTransport
from tests.conftest import apply_schema, make_store
from tests.integration.relay.helpers import keys_in_lane, parked, pending, write
from tests.webhook_receiver import Receiver, Request, usual_answer


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    started = Receiver().start()
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture
async def transport(receiver: Receiver) -> AsyncIterator[WebhookTransport]:
    opened = WebhookTransport("hooks", receiver.url, receiver.secret, timeout=2.0)
    await opened.start()
    try:
        yield opened
    finally:
        await opened.close_within(5)


def message(destination: str = "events", key: str | None = "k", **headers: str) -> OutgoingMessage:
    return OutgoingMessage(uuid.uuid4(), destination, b'{"n": 1}', key=key, headers=headers)


async def test_each_request_is_signed_and_names_the_outbox_id(
    receiver: Receiver, transport: WebhookTransport
) -> None:
    sent = message(trace="ünï")
    [outcome] = await relay_messages(transport, [sent])
    assert outcome.outcome == "acked"
    [request] = receiver.delivered
    assert request.signed
    assert request.path == "/events"
    assert request.headers["webhook-id"] == str(sent.id)
    assert request.headers["idempotency-key"] == str(sent.id)
    assert request.headers["relayer-message-id"] == str(sent.id)
    assert request.headers["relayer-ordering-key"] == "k"
    assert request.headers["content-type"] == "application/json"
    assert request.headers["trace"] == "ünï"
    assert request.headers["webhook-timestamp"].isdigit()


async def test_a_4xx_parks_the_key_with_the_status_and_a_redacted_excerpt(
    receiver: Receiver, transport: WebhookTransport
) -> None:
    async def answer(request: Request) -> int:
        return 422 if request.path == "/refusing" else 200

    receiver.answer = answer
    later = message("refusing")
    outcomes = await relay_messages(transport, [message("refusing"), later, message(key="other")])
    assert [sent.outcome for sent in outcomes] == ["failed", "unsent", "acked"]
    failed = outcomes[0]
    assert failed.permanent
    assert "422" in failed.error
    assert "status 422 for /refusing" in failed.error  # the start of the answer
    assert "redrive the key" in failed.error


async def test_an_answer_with_a_secret_in_it_is_redacted(
    receiver: Receiver, transport: WebhookTransport
) -> None:
    answer_body = "password=hunter2 was refused"

    async def answer(request: Request) -> int:
        return 400

    receiver.answer = answer
    receiver.body = answer_body
    [outcome] = await relay_messages(transport, [message()])
    assert outcome.outcome == "failed"
    assert "hunter2" not in outcome.error
    assert "password=***" in outcome.error


@pytest.mark.parametrize("status", [500, 503, 429, 408])
async def test_5xx_and_come_back_later_are_the_endpoints_fault(
    receiver: Receiver, transport: WebhookTransport, status: int
) -> None:
    async def answer(request: Request) -> int:
        return status

    receiver.answer = answer
    outcomes = await relay_messages(transport, [message(key="a"), message(key="b")])
    assert {sent.outcome for sent in outcomes} == {"unavailable"}
    assert str(status) in outcomes[0].error
    assert "no attempt is counted" in outcomes[0].error


async def test_no_answer_in_time_and_no_server_are_the_endpoints_fault(
    receiver: Receiver,
) -> None:
    receiver.answer = hang
    slow = WebhookTransport("hooks", receiver.url, receiver.secret, timeout=0.5)
    nobody = WebhookTransport("hooks", "http://127.0.0.1:9", receiver.secret)
    for transport, words in ((slow, "Timeout"), (nobody, "ConnectError")):
        await transport.start()
        try:
            [outcome] = await relay_messages(transport, [message()])
        finally:
            await transport.close_within(1)
        assert outcome.outcome == "unavailable", outcome
        assert words in outcome.error


async def test_requests_under_way_stay_within_max_concurrency(receiver: Receiver) -> None:
    under_way = 0
    most = 0
    release = asyncio.Event()

    async def held(request: Request) -> int:
        nonlocal under_way, most
        under_way += 1
        most = max(most, under_way)
        if most >= 3:
            release.set()
        await release.wait()
        under_way -= 1
        return 200

    receiver.answer = held
    transport = WebhookTransport("hooks", receiver.url, receiver.secret, max_concurrency=3)
    await transport.start()
    try:
        keys = [message(key=f"k{number}") for number in range(30)]
        outcomes = await relay_messages(transport, keys)
    finally:
        await transport.close_within(5)
    assert {sent.outcome for sent in outcomes} == {"acked"}
    assert most == 3


async def test_a_stalled_endpoint_gets_no_second_copy_and_is_said_once(
    receiver: Receiver, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Any silence is a stall here, however short (the default needs a second of it).
    monkeypatch.setattr(stalls, "QUIET_SECONDS", 0.0)
    receiver.answer = hang
    transport = WebhookTransport("hooks", receiver.url, receiver.secret, timeout=60)
    await transport.start()
    sent = message()
    try:
        [first] = await relay_messages(transport, [sent], deadline=0.5)
        assert first.outcome == "unacknowledged"  # the relay gave up waiting (batch deadline)
        with caplog.at_level(logging.WARNING, "relayer.transports.webhooks"):
            for _ in range(3):
                [again] = await relay_messages(transport, [sent])
                assert again.outcome == "unavailable"
                assert "still waits" in again.error
        said = [record for record in caplog.records if "stalled" in record.getMessage()]
        assert len(said) == 1
        assert said[0].action == "transport_stall"  # type: ignore[attr-defined]
    finally:
        await transport.close_within(1)
    assert receiver.delivered == []
    assert len(receiver.refused) == 0  # one request, never answered


async def hang(request: Request) -> int:
    await asyncio.Event().wait()
    return 200


async def test_close_within_fails_what_the_endpoint_never_answers(receiver: Receiver) -> None:
    receiver.answer = hang
    transport = WebhookTransport("hooks", receiver.url, receiver.secret, timeout=60)
    await transport.start()
    acknowledgements = [await transport.publish(message(key=f"k{n}")) for n in range(5)]
    async with asyncio.timeout(30):  # far beyond the 0.2 s asked: close must not hang
        await transport.close_within(0.2)
    for acknowledgement in acknowledgements:
        with pytest.raises(TransportUnavailableError, match="closed before the endpoint"):
            await acknowledgement


async def test_the_relay_counts_no_attempt_while_the_endpoint_fails(
    receiver: Receiver, transport: WebhookTransport, pg_dsn: str
) -> None:
    async def down(request: Request) -> int:
        return 503

    receiver.answer = down
    store = make_store(
        pg_dsn, lanes=4, transports={"hooks": {"type": "memory"}}, default_transport="hooks"
    )
    await apply_schema(store)
    keys = keys_in_lane(store, 1, 3)
    write(store, keys, per_key=2, destination="orders")
    relay = LaneRelay(store, Routing(store, {"hooks": transport}), "member-a")
    conn = await connect(store, autocommit=False, purpose="test")
    try:
        await relay.send_lanes(conn, [1])
        assert parked(store) == {}
        assert pending(store) == 6
        receiver.answer = usual_answer
        await relay.send_lanes(conn, [1])
        await relay.send_lanes(conn, [1])
    finally:
        await conn.close()
    assert pending(store) == 0
    bodies: dict[str, list[str]] = {}
    for request in receiver.delivered:
        bodies.setdefault(request.headers["relayer-ordering-key"], []).append(request.body.decode())
    assert bodies == {key: [f"{key}#0", f"{key}#1"] for key in keys}
