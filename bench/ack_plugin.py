"""A transport plug-in for the steady mode: ``relayer run`` itself, its Kafka transport timing
one acknowledgement in ``every`` (bench.efficiency_children.SampledAckClock).

The steady mode registers it in a temporary distribution folder (``register``) put on the
worker's PYTHONPATH, so the worker is exactly ``python -m relayer --config FILE run STORE``: the
CLI's set-up, logging and signal handling, the production transport factory. Its TOML names
``type = "sampled-kafka"`` with the Kafka settings plus ``acks_file`` and ``every``; on close
the samples and counts go to ``acks_file`` as JSON.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bench.efficiency_children import SampledAckClock
from relayer.deadlines import Deadlines

ENTRY_POINT = "sampled-kafka"


class SampledKafka(SampledAckClock):
    """SampledAckClock around a KafkaTransport that writes its samples out on close."""

    def __init__(self, inner: Any, every: int, out: str) -> None:
        super().__init__(inner, every)
        self.out = out
        self.batches_sent = 0

    async def publish_batch(self, *args: Any, **kwargs: Any) -> int:
        self.batches_sent += 1
        return await super().publish_batch(*args, **kwargs)

    async def close(self) -> None:
        await super().close()
        await self._write_out()

    async def close_within(self, seconds: float) -> None:
        """What the worker calls at its stop (the Kafka transport closes within a bound)."""
        await self.inner.close_within(seconds)
        await self._write_out()

    async def _write_out(self) -> None:
        acked = {str(message_id): at for message_id, at in self.samples}
        batching = {"transactions": self.batches_sent, "sent": self.seen}
        text = json.dumps({"acked": acked, "published": self.seen, "batching": batching})
        await asyncio.to_thread(Path(self.out).write_text, text)


def sampled_kafka(name: str, options: Mapping[str, Any]) -> SampledKafka:
    """The plug-in's factory(name, options)."""
    from datetime import timedelta

    from relayer.transports.kafka import KafkaTransport

    rest = {key: value for key, value in options.items() if key not in ("acks_file", "every")}
    # The batch deadline relayer gives its built-in Kafka transport: lease_duration / 2 of
    # the default lease (the steady mode sets none).
    deadline = timedelta(seconds=Deadlines.of(timedelta(seconds=30)).batch)
    inner = KafkaTransport.from_options(name, rest, batch_deadline=deadline)
    return SampledKafka(inner, int(options.get("every", 4)), str(options["acks_file"]))


def register(folder: str) -> str:
    """A distribution folder in ``folder`` whose entry point registers the plug-in; the path
    to put on PYTHONPATH."""
    info = Path(folder) / "relayer_bench_plugins-0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: relayer-bench-plugins\nVersion: 0\n"
    )
    (info / "entry_points.txt").write_text(
        f"[relayer.transports]\n{ENTRY_POINT} = bench.ack_plugin:sampled_kafka\n"
    )
    return folder
