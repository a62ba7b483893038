"""The Grafana dashboard: every query names a metric that /metrics exposes, and the chart
ships it, when asked, as a ConfigMap Grafana's sidecar loads."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import yaml

from scheduler.obs.metrics import KUBE_SCHEDULER_NAMES, Metrics
from tests.charts import render
from tests.charts.render import CHART, documents, helm

DASHBOARD = CHART / "dashboards" / "lattice.json"

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_MATCHERS = re.compile(r"\{[^}]*\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_LABEL_VALUES = re.compile(r"label_values\(([^,)]+)(?:,[^)]*)?\)")
"""Grafana's ``label_values(selector, label)``: only the selector names a metric."""
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_KEYWORDS = frozenset(
    {
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "offset",
        "bool",
        "and",
        "or",
        "unless",
        "inf",
        "nan",
    }
)


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: identifiers that are neither function
    or aggregation calls, label names (in matchers and groupings) nor keywords."""
    text = _STRING.sub('""', expr)
    text = _MATCHERS.sub(" ", text)
    text = _RANGE.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    names = set()
    for m in _IDENT.finditer(text):
        rest = text[m.end() :].lstrip()
        if rest.startswith("(") or m.group() in _KEYWORDS or m.group().startswith("$"):
            continue
        if m.start() > 0 and text[m.start() - 1] in "$.0123456789":
            continue  # a variable ($__rate_interval) or a number's exponent
        names.add(m.group())
    return names


def test_metric_names_are_found_in_promql() -> None:
    expr = (
        "histogram_quantile(0.99, sum by (le, plugin) (rate(scheduler_plugin_execution_"
        'duration_seconds_bucket{job=~"$job", plugin!="x"}[$__rate_interval]))) '
        "/ on (instance) group_left process_open_fds"
    )
    assert metric_names(expr) == {
        "scheduler_plugin_execution_duration_seconds_bucket",
        "process_open_fds",
    }


def exposed_names() -> set[str]:
    """Every sample name the registry can expose, including those of labelled metrics that
    have no series yet: ``_total`` for counters, ``_bucket/_sum/_count`` for histograms."""
    suffixes = {
        "counter": ("_total",),
        "histogram": ("_bucket", "_sum", "_count"),
        "gauge": ("",),
        "info": ("_info",),
    }
    names: set[str] = set()
    for family in Metrics.create().registry.collect():
        names.update(family.name + s for s in suffixes.get(family.type, ("",)))
        names.update(sample.name for sample in family.samples)
    return names


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))
    return out


def test_every_query_names_an_exposed_metric() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exposed = exposed_names()
    queries = [
        (panel["title"], target["expr"])
        for panel in panels(dashboard)
        for target in panel.get("targets", [])
    ]
    queries += [
        (f"variable {v['name']}", _LABEL_VALUES.sub(r"\1", v["definition"]))
        for v in dashboard["templating"]["list"]
        if v["type"] == "query"
    ]
    assert len(queries) >= 15
    used: set[str] = set()
    for title, expr in queries:
        names = metric_names(expr)
        assert names, f"{title}: no metric in {expr!r}"
        missing = names - exposed
        assert not missing, f"{title}: {sorted(missing)} not exposed by /metrics"
        used |= names
    # The point of kube-scheduler's names: the dashboard reads them.
    for name in KUBE_SCHEDULER_NAMES:
        assert any(u == name or u.startswith(name + "_") for u in used), name


def test_panels_are_laid_out_without_duplicate_ids() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in panels(dashboard)]
    assert len(ids) == len(set(ids))
    for panel in panels(dashboard):
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]


def test_off_by_default() -> None:
    assert not [s for s, _ in documents(render.render()) if s.endswith("dashboard.yaml")]


@pytest.mark.parametrize(
    ("values", "namespace"),
    [
        ([], "lattice-system"),
        (["--set", "dashboard.namespace=monitoring"], "monitoring"),
    ],
)
def test_shipped_as_a_configmap_for_the_grafana_sidecar(values: list[str], namespace: str) -> None:
    rendered = render.render("--set", "dashboard.enabled=true", *values)
    docs = [yaml.safe_load(t) for s, t in documents(rendered) if s.endswith("dashboard.yaml")]
    assert len(docs) == 1
    cm = docs[0]
    assert cm["kind"] == "ConfigMap"
    assert cm["metadata"]["namespace"] == namespace
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"]["lattice.json"]) == json.loads(DASHBOARD.read_text())
    # It falls in manifests/scheduler.yaml's folder, so a render with it still splits.
    assert "dashboard.yaml" in render.manifest_files(rendered)["scheduler.yaml"]


def test_helm_lint_with_the_dashboard() -> None:
    out = helm("lint", "--strict", str(CHART), "--set", "dashboard.enabled=true")
    assert "1 chart(s) linted, 0 chart(s) failed" in out
