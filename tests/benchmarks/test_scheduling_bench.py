"""The scheduling benchmark's pure parts: ratios, the printed table, the
placement of existing pods and the anti-affinity caps (no cluster)."""

from __future__ import annotations

import importlib.util
import math
from collections import Counter
from pathlib import Path

import pytest

import scheduler
from lattice_dev.benchmarks.common import precompile_lattice
from lattice_dev.benchmarks.scheduling import (
    KUBE,
    LATTICE,
    NULL,
    Result,
    existing_node_index,
    min_median_max,
    ratio,
    ratios,
    rotation,
    sizes,
    summaries,
    summary_table,
    table,
    whole_cpu_ms_per_pod,
)


def _r(
    workload: str, scheduler: str, run: int, pods_per_s: float, cpu: float, **kw: object
) -> Result:
    fields: dict[str, object] = {
        "pods": 100,
        "bound": 100,
        "existing": 50,
        "cpu_s": 3.0,
        "rss_mib": 200.0,
        "p50_ms": 10.0,
        "p99_ms": 40.0,
        "stream": 20,
        "stream_bound": 20,
    } | kw
    return Result(
        workload=workload,
        scheduler=scheduler,
        run=run,
        pods_per_s=pods_per_s,
        cpu_ms_per_pod=cpu,
        **fields,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(
    ("num", "den", "expected"),
    [
        (300.0, 150.0, 2.0),
        (75.0, 150.0, 0.5),
        (1.0, 0.0, math.nan),
        (math.nan, 3.0, math.nan),
        (3.0, math.nan, math.nan),
        (3.0, -1.0, math.nan),
    ],
)
def test_ratio(num: float, den: float, expected: float) -> None:
    got = ratio(num, den)
    assert (math.isnan(got) and math.isnan(expected)) or got == pytest.approx(expected)


def test_ratios_pair_each_workload_and_run() -> None:
    results = [
        _r("plain", KUBE, 1, 200.0, 2.0),
        _r("plain", LATTICE, 1, 100.0, 6.0, rss_mib=300.0, p99_ms=20.0),
        # run 2 ran Lattice first: pairing is by (workload, run), not order.
        _r("plain", LATTICE, 2, 300.0, 3.0),
        _r("plain", KUBE, 2, 150.0, 2.0),
        _r("spread", KUBE, 1, 60.0, 12.0),  # no Lattice figure: no ratio
    ]
    got = ratios(results)
    assert [(q.workload, q.run) for q in got] == [("plain", 1), ("plain", 2)]
    one, two = got
    assert one.pods_per_s == pytest.approx(0.5)
    assert one.cpu_per_pod == pytest.approx(3.0)
    assert one.rss == pytest.approx(1.5)
    assert one.p99 == pytest.approx(0.5)
    assert two.pods_per_s == pytest.approx(2.0)
    assert two.cpu_per_pod == pytest.approx(1.5)


def test_table_prints_every_run_ratios_range_and_warnings() -> None:
    results = [
        _r("plain", KUBE, 1, 200.0, 2.0, resumes=2),
        _r("plain", LATTICE, 1, 100.0, 6.0),
        _r("plain", LATTICE, 2, 300.0, 3.0),
        _r("plain", KUBE, 2, 150.0, 2.0),
        _r("anti-affinity", KUBE, 1, 50.0, 7.0, notes=["existing pods capped at 10"]),
        _r("anti-affinity", LATTICE, 1, math.nan, math.nan, bound=1, relists=1, relisted=30),
    ]
    out = table(results).splitlines()
    assert out[0].startswith("| workload")
    assert any(
        line.startswith("| plain ") and "| 2 " in line and "| 300.0 " in line for line in out
    )
    rows = [ln for ln in out if ln.startswith("| anti-affinity") and LATTICE in ln]
    assert rows
    assert "| 1/100 " in rows[0]
    assert "| n/a " in rows[0]
    assert "1 re-list(s), 30 pods timed late" in rows[0]
    assert any("2 resumes" in ln for ln in out if KUBE in ln)
    # Ratio rows: L/K per run.
    assert any(ln.startswith("| plain ") and "| 0.50x " in ln and "| 3.00x " in ln for ln in out)
    assert any(ln.startswith("| plain ") and "| 2.00x " in ln and "| 1.50x " in ln for ln in out)
    assert (
        "plain over 2 runs, min / median / max L/K: pods/s 0.50x / 1.25x / 2.00x, "
        "CPU/pod 1.50x / 2.25x / 3.00x" in out
    )
    assert not any(ln.startswith("anti-affinity over") for ln in out)
    assert (
        "WARNING: anti-affinity run 1 lattice: bound 1/100; "
        "watch re-listed 1x: 30 pods' times are the re-list's"
    ) in out
    assert "note: anti-affinity: existing pods capped at 10" in out
    assert not any(ln.startswith("WARNING: plain") for ln in out)


def test_whole_process_cpu_per_pod() -> None:
    # 4.8 CPU seconds when the 2000th pod was bound: start-up and sync included.
    assert whole_cpu_ms_per_pod(4.8, 2000) == pytest.approx(2.4)
    assert math.isnan(whole_cpu_ms_per_pod(4.8, 0))
    assert math.isnan(whole_cpu_ms_per_pod(math.nan, 10))


def test_min_median_max_leaves_out_missing_runs() -> None:
    got = min_median_max([424.5, math.nan, 400.0, 430.0])
    assert (got.low, got.median, got.high, got.n) == (400.0, 424.5, 430.0, 3)
    even = min_median_max([1.0, 2.0])
    assert even.median == pytest.approx(1.5)
    none = min_median_max([math.nan])
    assert none.n == 0
    assert math.isnan(none.median)


def test_rotation_puts_each_row_once_in_every_position() -> None:
    sides = (KUBE, LATTICE, NULL)
    orders = [rotation(sides, run) for run in (1, 2, 3)]
    assert orders[0] == sides
    assert orders[1] == (LATTICE, NULL, KUBE)
    assert rotation(sides, 4) == sides
    for position in range(3):
        assert {o[position] for o in orders} == set(sides)
    # Two rows: alternation, as before the floor.
    assert rotation((KUBE, LATTICE), 2) == (LATTICE, KUBE)


def _three_runs() -> list[Result]:
    rows = []
    for run, (k, lat, floor) in enumerate(
        [(400.0, 360.0, 450.0), (420.0, 380.0, 470.0), (500.0, 300.0, math.nan)], start=1
    ):
        rows += [
            _r("plain", KUBE, run, k, 1.5, cpu_whole_ms_per_pod=1.5 + run / 10),
            _r("plain", LATTICE, run, lat, 2.0, cpu_whole_ms_per_pod=2.4),
            _r("plain", NULL, run, floor, 0.5, cpu_whole_ms_per_pod=0.6),
        ]
    return rows


def test_summaries_pair_each_repeat_with_kube_and_the_floor() -> None:
    got = {q.scheduler: q for q in summaries(_three_runs())}
    assert list(got) == [KUBE, LATTICE, NULL]
    kube, lat, floor = got[KUBE], got[LATTICE], got[NULL]
    assert (kube.runs, kube.pods_per_s.median, kube.pods_per_s.high) == (3, 420.0, 500.0)
    assert (kube.vs_kube.low, kube.vs_kube.high) == (1.0, 1.0)
    # Lattice / kube per repeat: 0.9, 0.905, 0.6.
    assert lat.vs_kube.low == pytest.approx(0.6)
    assert lat.vs_kube.median == pytest.approx(0.9)
    assert lat.vs_kube.high == pytest.approx(380 / 420)
    # Of the floor: repeat 3 had no floor figure, so two repeats count.
    assert lat.of_floor.n == 2
    assert lat.of_floor.low == pytest.approx(0.8)
    assert lat.of_floor.high == pytest.approx(380 / 470)
    assert kube.of_floor.median == pytest.approx((400 / 450 + 420 / 470) / 2)
    assert floor.of_floor.median == pytest.approx(1.0)
    assert floor.pods_per_s.n == 2
    assert kube.cpu_whole.low == pytest.approx(1.6)
    assert kube.cpu_whole.high == pytest.approx(1.8)
    assert lat.cpu_window.median == pytest.approx(2.0)


def test_the_table_prints_the_floor_and_the_summary() -> None:
    results = _three_runs()
    out = table(results).splitlines()
    assert "of floor" in out[0]
    assert "CPU ms/pod whole" in out[0]
    run1 = [ln for ln in out if ln.startswith("| plain ") and "| 1 " in ln and LATTICE in ln]
    assert "| 0.80 " in run1[0]
    assert "| 2.40 " in run1[0]
    rats = ratios(results)
    assert rats[0].kube_of_floor == pytest.approx(400 / 450)
    assert rats[0].lattice_of_floor == pytest.approx(0.8)
    assert rats[0].cpu_whole_per_pod == pytest.approx(2.4 / 1.6)
    assert math.isnan(rats[2].lattice_of_floor)
    summary = summary_table(results)
    assert "summary over repeats (min / median / max):" in summary
    row = next(ln for ln in summary if ln.startswith("| plain ") and LATTICE in ln)
    assert "| 300.0 / 360.0 / 380.0 " in row
    assert "| 0.60x / 0.90x / 0.90x " in row
    assert "| 2.40 / 2.40 / 2.40 " in row
    assert summary_table([]) == []


@pytest.mark.parametrize("nodes", [1, 2, 3, 200, 1000, 2000, 5000])
@pytest.mark.parametrize("count", [0, 1, 7, 1000, 30000])
def test_existing_pods_are_balanced_by_zone_and_host(nodes: int, count: int) -> None:
    where = [existing_node_index(i, nodes) for i in range(count)]
    assert all(0 <= k < nodes for k in where)
    if nodes >= 3 and count:
        zones = Counter(k % 3 for k in where)
        assert max(zones.values()) - min(zones.get(z, 0) for z in range(3)) <= 1
    # The first `nodes` pods each get a node of their own: anti-affinity holds.
    first = where[:nodes]
    assert len(set(first)) == len(first)
    hosts = Counter(where)
    if hosts and count >= nodes:
        assert max(hosts.values()) - min(hosts.values()) <= 1 + count // nodes


@pytest.mark.parametrize(
    ("workload", "nodes", "pods", "stream", "existing", "expected"),
    [
        ("plain", 2000, 5000, 200, 1000, (5000, 200, 1000, 0)),
        ("topology-spread", 5000, 800, 200, 30000, (800, 200, 30000, 0)),
        ("anti-affinity", 2000, 800, 200, 1000, (800, 200, 1000, 0)),
        ("anti-affinity", 5000, 800, 200, 30000, (800, 200, 4000, 1)),
        ("anti-affinity", 200, 800, 200, 0, (200, 0, 0, 2)),
        ("anti-affinity", 200, 150, 20, 100, (150, 20, 30, 1)),
    ],
)
def test_sizes_cap_anti_affinity_at_one_pod_per_node(
    workload: str,
    nodes: int,
    pods: int,
    stream: int,
    existing: int,
    expected: tuple[int, int, int, int],
) -> None:
    got = sizes(workload, nodes=nodes, pods=pods, stream=stream, existing=existing)
    assert (got.measured, got.stream, got.existing, len(got.notes)) == expected
    assert workload != "anti-affinity" or got.measured + got.stream + got.existing <= nodes


def test_the_benchmarks_run_lattice_byte_compiled_as_the_image_does() -> None:
    """Where PYTHONDONTWRITEBYTECODE is set, a source tree is compiled at every start: the
    benchmarks compile it first, so a run's CPU is what a deployed (compileall'd) Lattice
    spends. Every module of the package then has its bytecode beside it, up to date."""
    package = Path(scheduler.__file__).parent
    precompile_lattice()
    sources = [p for p in package.rglob("*.py") if "__pycache__" not in p.parts]
    assert len(sources) > 100
    for source in sources:
        cached = Path(importlib.util.cache_from_source(str(source)))
        assert cached.exists(), source
        assert cached.stat().st_mtime >= source.stat().st_mtime, source
