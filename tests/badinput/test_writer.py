"""Bad rows offered to the writer, through each kind of connection an application uses.

Every case raises InvalidMessageError naming the field, the value and the rule before anything
is written; the caller's transaction stays usable: its business row and a following good
outbox row commit, and nothing of the refused message does.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

import psycopg
import pytest

from relayer import InvalidMessageError, Outbox, OutboxMessage
from relayer.settings import StoreSettings
from tests.conftest import apply_schema, make_store

LONG = "k" * 1025
# (what the message changes, the error's whole text)
CASES: list[tuple[dict[str, Any], str]] = [
    (
        {"body": "text"},
        "body: 'text' is invalid: must be bytes, not str; encode it first (for example "
        "body=json.dumps(event).encode())",
    ),
    (
        {"body": None},
        "body: None is invalid: must be bytes, not NoneType; encode it first (for example "
        "body=json.dumps(event).encode())",
    ),
    (
        {"body": b"x" * 1025},
        "body: <1,025 bytes> is invalid: is larger than this store's max_body_bytes (1,024); "
        "send less, or raise max_body_bytes (the broker must accept it too)",
    ),
    ({"key": ""}, "key: '' is invalid: must not be empty; use key=None for an unordered message"),
    ({"key": LONG}, f"key: '{LONG[:76]}... is invalid: is 1,025 bytes; the limit is 1,024"),
    ({"key": "a\x00b"}, "key: 'a\\x00b' is invalid: must not contain NUL characters"),
    ({"key": b"k"}, "key: b'k' is invalid: must be str, not bytes"),
    ({"destination": ""}, "destination: '' is invalid: must not be empty"),
    ({"destination": 7}, "destination: 7 is invalid: must be str, not int"),
    (
        {"destination": "orders\x00"},
        "destination: 'orders\\x00' is invalid: must not contain NUL characters",
    ),
    ({"headers": {"a": 1}}, "headers['a']: 1 is invalid: must be str, not int"),
    ({"headers": {"": "x"}}, "headers: '' is invalid: header names must be non-empty str"),
    (
        {"headers": ["a"]},
        "headers: ['a'] is invalid: must be a mapping of str to str, not list",
    ),
    ({"headers": {"a": "x\x00"}}, "headers['a']: 'x\\x00' is invalid: must not contain NUL"),
    (
        {"headers": {"big": "x" * 70_000}},
        "headers: <70,003 bytes> is invalid: the total is limited to 65,536 bytes; put large "
        "data in the body",
    ),
    (
        {"headers": {"relayer-sequence": "5"}},
        "headers['relayer-sequence']: '5' is invalid: is reserved: relayer stamps it when the "
        "store sets sequence_numbers = true",
    ),
    (
        {"headers": {"relayer-message-id": "5"}},
        "headers['relayer-message-id']: '5' is invalid: is reserved: relayer sets it on every "
        "message (the outbox id); remove it or use another name",
    ),
    (
        {"headers": {"relayer-ordering-key": "k"}},
        "headers['relayer-ordering-key']: 'k' is invalid: is reserved: relayer sets it on every "
        "message (the ordering key); remove it or use another name",
    ),
    (
        {"transport": "sqs"},
        "transport: 'sqs' is invalid: is not a transport of store 'orders' (configured: "
        "'memory'); name one of them, or configure it in the store's settings",
    ),
    ({"transport": ""}, "transport: '' is invalid: must not be empty; use None for the default"),
    (
        {"deliver_at": datetime(2030, 1, 1)},
        "deliver_at: datetime.datetime(2030, 1, 1, 0, 0) is invalid: must be timezone-aware "
        "(for example datetime.now(UTC) + timedelta(...))",
    ),
    ({"deliver_at": "tomorrow"}, "deliver_at: 'tomorrow' is invalid: must be a datetime or None"),
]


def message(**changes: Any) -> OutboxMessage:
    values: dict[str, Any] = {"destination": "events", "body": b"{}", "key": "customer-7"}
    values.update(changes)
    return OutboxMessage(**values)


@pytest.fixture
async def store(pg_dsn: str) -> StoreSettings:
    settings = make_store(
        pg_dsn,
        max_body_bytes=1024,
        transports={"memory": {"type": "memory"}},
        default_transport="memory",
    )
    await apply_schema(settings)
    with psycopg.connect(pg_dsn) as conn:
        conn.execute("CREATE TABLE shop_orders (id integer PRIMARY KEY)")
        conn.commit()
    return settings


def committed(store: StoreSettings) -> tuple[list[int], list[bytes]]:
    """The business rows and the outbox bodies that were committed."""
    with psycopg.connect(store.require_dsn()) as conn:
        orders = [row[0] for row in conn.execute("SELECT id FROM shop_orders ORDER BY id")]
        bodies = [bytes(row[0]) for row in conn.execute("SELECT body FROM orders_outbox")]
    return orders, bodies


def refuse_each(write: Callable[[int, OutboxMessage], None]) -> None:
    """Offer every bad case, each after its order's business row, then a good row."""
    for number, (changes, expected) in enumerate(CASES):
        with pytest.raises(InvalidMessageError) as caught:
            write(number, message(**changes))
        assert str(caught.value) == expected, changes
        assert caught.value.field == expected.split(": ", 1)[0]
    write(len(CASES), message(body=b"good"))


def expected_state() -> tuple[list[int], list[bytes]]:
    return list(range(len(CASES) + 1)), [b"good"]


def test_psycopg_connection(store: StoreSettings) -> None:
    outbox = Outbox(store)
    with psycopg.connect(store.require_dsn()) as conn:

        def write(number: int, offered: OutboxMessage) -> None:
            conn.execute("INSERT INTO shop_orders VALUES (%s)", (number,))
            outbox.write(conn, **vars_of(offered))

        refuse_each(write)
        conn.commit()
    assert committed(store) == expected_state()


async def test_async_psycopg_connection(store: StoreSettings) -> None:
    outbox = Outbox(store)
    async with await psycopg.AsyncConnection.connect(store.require_dsn()) as conn:
        for number, (changes, expected) in enumerate(CASES):
            await conn.execute("INSERT INTO shop_orders VALUES (%s)", (number,))
            with pytest.raises(InvalidMessageError) as caught:
                await outbox.write_async(conn, **vars_of(message(**changes)))
            assert str(caught.value) == expected
        await conn.execute("INSERT INTO shop_orders VALUES (%s)", (len(CASES),))
        await outbox.write_async(conn, destination="events", body=b"good", key="customer-7")
        await conn.commit()
    assert committed(store) == expected_state()


def vars_of(offered: OutboxMessage) -> dict[str, Any]:
    return {name: getattr(offered, name) for name in OutboxMessage.__slots__}


def test_sqlalchemy_session(store: StoreSettings) -> None:
    from sqlalchemy import create_engine, text
    from sqlalchemy.orm import Session

    engine = create_engine(store.require_dsn().replace("postgresql://", "postgresql+psycopg://"))
    outbox = Outbox(store)
    try:
        with Session(engine) as session:

            def write(number: int, offered: OutboxMessage) -> None:
                session.execute(text("INSERT INTO shop_orders VALUES (:id)"), {"id": number})
                outbox.write(session, **vars_of(offered))

            refuse_each(write)
            session.commit()
    finally:
        engine.dispose()
    assert committed(store) == expected_state()


def test_a_batch_with_one_bad_message_writes_nothing(store: StoreSettings) -> None:
    outbox = Outbox(store)
    good = [message(key=f"customer-{number}") for number in range(3)]
    with psycopg.connect(store.require_dsn()) as conn:
        conn.execute("INSERT INTO shop_orders VALUES (1)")
        with pytest.raises(InvalidMessageError) as caught:
            outbox.write_many(conn, [*good, message(key=""), *good])
        assert str(caught.value) == (
            "messages[3].key: '' is invalid: must not be empty; use key=None for an unordered "
            "message"
        )
        with pytest.raises(InvalidMessageError) as caught:
            outbox.write_many(conn, [*good, {"destination": "events"}])  # type: ignore[list-item]
        assert (
            str(caught.value) == "messages[3]: 'dict' is invalid: must be a relayer.OutboxMessage"
        )
        outbox.write(conn, destination="events", body=b"good", key="customer-1")
        conn.commit()
    assert committed(store) == ([1], [b"good"])
