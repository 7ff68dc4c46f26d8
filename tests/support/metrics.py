"""Reading a Prometheus scrape with prometheus_client's own parser."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

Labels = tuple[tuple[str, str], ...]


def samples(exposition: str) -> dict[str, dict[Labels, float]]:
    """Sample name -> sorted labels -> value."""
    out: dict[str, dict[Labels, float]] = {}
    for family in text_string_to_metric_families(exposition):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def value(scrape: dict[str, dict[Labels, float]], name: str, **labels: str) -> float:
    return scrape[name][tuple(sorted(labels.items()))]


def nonzero(scrape: dict[str, dict[Labels, float]], name: str) -> dict[Labels, float]:
    return {labels: v for labels, v in scrape[name].items() if v}
