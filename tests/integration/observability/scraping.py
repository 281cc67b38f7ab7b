"""Reading a metrics endpoint the way Prometheus does: HTTP GET, then the text format."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True, slots=True)
class Scrape:
    """Every sample of one scrape: (name, sorted labels) -> value."""

    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float]

    def value(self, name: str, **labels: str) -> float:
        return self.samples[(name, tuple(sorted(labels.items())))]

    def by_label(self, name: str, label: str, **fixed: str) -> dict[str, float]:
        """``label``'s value -> sample value, for the samples of ``name`` matching ``fixed``."""
        found: dict[str, float] = {}
        for (sample, labels), value in self.samples.items():
            mapping = dict(labels)
            if sample == name and all(mapping.get(k) == v for k, v in fixed.items()):
                found[mapping[label]] = value
        return found

    def names(self) -> set[str]:
        return {name for name, _ in self.samples}


def scrape(port: int) -> Scrape:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return parse(response.read().decode())


def parse(text: str) -> Scrape:
    """The samples of a text exposition (duplicates would be lost: promtool checks them)."""
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return Scrape(samples)


def scrape_until(port: int, predicate: Callable[[Scrape], bool], within: float = 30) -> Scrape:
    """Scrape until ``predicate`` holds (a generous bound, not a timing assertion)."""
    deadline = time.monotonic() + within
    last: Scrape | None = None
    while time.monotonic() < deadline:
        try:
            last = scrape(port)
        except OSError:
            last = None  # not listening yet
        if last is not None and predicate(last):
            return last
        time.sleep(0.1)
    raise AssertionError(f"metrics never matched; last scrape: {last}")
