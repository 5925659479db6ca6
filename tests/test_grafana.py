"""The Grafana dashboard of docs/grafana/sqlmq-dashboard.json speaks of sqlmq's metrics as
they are: every series name in every panel's PromQL is one sqlmq.metrics exports (read
from a running broker's registry, so a renamed metric fails here), with the suffixes
Prometheus gives each type (a counter's ``_total``; a histogram's ``_bucket``, ``_sum`` and
``_count``), and every metric sqlmq exports has a panel."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import pytest

from sqlmq import Broker, PrometheusMetrics

DASHBOARD = Path(__file__).resolve().parent.parent / "docs" / "grafana" / "sqlmq-dashboard.json"

#: The series each metric type is scraped as.
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"),
            "gauge": ("",)}
#: PromQL words that are neither functions (those are followed by a parenthesis) nor series.
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and",
            "or", "unless", "offset", "inf", "nan"}
#: Variables Grafana defines itself.
BUILTIN_VARIABLES = {"__rate_interval", "__interval", "__range"}


async def _families() -> dict[str, str]:
    """The metric families a broker's metrics export, by name: their type."""
    broker = Broker("memory://")
    await broker.migrate()
    metrics = PrometheusMetrics(queue_depth=True, queue_depth_interval=0)
    broker.add_middleware(metrics)
    await broker.start()
    try:  # from another thread, as a scrape reads the queue gauges
        families = await asyncio.to_thread(lambda: list(metrics.registry.collect()))
    finally:
        await broker.stop()
        await broker.close()
    return {f.name: f.type for f in families}


def series_in(expr: str) -> set[str]:
    """The series names a PromQL expression selects: what is left once strings, label
    matchers, ranges, label lists, functions, keywords and numbers are taken out."""
    rest = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    rest = re.sub(r"\{[^}]*\}", " ", rest)
    rest = re.sub(r"\[[^\]]*\]", " ", rest)
    rest = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", rest)
    names = set()
    for found in re.finditer(r"(?<![\w.$])[A-Za-z_:][\w:]*", rest):
        word = found.group(0)
        if word.lower() in KEYWORDS or rest[found.end():].lstrip().startswith("("):
            continue
        names.add(word)
    return names


def test_series_in_reads_names_past_labels_ranges_and_functions() -> None:
    expr = ('histogram_quantile(0.99, sum by (le, queue) (rate(a_seconds_bucket{queue=~"$q", '
            'x="by(y)"}[$__rate_interval]))) / on (queue) group_left b_total offset 5m '
            "> bool 1e3")
    assert series_in(expr) == {"a_seconds_bucket", "b_total"}


def _panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    found = []
    for p in dashboard["panels"]:
        found.append(p)
        found.extend(p.get("panels", ()))  # a collapsed row holds its panels
    return [p for p in found if p["type"] != "row"]


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def test_every_series_of_every_panel_is_one_sqlmq_exports(dashboard: dict[str, Any]) -> None:
    families = asyncio.run(_families())
    exported = {name + suffix: name for name, kind in families.items()
                for suffix in SUFFIXES[kind]}
    used: set[str] = set()
    unknown = []
    for panel in _panels(dashboard):
        assert panel["targets"], f"panel {panel['title']!r} has no query"
        for target in panel["targets"]:
            names = series_in(target["expr"])
            assert names, f"{panel['title']!r}: no series in {target['expr']!r}"
            unknown += [f"{panel['title']!r}: {n}" for n in sorted(names - set(exported))]
            used |= {exported[n] for n in names if n in exported}
    assert unknown == [], f"series sqlmq does not export: {unknown}"
    assert sorted(set(families) - used) == [], "metrics no panel shows"


def test_panels_read_the_chosen_data_source_queue_and_job(dashboard: dict[str, Any]) -> None:
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name in ("job", "queue"):
        assert variables[name]["multi"] and variables[name]["includeAll"]
        assert variables[name]["datasource"]["uid"] == "${datasource}"
    panels = _panels(dashboard)
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
    for panel in panels:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        for target in panel["targets"]:
            expr = target["expr"]
            assert 'job=~"$job"' in expr, f"{panel['title']!r} ignores the job: {expr}"
            if "queue" in expr and "sqlmq_leader" not in expr:
                assert "$queue" in expr, f"{panel['title']!r} ignores the queue: {expr}"
            for var in re.findall(r"\$\{?(\w+)", expr):
                assert var in variables or var in BUILTIN_VARIABLES, (panel["title"], var)
