"""Which destinations keep per-key order natively, asked once and remembered (a little).

Before the first send to a (transport, destination), the relay asks the transport. At most
256 positive answers are kept per worker, evicted first-in-first-out (a hit does not refresh an
entry). Failed lookups and destinations without native ordering are never cached, so they
recover on a later attempt without a restart.
"""

from __future__ import annotations

from collections import OrderedDict

from relayer.errors import RelayerError
from relayer.transports.base import Transport, TransportUnavailableError

CAPACITY = 256


class PreparationError(RelayerError):
    """A row cannot be sent as it is; its key is parked with this message."""


class DestinationCache:
    def __init__(self, capacity: int = CAPACITY) -> None:
        self.capacity = capacity
        self._ordered: OrderedDict[tuple[str, str], None] = OrderedDict()
        self.lookups = 0

    def __len__(self) -> int:
        return len(self._ordered)

    def __contains__(self, entry: tuple[str, str]) -> bool:
        return entry in self._ordered

    async def require_ordered(self, transport: Transport, destination: str) -> None:
        """Return if ``destination`` keeps per-key order; PreparationError otherwise, or the
        transport's TransportUnavailableError when its broker cannot be reached."""
        entry = (transport.name, destination)
        if entry in self._ordered:
            return
        self.lookups += 1
        try:
            ordered = await transport.ordered_by_key(destination)
        except TransportUnavailableError:
            raise  # the broker cannot be reached: not the row's fault, no attempt counted
        except RelayerError as exc:
            raise PreparationError(
                f"cannot check destination {destination!r} of transport {transport.name!r}: "
                f"{exc}; once that is fixed, the key's next retry sends it (or redrive it)"
            ) from exc
        if not ordered:
            raise PreparationError(
                f"destination {destination!r} of transport {transport.name!r} does not keep "
                "per-key order natively, so ordered rows cannot be sent to it; send them to a "
                "destination that does (see docs/transports.md), then redrive the key"
            )
        self._ordered[entry] = None
        if len(self._ordered) > self.capacity:
            self._ordered.popitem(last=False)
