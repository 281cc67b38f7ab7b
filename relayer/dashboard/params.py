"""What a request's query or form says, checked: every parameter a user can get wrong is a
BadRequest, answered 400 with one line naming the parameter, its value and the rule; a change
the request may not make is Refused (403)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from starlette.datastructures import FormData, QueryParams

from relayer.store.inspection import PARKED_STATES, ParkedFilter

Params = QueryParams | FormData


class BadRequest(Exception):
    """A parameter a user can get wrong: answered 400 with one line naming it."""

    def __init__(self, field: str, value: object, rule: str) -> None:
        super().__init__(f"{field}: {value!r} {rule}")


class Refused(Exception):
    """A change this request may not make (read-only, no session, no CSRF token, a foreign
    origin): answered 403 with the reason."""


def parked_filter(params: Params, lanes: int) -> ParkedFilter:
    """The parked-keys filter of a store of ``lanes`` lanes."""
    lane = params.get("lane")
    state = text(params.get("state"))
    if state is not None and state not in PARKED_STATES:
        raise BadRequest("state", state, f"must be one of {', '.join(PARKED_STATES)}")
    return ParkedFilter(
        error=text(params.get("error")),
        lane=integer("lane", lane, 0, lanes - 1) if text(lane) else None,
        destination=text(params.get("destination")),
        transport=text(params.get("transport")),
        state=state,
    )


def text(value: Any) -> str | None:
    """A text parameter without surrounding blanks; None when absent or blank."""
    if value is None or not isinstance(value, str):
        return None
    return value.strip() or None


def required(params: Params, name: str) -> str:
    value = params.get(name)
    if not isinstance(value, str) or value == "":
        raise BadRequest(name, value, "is required")
    return value


def integer(name: str, value: Any, low: int, high: int) -> int:
    try:
        number = int(str(value))
    except ValueError:
        raise BadRequest(name, value, f"must be an integer from {low} to {high}") from None
    if not low <= number <= high:
        raise BadRequest(name, value, f"must be an integer from {low} to {high}")
    return number


def row_id(name: str, value: Any) -> UUID:
    try:
        return UUID(str(value))
    except ValueError:
        raise BadRequest(name, value, "must be a row id (a UUID)") from None


def moment(name: str, value: str | None) -> datetime | None:
    """An ISO 8601 time with its UTC offset, in UTC; None when absent."""
    if not value:
        return None
    try:
        found = datetime.fromisoformat(value)
    except ValueError:
        raise BadRequest(name, value, "must be an ISO 8601 time") from None
    if found.tzinfo is None:
        raise BadRequest(name, value, "must carry its UTC offset")
    try:
        return found.astimezone(UTC)
    except OverflowError:  # 0001-01-01T00:00:00+14:00 is before year 1 in UTC
        raise BadRequest(name, value, "must be a time from year 1 to 9999 in UTC") from None


def without_nul(params: Params) -> None:
    """Refuse a parameter holding a NUL byte, which no PostgreSQL text can hold."""
    for name, value in params.multi_items():
        if "\x00" in name or (isinstance(value, str) and "\x00" in value):
            raise BadRequest(name, value, "must not contain a NUL byte (%00)")


def choice(name: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise BadRequest(name, value, f"must be one of {', '.join(choices)}")
    return str(value)


def next_path(params: Params) -> str:
    """Where to go after signing in: a path of this dashboard, never another site."""
    target = params.get("next")
    if isinstance(target, str) and target.startswith("/") and not target.startswith("//"):
        return target
    return "/"
