from datetime import datetime

import pytest

from relayer import Outbox, OutboxMessage
from relayer.errors import InvalidMessageError, UsageError
from relayer.settings import store_settings
from relayer.writer.messages import validate, validate_all

STORE = store_settings(
    name="orders",
    lanes=8,
    max_body_bytes=1024,
    transports={"kafka": {"type": "kafka"}, "rabbit": {"type": "rabbitmq"}},
    default_transport="kafka",
)


def rejected(**fields: object) -> InvalidMessageError:
    values: dict[str, object] = {"destination": "d", "body": b"x"}
    values.update(fields)
    with pytest.raises(InvalidMessageError) as caught:
        validate(STORE, OutboxMessage(**values))  # type: ignore[arg-type]
    return caught.value


def test_valid_message_becomes_a_row() -> None:
    fields = validate(STORE, OutboxMessage("d", bytearray(b"x"), key="k"))
    assert fields[0] is not None and fields[1] == "k" and fields[2] == "kafka"
    assert fields[4] == b"x"


@pytest.mark.parametrize("body", ["text", 5, None, {"a": 1}])
def test_body_must_be_bytes(body: object) -> None:
    error = rejected(body=body)
    assert error.field == "body"
    assert "must be bytes" in error.rule


def test_oversize_body() -> None:
    error = rejected(body=b"x" * 1025)
    assert "max_body_bytes" in error.rule


@pytest.mark.parametrize(
    ("key", "rule"),
    [
        ("", "must not be empty"),
        ("k" * 1025, "limit is 1,024"),
        (b"k", "must be str"),
        ("a\x00b", "NUL"),
    ],
)
def test_bad_keys(key: object, rule: str) -> None:
    error = rejected(key=key)
    assert error.field == "key"
    assert rule in error.rule


@pytest.mark.parametrize(
    "headers",
    [{"a": 1}, {1: "a"}, {"": "a"}, ["a", "b"], {"a": "x\x00"}, {"big": "x" * 70_000}],
)
def test_bad_headers(headers: object) -> None:
    assert rejected(headers=headers).field.startswith("headers")


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"key": "order-\udc80"}, "key"),
        ({"destination": "orders\ud800"}, "destination"),
        ({"headers": {"note": "caf\udce9"}}, "headers['note']"),
        ({"headers": {"n\udce9": "x"}}, "headers['n\\udce9']"),
    ],
)
def test_text_with_a_lone_surrogate_is_refused_by_name(
    fields: dict[str, object], field: str
) -> None:
    """Text PostgreSQL cannot store (bytes decoded with surrogateescape) gets a clear error
    before anything is written, not an encoding error from the driver."""
    error = rejected(**fields)
    assert error.field == field
    assert "lone surrogate" in error.rule and "surrogateescape" in error.rule


def test_unknown_transport() -> None:
    error = rejected(transport="sqs")
    assert error.field == "transport"
    assert "'kafka'" in error.rule


@pytest.mark.parametrize("destination", ["", 7, "d" * 1025])
def test_bad_destination(destination: object) -> None:
    assert rejected(destination=destination).field == "destination"


def test_naive_deliver_at() -> None:
    error = rejected(deliver_at=datetime(2030, 1, 1))
    assert "timezone-aware" in error.rule


def test_write_many_names_the_position() -> None:
    with pytest.raises(InvalidMessageError) as caught:
        validate_all(STORE, [OutboxMessage("d", b"x"), {"destination": "d"}])  # type: ignore[list-item]
    assert caught.value.field == "messages[1]"


def test_a_message_naming_no_transport_needs_a_default() -> None:
    store = STORE.model_copy(update={"default_transport": None})
    with pytest.raises(InvalidMessageError) as caught:
        validate(store, OutboxMessage("d", b"x", key="k"))
    assert str(caught.value) == (
        "transport: None is invalid: store 'orders' has no default_transport, so a message "
        "must name one of its transports ('kafka', 'rabbit'); pass transport=..., or set "
        "stores.orders.default_transport"
    )
    assert validate(store, OutboxMessage("d", b"x", key="k", transport="rabbit"))[2] == "rabbit"
    # A writer configured without transports cannot know them: the worker's default applies.
    bare = store_settings(name="orders", lanes=8)
    assert validate(bare, OutboxMessage("d", b"x", key="k"))[2] is None


NO_DEFAULT = store_settings(
    name="orders", lanes=8, transports={"kafka": {"type": "kafka"}, "rabbit": {"type": "rabbitmq"}}
)
PLAIN = store_settings(name="orders", lanes=8, max_body_bytes=1024)


@pytest.mark.parametrize(
    "store", [STORE, NO_DEFAULT, PLAIN], ids=["default", "no-default", "plain"]
)
@pytest.mark.parametrize(
    "arguments",
    [
        {},
        {"key": None},
        {"key": "customer-1"},
        {"key": "kündin"},
        {"key": ""},
        {"key": "a\x00b"},
        {"key": "k" * 1024},
        {"key": "k" * 1025},
        {"key": 5},
        {"destination": ""},
        {"destination": "d\x00"},
        {"destination": "d" * 1025},
        {"destination": "zürich"},
        {"destination": b"d"},
        {"body": bytearray(b"x")},
        {"body": b"x" * 1024},
        {"body": b"x" * 1025},
        {"body": "text"},
        {"headers": {}},
        {"headers": {"a": "b"}},
        {"transport": "rabbit"},
        {"transport": "nope"},
        {"deliver_at": datetime(2030, 1, 1)},
    ],
    ids=lambda arguments: repr(arguments)[:40],
)
def test_write_arguments_are_checked_as_a_message_is(
    store: object, arguments: dict[str, object]
) -> None:
    """write() checks its arguments without building an OutboxMessage (a shortcut for the
    usual message): the same row, or the same error, as validate() gives the message."""
    from relayer.writer.messages import validate_fields

    values: dict[str, object] = {
        "destination": "d",
        "body": b"x",
        "key": "k",
        "headers": None,
        "transport": None,
        "deliver_at": None,
    }
    values.update(arguments)
    try:
        expected = comparable(validate(store, OutboxMessage(**values)))  # type: ignore[arg-type]
    except InvalidMessageError as exc:
        expected = (exc.field, str(exc.value), exc.rule)
    try:
        got = comparable(validate_fields(store, **values))  # type: ignore[arg-type]
    except InvalidMessageError as exc:
        got = (exc.field, str(exc.value), exc.rule)
    assert got == expected


def comparable(fields: tuple[object, ...]) -> tuple[object, ...]:
    """A row's fields with the headers' JSON as bytes (EncodedJson compares by identity)."""
    return tuple(getattr(value, "data", value) for value in fields)


def test_an_object_that_is_no_connection_is_refused_every_time() -> None:
    """How to reach a connection is remembered per type; a refusal never is."""
    outbox = Outbox(STORE)
    for _ in range(2):
        with pytest.raises(UsageError, match=r"cannot use a builtins\.object for write"):
            outbox.write(object(), destination="d", body=b"x")
