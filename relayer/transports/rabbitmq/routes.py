"""RabbitMQ destinations: how a row's destination string names an exchange and routing key.

| destination            | exchange          | routing key                          |
|------------------------|-------------------|--------------------------------------|
| ``/orders``            | default (``""``)  | ``orders``: straight into that queue |
| ``events/order.paid``  | ``events``        | ``order.paid``                       |
| ``events.hash/{key}``  | ``events.hash``   | the row's ordering key               |
| ``events.fanout``      | ``events.fanout`` | empty                                |

The exchange name ends at the first ``/``; the routing key is everything after it and may
contain ``/``. ``{key}`` as the whole routing key is replaced by the ordering key (rows without
a key get an empty routing key): use it with a consistent-hash exchange so each key always
lands in the same queue. This module does not import the AMQP driver.
"""

from __future__ import annotations

from dataclasses import dataclass

KEY_PLACEHOLDER = "{key}"
# AMQP 0-9-1 short strings: exchange names, queue names and routing keys.
_MAX_NAME_BYTES = 255


class RouteError(ValueError):
    """A destination string that names no valid exchange/routing key."""


@dataclass(frozen=True, slots=True)
class Route:
    """Where one destination publishes to."""

    destination: str
    exchange: str
    routing_key: str
    by_key: bool

    @property
    def queue(self) -> str | None:
        """The queue name when the destination publishes straight into a queue."""
        return self.routing_key if self.exchange == "" else None

    def routing_key_for(self, key: str | None) -> str:
        if not self.by_key:
            return self.routing_key
        routing_key = key or ""
        if len(routing_key.encode()) > _MAX_NAME_BYTES:
            raise RouteError(
                f"the ordering key {routing_key[:40]!r}... is longer than 255 bytes and cannot "
                f"be the routing key of destination {self.destination!r}; use shorter keys or "
                "a fixed routing key with a hash-header exchange"
            )
        return routing_key


def parse_route(destination: str) -> Route:
    """The route of ``destination``; RouteError says what is wrong and the accepted forms."""
    exchange, slash, routing_key = destination.partition("/")
    if not destination:
        raise RouteError(_explain(destination, "is empty"))
    if exchange == "" and not routing_key:
        raise RouteError(_explain(destination, "names no queue after '/'"))
    if exchange.startswith("amq.default"):
        raise RouteError(_explain(destination, "uses amq.default; write '/queue' instead"))
    for part, what in ((exchange, "exchange name"), (routing_key, "routing key")):
        if len(part.encode()) > _MAX_NAME_BYTES:
            raise RouteError(_explain(destination, f"has a {what} longer than 255 bytes"))
    by_key = routing_key == KEY_PLACEHOLDER
    if by_key and exchange == "":
        raise RouteError(
            _explain(destination, "routes by key through the default exchange, which needs a "
                     "queue name; use an exchange (e.g. a consistent-hash one)")
        )  # fmt: skip
    if slash == "":
        routing_key = ""
    return Route(destination, exchange, "" if by_key else routing_key, by_key)


def _explain(destination: str, problem: str) -> str:
    return (
        f"RabbitMQ destination {destination!r} {problem}; write '/queue' for a queue, "
        "'exchange/routing-key', 'exchange/{key}' to route by ordering key, or 'exchange'"
    )
