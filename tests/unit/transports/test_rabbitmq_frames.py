"""The RabbitMQ fast path's encoder writes exactly what pamqp (and so aiormq) would."""

from __future__ import annotations

import random
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relayer.transports.rabbitmq import frames

texts = st.text(st.characters(exclude_categories=("Cs",)), max_size=40)


def both(
    exchange: str, key: str, body: bytes, headers: dict[str, str], size: int = 131_064
) -> tuple[bytes | str, bytes | str]:
    """Each encoder's bytes, or "refused" when it raised ValueError."""
    message_id = str(uuid.uuid4())
    try:
        fast: bytes | str = frames.Encoder(7, size).publish(
            exchange, key, body, message_id, headers
        )
    except ValueError:
        fast = "refused"
    try:
        reference: bytes | str = frames.reference_encoding(
            7,
            size,
            exchange=exchange,
            routing_key=key,
            body=body,
            properties=frames.reference_properties(message_id, headers),
        )
    except ValueError:
        reference = "refused"
    return fast, reference


@settings(max_examples=200, deadline=None)
@given(
    exchange=texts,
    key=texts,
    body=st.binary(max_size=3_000),
    headers=st.dictionaries(
        texts.filter(lambda name: 0 < len(name.encode()) <= 128), texts, max_size=5
    ),
    size=st.sampled_from([64, 1_000, 131_064]),
)
def test_the_fast_encoding_is_pamqps(
    exchange: str, key: str, body: bytes, headers: dict[str, str], size: int
) -> None:
    fast, reference = both(exchange, key, body, headers, size)
    assert fast == reference


def test_empty_and_large_bodies_and_the_relays_headers() -> None:
    rng = random.Random(3)
    for body in (b"", b"x", rng.randbytes(500_000)):
        headers = {"relayer-message-id": str(uuid.uuid4()), "relayer-ordering-key": "order-42"}
        fast, reference = both("", "orders", body, headers)
        assert fast == reference


def test_what_amqp_cannot_carry_is_refused() -> None:
    encoder = frames.Encoder(1, 131_064)
    with pytest.raises(ValueError, match="at most 255"):
        encoder.publish("", "k" * 256, b"", str(uuid.uuid4()), {})
    with pytest.raises(ValueError, match="at most 128"):
        encoder.publish("", "k", b"", str(uuid.uuid4()), {"n" * 129: "v"})
    with pytest.raises(ValueError, match="not an AMQP exchange name"):
        encoder.publish("bad*name", "k", b"", str(uuid.uuid4()), {})
