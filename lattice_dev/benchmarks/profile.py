"""Where the CPU per pod goes in `lattice run`, on one benchmark workload: a cProfile breakdown.

Why: `just bench` says how much CPU a pod costs; before and after a rewrite (the intake,
say) we also need to say *where* it went, reproducibly, in one command.

How (the benchmark's own pieces, imported, not copied): a devcluster with ``--nodes`` kwok
nodes (a temporary one, or the one running in ``--state-dir`` / ``$LATTICE_STATE_DIR``,
started there if missing and kept), ``--existing`` pods of the ``--workload``'s shape (plain
by default; the benchmark's spread, affinity and anti-affinity pods otherwise) pre-bound with
the benchmark's placement, then `lattice run` from the benchmark's launcher, its argv wrapped
so that this module's ``_child`` entry runs ``scheduler.cli`` with cProfile armed but off.
Only measured windows are profiled, so start-up (imports, the initial list, kopf's first
listing) does not pollute the per-pod figures:

1. Lattice reports Ready and binds a sentinel pod (so kopf has listed and handed over every
   pod), and its CPU settles;
2. background window (``--idle`` s, no pods): what the cluster costs Lattice with nothing
   to schedule (kwok's node heartbeats, housekeeping ticks), profiled on its own;
3. pod window: SIGUSR1 turns a fresh profiler on and the window's CPU clock
   (``/proc/<pid>/stat``) starts; ``--pods`` pods of the workload are created (32 calls in
   flight, or ``--rate`` pods/s); once every pod is bound (the benchmark's watcher) and Running
   (kwok), a sentinel pod is created and bound too: the watch delivers in order, so Lattice
   has then seen every pod event (a busy API server delivers some long after the binding);
   once Lattice is back to its background CPU rate, SIGUSR2 stops the profiler and writes
   the ``.prof`` (and ``.json``: the run's figures, for ``--report``);
4. SIGTERM stops Lattice in order (the profiles are already on disk either way).

``--backlog`` measures as `just bench` does instead: the pods are created while no Lattice
runs, then Lattice starts (no sentinel, no background window), and the pod window runs from
the first binding the benchmark's watch sees to the last one (SIGUSR1 and SIGUSR2 sent from
the watch's callback): the benchmark's CPU column, per pod bound after the first. That
window holds the first cycles of the workload's shape, which a short run such as the
200-pod anti-affinity one is dominated by, but not the start-up before the first binding.
With ``--profile-from start`` the profile covers the process from its start instead (the
CPU figure stays the window's).

CPU ms/pod is the pod window's process CPU (user + system, every thread) over the pods
bound; "bg" is the background window's rate times the pod window's length, and "net" the
difference: the part of the cost that the pods caused, comparable between runs whose
throughput (so window length, so share of heartbeats) differs. It assumes the background
keeps its rate under load, which is only roughly true (kopf coalesces a lagging object's
events, so a busy Lattice handles fewer node heartbeats; the housekeeping tick stretches):
with a large background (thousands of nodes) "net" is a lower bound, per area even
negative. The default timer is
main-thread CPU time (``time.thread_time``), so time the process spends preempted on a busy
2-core machine is not charged to whatever function ran; ``--timer wall`` is cProfile's
usual clock (cheaper per call; idle epoll time then shows as its own area). Profiling
inflates every figure (each Python call pays for the hook, the CPU timer more so):
``--profiler off`` runs the same windows unprofiled, for the honest CPU ms/pod.

Areas are decided by each function's module path (cProfile records file names), and for
this repository's functions by the enclosing ``Class.function`` (read from the source).
Built-in and standard-library helpers with no area of their own (``copy.deepcopy``,
``isinstance``, dataclass-generated methods, numpy ...) are charged to their callers'
areas, split by the self time each caller edge recorded, so "kopf" includes the deep copies
kopf makes. "self" columns add up to the profiled total; "cum" is the time under calls into
the area from outside it (an area re-entered through another, e.g. the event loop, counts
its nested part again), so cum columns do not add up.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import contextlib
import cProfile
import functools
import json
import marshal
import math
import os
import runpy
import signal
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, cast

from kubernetes_asyncio import client

from lattice_dev.benchmarks.common import (
    REPO,
    Watcher,
    apply_crds,
    create_pods,
    start_lattice,
    wait_all,
    wait_lattice_ready,
)
from lattice_dev.benchmarks.scheduling import (
    LATTICE,
    WORKLOADS,
    Bench,
    cpu_seconds,
    peak_rss_mib,
    plain,
    sizes,
)
from lattice_dev.devcluster.cluster import ClusterConfig, DevCluster
from lattice_dev.devcluster.kube import api_client

CHILD = "_child"
"""First argument of the wrapped `lattice run` (see :func:`_child`)."""

Key = tuple[str, int, str]
"""A function in a cProfile dump: (file name, first line, function name)."""
Edge = tuple[int, int, float, float]
"""One caller edge: primitive calls, calls, self time, cumulative time."""
Entry = tuple[int, int, float, float, dict[Key, Edge]]
"""One function: primitive calls, calls, self time, cumulative time, callers."""
Stats = dict[Key, Entry]

# -- areas: pure ---------------------------------------------------------------------

AREAS: tuple[tuple[str, str], ...] = (
    ("kopf", "kopf machinery (watch streams, per-object queues, handler invocation)"),
    ("json", "JSON parsing and dumping (json, orjson)"),
    ("http", "HTTP client: kubernetes_asyncio, aiohttp, multidict/yarl, TLS, sockets"),
    ("event-loop", "event-loop overhead (asyncio, selectors, uvloop)"),
    ("intake", "intake: control.watch (kopf handlers), control.intake, control.feed"),
    ("shell", "scheduler shell: event handlers, queue, loop (control.scheduler, queue ...)"),
    ("cycle", "scheduling cycle (scheduler.core framework and plugins, solver, predict)"),
    ("cache", "cache/snapshot/graph (control.cache, lifecycle, core.snapshot, graph)"),
    ("model", "object decoding (scheduler.model)"),
    ("writes", "binding and writes (control.kubeio, reporter, ratelimit)"),
    ("logging", "logging (structlog, stdlib logging, obs.logging)"),
    ("metrics", "metrics (prometheus_client, obs.metrics)"),
    ("housekeeping", "housekeeping/tick/status (control.app, status, leader, server, tick)"),
    ("other", "everything else (helpers no area claims, the profiler's own handlers)"),
    ("idle", "idle: waiting in epoll (wall timer only)"),
)
AREA_NAMES = tuple(name for name, _ in AREAS)

PATH_RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("kopf", ("kopf/",)),
    ("json", ("stdlib:json/", "orjson/")),
    (
        "http",
        (
            "kubernetes_asyncio/",
            "aiohttp/",
            "multidict/",
            "yarl/",
            "propcache/",
            "aiohappyeyeballs/",
            "aiosignal/",
            "frozenlist/",
            "certifi/",
            "stdlib:ssl.py",
            "stdlib:socket.py",
            "stdlib:asyncio/sslproto.py",
            "stdlib:http/",
            "stdlib:urllib/",
            "stdlib:email/",
        ),
    ),
    ("event-loop", ("stdlib:asyncio/", "stdlib:selectors.py", "uvloop/")),
    (
        "intake",
        (
            "scheduler/control/watch.py",
            "scheduler/control/intake.py",
            "scheduler/control/feed.py",
        ),
    ),
    (
        "cache",
        (
            "scheduler/control/cache.py",
            "scheduler/control/lifecycle.py",
            "scheduler/core/snapshot.py",
            "scheduler/graph/",
        ),
    ),
    ("cycle", ("scheduler/core/", "scheduler/solver/", "scheduler/predict/")),
    ("model", ("scheduler/model/",)),
    (
        "writes",
        (
            "scheduler/control/kubeio.py",
            "scheduler/control/reporter.py",
            "scheduler/control/ratelimit.py",
        ),
    ),
    ("logging", ("structlog/", "stdlib:logging/", "scheduler/obs/logging.py")),
    ("metrics", ("prometheus_client/", "scheduler/obs/metrics.py")),
    (
        "housekeeping",
        (
            "scheduler/control/app.py",
            "scheduler/control/status.py",
            "scheduler/control/leader.py",
            "scheduler/control/server.py",
            "scheduler/control/settings.py",
            "scheduler/control/kubeconfig.py",
        ),
    ),
    ("shell", ("scheduler/control/",)),
    ("other", ("scheduler/",)),
)
"""First match wins, on :func:`where`'s name of the file."""

SCOPE_RULES: Mapping[tuple[str, str], str | None] = {
    # control.scheduler's plugin timers wrap the core's plugins: part of the cycle.
    ("scheduler/control/scheduler.py", "_TimedPlugin"): "cycle",
    ("scheduler/control/scheduler.py", "timed"): "cycle",
    ("scheduler/control/scheduler.py", "Scheduler.tick"): "housekeeping",
    ("scheduler/control/scheduler.py", "Scheduler.load_status_counts"): "housekeeping",
    # Asked per node by the cycle and by the load-status gauge alike: its callers' area.
    ("scheduler/predict/predictor.py", "LoadPredictor.status"): None,
}
"""Scopes (``Class``, ``Class.method``; nested functions and generator expressions
included) whose file alone does not say their area (None: charged to the callers, as
helpers are); checked before :data:`PATH_RULES`."""

BUILTIN_RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("json", ("orjson.", "_json.")),
    ("http", ("_ssl.", "_socket.")),
    ("event-loop", ("uvloop.",)),
)
"""Built-ins (file ``~``) by a part of their name; the rest are charged to their callers."""

EPOLL = "select.epoll"

_STDLIB = sysconfig.get_paths()["stdlib"].rstrip("/") + "/"
_REPO = str(REPO).rstrip("/") + "/"


def where(filename: str) -> str:
    """A file name as the rules see it: ``kopf/...`` for an installed package,
    ``scheduler/...`` for this repository, ``stdlib:json/...`` for the standard library,
    ``~`` for built-ins, anything else (``<string>``, ``<frozen ...>``) as it is."""
    if "site-packages/" in filename:
        return filename.rsplit("site-packages/", 1)[1]
    if filename.startswith(_REPO):
        return filename[len(_REPO) :]
    if filename.startswith(_STDLIB):
        return "stdlib:" + filename[len(_STDLIB) :]
    if "/scheduler/" in filename:  # another checkout of the repository
        return "scheduler/" + filename.rsplit("/scheduler/", 1)[1]
    return filename


@functools.cache
def _scopes(filename: str) -> tuple[tuple[int, int, str], ...]:
    """(first line, last line, ``Class.function``) of every def and class in a file,
    outermost first; empty if the file cannot be read (a report on another machine)."""
    try:
        tree = ast.parse(Path(filename).read_text())
    except (OSError, SyntaxError, ValueError):
        return ()
    found: list[tuple[int, int, str]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}"
                first = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                found.append((first, child.end_lineno or child.lineno, name))
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    return tuple(found)


def scope(key: Key) -> str:
    """``Class.method`` for a function of this repository (``Class.method.<genexpr>`` for
    what it nests), else the bare function name."""
    filename, line, name = key
    inner = ""
    for first, last, qual in _scopes(filename) if where(filename).startswith("scheduler/") else ():
        if first <= line <= last:
            inner = qual  # later entries are nested deeper
    if not inner:
        return name
    return inner if inner.rsplit(".", 1)[-1] == name else f"{inner}.{name}"


def own_area(key: Key, *, wall: bool) -> str | None:
    """The area a function belongs to by itself; None for helpers charged to their callers."""
    filename, _, name = key
    path = where(filename)
    if path == "~":
        if EPOLL in name:
            return "idle" if wall else "event-loop"
        for area, parts in BUILTIN_RULES:
            if any(p in name for p in parts):
                return area
        return None
    if path.startswith("scheduler/"):
        qual = scope(key)
        for (rule_path, rule_scope), scoped in SCOPE_RULES.items():
            if path == rule_path and (qual == rule_scope or qual.startswith(rule_scope + ".")):
                return scoped
    for area, prefixes in PATH_RULES:
        if path.startswith(prefixes):
            return area
    return None


def _weights(callers: Mapping[Key, Edge], field: int) -> list[tuple[Key, float]]:
    """The caller edges as fractions of one of their times (of their call counts if
    that time is zero throughout)."""
    edges = [(c, e[field]) for c, e in callers.items() if e[field] > 0]
    edges = edges or [(c, float(e[1])) for c, e in callers.items() if e[1] > 0]
    total = sum(w for _, w in edges)
    return [(c, w / total) for c, w in edges] if total > 0 else []


def _mix(
    weights: list[tuple[Key, float]],
    fixed: Mapping[Key, Mapping[str, float]],
    upstream: Mapping[Key, Mapping[str, float]],
) -> dict[str, float]:
    mix: dict[str, float] = {}
    for caller, w in weights:
        for area, p in (fixed.get(caller) or upstream.get(caller) or {}).items():
            mix[area] = mix.get(area, 0.0) + w * p
    return mix


def _enclosing(stats: Stats) -> dict[Key, Key]:
    """Generator expressions and comprehensions -> the function of the same file they are
    written in (the nearest one starting above them). Their recorded caller is whoever
    iterates them, often a built-in shared by every area (``sum``, ``any``), which would
    lose where they come from."""
    by_file: dict[str, list[Key]] = {}
    for k in stats:
        if k[0] != "~" and not k[2].startswith("<"):
            by_file.setdefault(k[0], []).append(k)
    out: dict[Key, Key] = {}
    for k in stats:
        if k[0] == "~" or not k[2].startswith("<") or k[2] == "<module>":
            continue
        above = [f for f in by_file.get(k[0], []) if f[1] <= k[1]]
        if above:
            out[k] = max(above, key=lambda f: f[1])
    return out


def shares(stats: Stats, *, wall: bool, rounds: int = 500) -> dict[Key, dict[str, float]]:
    """Each function's self time split over areas (fractions adding up to 1).

    A helper's self time is split over its callers by the self time it spent under each
    (cProfile records that per edge); a caller that is a helper too passes its share on
    by where *its* cumulative time came from, up to functions with an area, so a Counter
    built by a housekeeping function is housekeeping however many stdlib frames lie
    between (recursion such as deepcopy's settles by iteration). A helper's generator
    expression belongs to the function it is written in (:func:`_enclosing`). What
    reaches no area is "other"."""
    own = {k: own_area(k, wall=wall) for k in stats}
    fixed = {k: {a: 1.0} for k, a in own.items() if a is not None}
    helpers = [k for k, a in own.items() if a is None]
    parents = _enclosing(stats)
    by_cum = {k: [(parents[k], 1.0)] if k in parents else _weights(stats[k][4], 3) for k in helpers}
    upstream: dict[Key, dict[str, float]] = {k: {} for k in helpers}
    for _ in range(rounds):
        nxt = {k: _mix(by_cum[k], fixed, upstream) for k in helpers}
        moved = max(
            (abs(sum(nxt[k].values()) - sum(upstream[k].values())) for k in helpers),
            default=0.0,
        )
        upstream = nxt
        if moved < 1e-9:
            break
    out: dict[Key, dict[str, float]] = dict(fixed)
    for k in helpers:
        mix = _mix(by_cum[k] if k in parents else _weights(stats[k][4], 2), fixed, upstream)
        left = 1.0 - sum(mix.values())
        if left > 1e-9:
            mix["other"] = mix.get("other", 0.0) + left
        out[k] = mix
    return out


@dataclass(frozen=True)
class AreaRow:
    area: str
    self_s: float
    cum_s: float
    bg_s: float = math.nan
    """The background window's self time of the area, scaled to the pod window's length."""


@dataclass(frozen=True)
class FunctionRow:
    key: Key
    calls: int
    self_s: float
    cum_s: float
    area: str
    """Its own area, or ``->area`` for a helper charged mostly to that one."""
    bg_s: float = math.nan


@dataclass(frozen=True)
class Breakdown:
    total_s: float
    """Sum of every function's self time: the profiled time of the window."""
    areas: list[AreaRow]
    top: list[FunctionRow]
    calls: int
    bg_total_s: float = math.nan


def _resolved(share: Mapping[str, float]) -> str:
    return max(share.items(), key=lambda item: item[1])[0] if share else "other"


def _self_by_area(stats: Stats, split: Mapping[Key, Mapping[str, float]]) -> dict[str, float]:
    out = dict.fromkeys(AREA_NAMES, 0.0)
    for k, entry in stats.items():
        for area, p in split[k].items():
            out[area] += entry[2] * p
    return out


def breakdown(
    stats: Stats,
    *,
    wall: bool,
    top: int = 25,
    background: Stats | None = None,
    scale: float = 1.0,
) -> Breakdown:
    """The areas' self and cumulative seconds and the ``top`` functions by self time;
    with a ``background`` profile, its self times times ``scale`` beside them."""
    split = shares(stats, wall=wall)
    resolved = {k: _resolved(s) for k, s in split.items()}
    self_s = _self_by_area(stats, split)
    cum_s = dict.fromkeys(AREA_NAMES, 0.0)
    for k, (_, _, _, ct, callers) in stats.items():
        area = resolved[k]
        if not callers:
            cum_s[area] += ct
            continue
        if own_area(k, wall=wall) is None:
            continue  # a helper's time is inside its callers' cum already
        cum_s[area] += sum(e[3] for c, e in callers.items() if resolved.get(c) != area)
    bg = dict.fromkeys(AREA_NAMES, math.nan)
    if background is not None:
        raw = _self_by_area(background, shares(background, wall=wall))
        bg = {a: v * scale for a, v in raw.items()}
    rows = [
        AreaRow(a, self_s[a], cum_s[a], bg[a])
        for a in AREA_NAMES
        if self_s[a] or cum_s[a] or (background is not None and bg[a])
    ]
    rows.sort(key=lambda r: r.self_s, reverse=True)
    ranked = sorted(stats.items(), key=lambda item: item[1][2], reverse=True)[:top]
    own = {k: own_area(k, wall=wall) for k, _ in ranked}
    functions = [
        FunctionRow(
            k,
            e[1],
            e[2],
            e[3],
            own[k] or "->" + resolved[k],
            math.nan if background is None else background.get(k, (0, 0, 0.0))[2] * scale,
        )
        for k, e in ranked
    ]
    return Breakdown(
        total_s=sum(e[2] for e in stats.values()),
        areas=rows,
        top=functions,
        calls=sum(e[1] for e in stats.values()),
        bg_total_s=(
            math.nan if background is None else sum(e[2] for e in background.values()) * scale
        ),
    )


def load_stats(path: Path) -> Stats:
    """A ``.prof`` file as cProfile wrote it (a marshalled dict, what pstats reads)."""
    with path.open("rb") as f:
        return cast(Stats, marshal.load(f))


def _ms(seconds: float, pods: int) -> str:
    return f"{seconds * 1000 / pods:.3f}" if pods > 0 and not math.isnan(seconds) else "n/a"


def _markdown(rows: list[tuple[str, ...]], right: frozenset[int] = frozenset()) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]

    def cell(i: int, text: str) -> str:
        return text.rjust(widths[i]) if i in right else text.ljust(widths[i])

    lines = ["| " + " | ".join(cell(i, c) for i, c in enumerate(r)) + " |" for r in rows]
    lines.insert(1, "| " + " | ".join("-" * w for w in widths) + " |")
    return lines


def function_label(key: Key) -> str:
    """``kopf/_core/.../queueing.py:123(worker)``, ``scheduler/...:12(Class.method)``, or
    the built-in's own name."""
    filename, line, _ = key
    path = where(filename)
    if path == "~":
        return key[2]
    return f"{path.removeprefix('stdlib:')}:{line}({scope(key)})"


def render(b: Breakdown, pods: int, *, wall: bool, honest_ms: float = math.nan) -> str:
    """The area table (self, background, net, cum; seconds and ms/pod), the legend, the
    top functions. ``honest_ms``: an unprofiled run's CPU ms/pod, to which each area's
    share of the profiled time is scaled (the profiler inflates every figure)."""
    with_bg = not math.isnan(b.bg_total_s)
    with_honest = not math.isnan(honest_ms)
    idle = sum(r.self_s for r in b.areas if r.area == "idle")
    busy = b.total_s - idle
    head = ["area", "self s", "self ms/pod"]
    head += ["bg ms/pod", "net ms/pod"] if with_bg else []
    head += ["self %", *(["~unprofiled ms/pod"] if with_honest else [])]
    head += ["cum s", "cum ms/pod"]
    rows: list[tuple[str, ...]] = [tuple(head)]
    for r in b.areas:
        share = r.self_s / busy if busy > 0 and r.area != "idle" else math.nan
        cells = [r.area, f"{r.self_s:.2f}", _ms(r.self_s, pods)]
        if with_bg:
            cells += (
                ["", ""] if r.area == "idle" else [_ms(r.bg_s, pods), _ms(r.self_s - r.bg_s, pods)]
            )
        cells += ["" if math.isnan(share) else f"{100 * share:.1f}"]
        cells += ["" if math.isnan(share) else f"{share * honest_ms:.3f}"] if with_honest else []
        cells += [f"{r.cum_s:.2f}", _ms(r.cum_s, pods)]
        rows.append(tuple(cells))
    bg_busy = b.bg_total_s - sum(r.bg_s for r in b.areas if r.area == "idle")
    total = ["total (not idle)", f"{busy:.2f}", _ms(busy, pods)]
    total += [_ms(bg_busy, pods), _ms(busy - bg_busy, pods)] if with_bg else []
    total += ["100.0", *([f"{honest_ms:.3f}"] if with_honest else [])]
    rows.append((*total, "", ""))
    clock = "wall-clock" if wall else "main-thread CPU"
    calls = f"{b.calls:,} calls" + (f", {b.calls / pods:,.0f} per pod" if pods > 0 else "")
    out = [f"Where the {clock} time of the pod window went ({calls}):", ""]
    out += _markdown(rows, frozenset(range(1, len(head))))
    out += [""]
    out += [f"  {name:<13} {what}" for name, what in AREAS if name != "idle" or wall]
    if with_bg:
        out += [
            "  bg: the background window's time (no pods) scaled to the pod window's length;"
            " net = self - bg",
            "  (a lower bound: under load fewer heartbeats get handled, so bg overestimates)",
        ]
    if with_honest:
        out += [
            "  ~unprofiled: the area's share of the profiled time x the unprofiled baseline's"
            " CPU ms/pod (gross, background included)"
        ]
    out += [
        "",
        f"Top {len(b.top)} functions by self time (tottime); '->area': a helper charged to "
        "its callers, mostly that area:",
        "",
    ]
    fhead = ["self s", "self ms/pod", *(["bg ms/pod"] if with_bg else [])]
    fhead += ["cum s", "calls", "calls/pod", "area", "function"]
    frows: list[tuple[str, ...]] = [tuple(fhead)]
    for f in b.top:
        cells = [f"{f.self_s:.2f}", _ms(f.self_s, pods)]
        cells += [_ms(f.bg_s, pods)] if with_bg else []
        cells += [
            f"{f.cum_s:.2f}",
            str(f.calls),
            f"{f.calls / pods:.1f}" if pods > 0 else "n/a",
            f.area,
            function_label(f.key),
        ]
        frows.append(tuple(cells))
    out += _markdown(frows, frozenset(range(len(fhead) - 2)))
    return "\n".join(out)


# -- the wrapped `lattice run` -----------------------------------------------------------


def _child(argv: list[str]) -> None:
    """``_child OUT[,OUT...] TIMER FROM -m MODULE ARGS...``: run MODULE as ``python -m``
    would; each SIGUSR1 starts a fresh profiler (the first one at once if FROM is
    ``start``) that the next SIGUSR2 stops and writes to the next OUT, as does the end
    of the process if that SIGUSR2 never came."""
    outs, timer, start, dash_m, module, *args = argv
    if dash_m != "-m":
        raise SystemExit(f"{CHILD}: expected -m MODULE, got {dash_m!r}")
    pending = outs.split(",")
    running: list[cProfile.Profile] = []

    def begin(_sig: int = 0, _frame: Any = None) -> None:
        if not running and pending:
            running.append(
                cProfile.Profile(time.thread_time) if timer == "cpu" else cProfile.Profile()
            )
            running[0].enable()

    def write(_sig: int = 0, _frame: Any = None) -> None:
        if running:
            prof = running.pop()
            prof.disable()
            out = pending.pop(0)
            prof.dump_stats(f"{out}.tmp")
            os.replace(f"{out}.tmp", out)  # the parent waits for OUT: never a partial one

    signal.signal(signal.SIGUSR1, begin)
    signal.signal(signal.SIGUSR2, write)
    if start == "start":
        begin()
    sys.argv = [module, *args]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    finally:
        write()


class _ProfiledCluster(DevCluster):
    """The same cluster, but a process it starts runs under :func:`_child`: the
    benchmark's launcher (its flags) is reused as it is, only the argv is wrapped."""

    def __init__(self, state_dir: Path, outs: list[Path], timer: str, start: str) -> None:
        super().__init__(state_dir)
        self.wrap = [",".join(str(p) for p in outs), timer, start]

    def start_process(self, name: str, argv: list[str], marker: str) -> int:
        python, *rest = argv
        wrapped = [python, "-m", "lattice_dev.benchmarks.profile", CHILD, *self.wrap, *rest]
        return super().start_process(name, wrapped, marker)


# -- the run -------------------------------------------------------------------------


@dataclass
class Run:
    """A run's figures; written beside the profile (``.json``) for ``--report``."""

    nodes: int
    existing: int
    pods: int
    profiler: str
    timer: str
    profile_from: str
    workload: str = "plain"
    """The benchmark workload measured (:data:`~lattice_dev.benchmarks.scheduling.WORKLOADS`);
    the sentinel pods are plain whatever it is."""
    bound: int = 0
    watch: str = ""
    create_s: float = math.nan
    """From the first create call to the last create answer."""
    bind_s: float = math.nan
    """From the first create call to the last binding seen."""
    window_s: float = math.nan
    window_cpu_s: float = math.nan
    tail_s: float = math.nan
    """Of the window: from the last binding until Lattice had seen the last pod event
    (kwok's Running) and was back to its background rate."""
    idle_s: float = math.nan
    idle_cpu_s: float = math.nan
    settle_s: float = math.nan
    total_cpu_s: float = math.nan
    rss_mib: float = math.nan
    exit: str = ""
    background: str = ""
    """The background window's profile, if any."""
    backlog: bool = False
    """The pods created before Lattice started; the window is first to last binding, and
    per-pod figures count the pods bound after the first (the benchmark's CPU ms/pod)."""
    baseline_ms: float = math.nan
    """``--baseline``: the unprofiled run's CPU ms/pod in its pod window."""
    baseline_bg_ms: float = math.nan
    baseline_pods_s: float = math.nan

    @property
    def pods_in_window(self) -> int:
        return max(self.bound - 1, 0) if self.backlog else self.bound

    @property
    def pods_s(self) -> float:
        """Pods bound per second of :attr:`bind_s`."""
        return self.pods_in_window / self.bind_s if self.bind_s > 0 else math.nan

    @property
    def cpu_ms(self) -> float:
        """CPU ms per pod bound in the pod window."""
        n = self.pods_in_window
        return self.window_cpu_s * 1000 / n if n else math.nan

    @property
    def bg_ms(self) -> float:
        """The background rate over the pod window's length, per pod bound."""
        return self.idle_rate * self.window_s * 1000 / self.bound if self.bound else math.nan

    @property
    def idle_rate(self) -> float:
        """CPU s per s with no pods (the background window), NaN without one."""
        return self.idle_cpu_s / self.idle_s if self.idle_s > 0 else math.nan


async def wait_idle(
    pid: int, *, within: float, quiet: float = 0.05, step: float = 1.0, times: int = 2
) -> float:
    """Until the process used at most ``quiet`` CPU seconds per second, ``times`` steps
    of ``step`` s in a row; the seconds it took (``within`` at most)."""
    started = time.monotonic()
    calm = 0
    last = cpu_seconds(pid)
    while time.monotonic() - started < within:
        await asyncio.sleep(step)
        now = cpu_seconds(pid)
        calm = calm + 1 if now - last <= quiet * step else 0
        last = now
        if calm >= times:
            break
    return time.monotonic() - started


def _written(path: Path, pid: int) -> bool | None:
    """True once ``path`` exists; False once the process is gone without it; else None."""
    if path.exists():
        return True
    return None if Path(f"/proc/{pid}").exists() else path.exists()


async def _wait_file(path: Path, pid: int, within: float = 120.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        done = _written(path, pid)
        if done is not None:
            return done
        await asyncio.sleep(0.2)
    return False


def _reap(pid: int, *, block: bool) -> tuple[str, float] | None:
    """How our child ended and its life's CPU seconds (its rusage), None while it runs."""
    try:
        got, status, usage = os.wait4(pid, 0 if block else os.WNOHANG)
    except ChildProcessError:
        return "already reaped", math.nan
    if not got:
        return None
    how = (
        f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
        if os.WIFSIGNALED(status)
        else f"exit code {os.waitstatus_to_exitcode(status)}"
    )
    return how, usage.ru_utime + usage.ru_stime


async def _stop(pid: int, within: float = 60.0) -> tuple[str, float]:
    """SIGTERM and wait, reaping it ourselves (which gives its rusage): how it ended, and
    its whole life's CPU seconds."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    started = time.monotonic()
    while time.monotonic() - started < within:
        ended = _reap(pid, block=False)
        if ended is not None:
            return f"{ended[0]} {time.monotonic() - started:.1f}s after SIGTERM", ended[1]
        await asyncio.sleep(0.1)
    os.kill(pid, signal.SIGKILL)
    how, cpu = _reap(pid, block=True) or ("?", math.nan)
    return f"{how}: SIGKILL after {within:.0f}s without exiting", cpu


class Session:
    """One `lattice run` on a running cluster: the windows of the module docstring."""

    def __init__(
        self,
        cluster: DevCluster,
        args: argparse.Namespace,
        out: Path,
        bg_out: Path | None,
        *,
        profiled: bool,
    ) -> None:
        self.cluster = cluster
        self.args = args
        self.out = out
        self.bg_out = bg_out if profiled else None
        self.profiled = profiled
        self.run = Run(
            nodes=args.nodes,
            existing=args.existing,
            pods=args.pods,
            profiler=args.profiler if profiled else "off",
            timer=args.timer,
            profile_from=args.profile_from,
            workload=args.workload,
            backlog=args.backlog,
            background=str(self.bg_out) if self.bg_out is not None else "",
        )
        self.pid = 0
        self.marks: dict[str, float] = {}
        """``--backlog``: the process CPU and time at the first and the last binding."""

    async def __call__(self) -> Run:
        args = self.args
        async with api_client(self.cluster.kubeconfig) as api:
            bench = Bench(self.cluster, api, args)
            await bench.configure_lattice()
            core = client.CoreV1Api(api)
            ns = f"profile-{os.getpid()}-{int(time.time())}"
            await core.create_namespace(cast(client.V1Namespace, {"metadata": {"name": ns}}))
            try:
                await bench.place_existing(ns, WORKLOADS[args.workload], LATTICE, args.existing)
                names = [f"p-{i}" for i in range(args.pods)]
                watcher = Watcher(api, ns, self._on_bound(set(names)))
                watcher.start()
                try:
                    await watcher.started.wait()
                    await self._lattice(api, bench, ns, names, watcher)
                finally:
                    await watcher.stop()
                self.run.watch = watcher.summary(set(names))
            finally:
                with contextlib.suppress(Exception):
                    await bench._clear(ns)
        return self.run

    def _on_bound(self, names: set[str]) -> Callable[[str, str, float], None]:
        marks, seen = self.marks, set[str]()

        def on_bound(name: str, _node: str, _now: float) -> None:
            if name not in names or not self.pid or name in seen:
                return
            seen.add(name)
            if not self.args.backlog:
                return
            if len(seen) == 1:
                if self.args.profile_from != "start":
                    self._signal(signal.SIGUSR1)
                marks["first"], marks["t_first"] = cpu_seconds(self.pid), time.monotonic()
            if len(seen) == len(names):
                marks["last"], marks["t_last"] = cpu_seconds(self.pid), time.monotonic()
                self._signal(signal.SIGUSR2)

        return on_bound

    def _signal(self, sig: signal.Signals) -> None:
        if self.profiled:
            os.kill(self.pid, sig)

    async def _lattice(
        self, api: client.ApiClient, bench: Bench, ns: str, names: list[str], watcher: Watcher
    ) -> None:
        args, run = self.args, self.run
        self.cluster.stop_component(LATTICE)  # left over by an interrupted run on a kept cluster
        outs = [p for p in (self.bg_out, self.out) if p is not None]
        launcher = (
            _ProfiledCluster(self.cluster.state_dir, outs, args.timer, args.profile_from)
            if self.profiled
            else self.cluster
        )
        make = WORKLOADS[args.workload]
        bodies = [make(name, LATTICE) for name in names]
        if args.backlog:
            await self._backlog(api, bench, ns, names, bodies, watcher, launcher)
            return
        started = time.time()
        self.pid = pid = start_lattice(launcher)
        try:
            await wait_lattice_ready(client.CustomObjectsApi(api), started)
            # The sentinel's binding proves kopf has listed (and handed over) every pod;
            # the idle wait lets the rest of the start-up work drain.
            await self._sentinel(api, ns, watcher, "sentinel-start")
            run.settle_s = await wait_idle(pid, within=args.settle, quiet=0.15)
            print(f"  lattice (pid {pid}) Ready, settled {run.settle_s:.0f}s later", flush=True)
            if self.bg_out is not None or (not self.profiled and args.idle > 0):
                await self._background()
            cpu0, t0 = cpu_seconds(pid), time.monotonic()
            if args.profile_from == "start":
                cpu0 = 0.0
            else:
                self._signal(signal.SIGUSR1)
            print(f"  pod window: creating {len(names)} pods", flush=True)
            sent = await create_pods(client.CoreV1Api(api), ns, bodies, rate=args.rate)
            run.create_s = time.monotonic() - t0
            await self._bound_and_done(api, bench, ns, names, sent, watcher, cpu0, t0)
        finally:
            run.exit, run.total_cpu_s = await _stop(pid)
            self.cluster.stop_component(LATTICE)  # forget it (it no longer runs)

    async def _backlog(
        self,
        api: client.ApiClient,
        bench: Bench,
        ns: str,
        names: list[str],
        bodies: list[dict[str, Any]],
        watcher: Watcher,
        launcher: DevCluster,
    ) -> None:
        """``--backlog``: the pods first, then Lattice; the window is the bindings'."""
        args, run = self.args, self.run
        t0 = time.monotonic()
        print(f"  backlog: creating {len(names)} pods, then lattice", flush=True)
        await create_pods(client.CoreV1Api(api), ns, bodies, rate=args.rate)
        run.create_s = time.monotonic() - t0
        self.pid = pid = start_lattice(launcher)
        try:
            unbound = await wait_all(watcher, set(names), args.timeout)
            run.bound = len(names) - unbound
            times = [watcher.bound[n] for n in names if n in watcher.bound]
            if times:
                run.bind_s = max(times) - min(times)
            marks = self.marks
            if "last" not in marks:  # not every pod bound: the window ends now
                marks["last"], marks["t_last"] = cpu_seconds(pid), time.monotonic()
                self._signal(signal.SIGUSR2)
            if "first" in marks:
                run.window_cpu_s = marks["last"] - marks["first"]
                run.window_s = marks["t_last"] - marks["t_first"]
            run.rss_mib = peak_rss_mib(pid)
            if self.profiled and not await _wait_file(self.out, pid):
                print(f"  WARNING: no profile written to {self.out}", flush=True)
            run.tail_s = 0.0
        finally:
            run.exit, run.total_cpu_s = await _stop(pid)
            self.cluster.stop_component(LATTICE)

    async def _bound_and_done(
        self,
        api: client.ApiClient,
        bench: Bench,
        ns: str,
        names: list[str],
        sent: Mapping[str, float],
        watcher: Watcher,
        cpu0: float,
        t0: float,
    ) -> None:
        """Wait for the bindings, then until Lattice has seen every pod event and is idle;
        the window's figures, and the profile written."""
        args, run, pid = self.args, self.run, self.pid
        unbound = await wait_all(watcher, set(names), args.timeout)
        run.bound = len(names) - unbound
        times = [watcher.bound[n] for n in names if n in watcher.bound]
        if times:
            run.bind_s = max(times) - min(sent.values())
        last = time.monotonic()
        # Once kwok ran every pod, a sentinel pod: Lattice's watch delivers in order, so
        # its binding means every earlier pod event has reached Lattice (the API server
        # on a busy machine may deliver them long after the binding was written).
        await bench._settle(ns, within=args.settle)
        await self._sentinel(api, ns, watcher, "sentinel-end")
        quiet = max(0.05, 1.5 * run.idle_rate) if run.idle_s > 0 else 0.05
        await wait_idle(pid, within=10.0, quiet=quiet)
        run.tail_s = time.monotonic() - last
        run.window_cpu_s = cpu_seconds(pid) - cpu0
        run.window_s = time.monotonic() - t0
        run.rss_mib = peak_rss_mib(pid)
        self._signal(signal.SIGUSR2)
        if self.profiled and not await _wait_file(self.out, pid):
            print(f"  WARNING: no profile written to {self.out}", flush=True)

    async def _sentinel(self, api: client.ApiClient, ns: str, watcher: Watcher, name: str) -> None:
        """One more plain pod for Lattice, and wait until it is bound."""
        await create_pods(client.CoreV1Api(api), ns, [plain(name, LATTICE)])
        if await wait_all(watcher, {name}, self.args.timeout):
            print(f"  WARNING: {name} not bound after {self.args.timeout:.0f}s", flush=True)

    async def _background(self) -> None:
        """The background window: ``--idle`` s with nothing to schedule."""
        run, pid = self.run, self.pid
        print(f"  background window: {self.args.idle:.0f}s without pods", flush=True)
        self._signal(signal.SIGUSR1)
        cpu0, t0 = cpu_seconds(pid), time.monotonic()
        await asyncio.sleep(self.args.idle)
        run.idle_cpu_s = cpu_seconds(pid) - cpu0
        run.idle_s = time.monotonic() - t0
        self._signal(signal.SIGUSR2)
        if self.bg_out is not None and not await _wait_file(self.bg_out, pid):
            print(f"  WARNING: no background profile written to {self.bg_out}", flush=True)


def summary(run: Run, out: Path | None) -> str:
    """The run's figures, one per line."""
    gross, bg = run.cpu_ms, run.bg_ms
    how = "profiled: inflated by the profiler" if run.profiler != "off" else "unprofiled"
    lines = [
        f"--workload {run.workload} --nodes {run.nodes} --existing {run.existing} "
        f"--pods {run.pods} --profiler {run.profiler} --timer {run.timer} "
        f"--profile-from {run.profile_from}",
        f"pods bound: {run.bound}/{run.pods} ({run.watch})",
        (
            f"wall: created in {run.create_s:.1f}s before Lattice started; first to last "
            f"binding {run.bind_s:.1f}s ({run.pods_s:.1f} pods/s)"
            if run.backlog
            else f"wall: created in {run.create_s:.1f}s, all bound {run.bind_s:.1f}s after the "
            f"first create ({run.pods_s:.1f} pods/s); pod window {run.window_s:.1f}s (of which "
            f"{run.tail_s:.1f}s after the last binding, until Lattice had seen kwok run every "
            "pod and was back to its background rate)"
        ),
        f"lattice CPU in the pod window (user+sys, all threads, {how}): "
        f"{run.window_cpu_s:.2f}s = {gross:.2f} ms/pod",
    ]
    if run.idle_s > 0:
        lines.append(
            f"  background (no pods, {run.idle_s:.0f}s window): {run.idle_rate * 1000:.0f} ms "
            f"CPU/s, x {run.window_s:.1f}s = {bg:.2f} ms/pod; net of it: "
            f"{gross - bg:.2f} ms/pod"
        )
    if run.backlog:
        lines.append(
            f"  backlog: the window is the first to the last binding (the benchmark's CPU "
            f"column), {run.pods_in_window} pods"
            + (" (CPU from the process start)" if run.profile_from == "start" else "")
        )
    lines.append(
        f"lattice CPU over its whole life: {run.total_cpu_s:.2f}s; peak RSS "
        f"{run.rss_mib:.0f} MiB; {run.exit}"
    )
    if not math.isnan(run.baseline_ms):
        lines.append(
            f"unprofiled baseline (its own lattice run just before): {run.baseline_ms:.2f} "
            f"ms/pod, background {run.baseline_bg_ms:.2f}, net "
            f"{run.baseline_ms - run.baseline_bg_ms:.2f} ms/pod; {run.baseline_pods_s:.1f} pods/s"
        )
    if out is not None:
        lines.append(f"profile: {out}  (python -m pstats {out})")
        if run.background:
            lines.append(f"background profile: {run.background}")
    return "\n".join(lines)


def full_report(run: Run, out: Path, *, top: int) -> str:
    """The summary, then the tables of the profile (with the background one if any)."""
    parts = [summary(run, out)]
    if out.exists():
        wall = run.timer == "wall"
        bg_path = Path(run.background) if run.background else None
        background = load_stats(bg_path) if bg_path is not None and bg_path.exists() else None
        scale = run.window_s / run.idle_s if run.idle_s > 0 else 1.0
        b = breakdown(load_stats(out), wall=wall, top=top, background=background, scale=scale)
        coverage = b.total_s / run.window_cpu_s if run.window_cpu_s > 0 else math.nan
        parts.append(
            f"profiled time in the pod window: {b.total_s:.2f}s "
            f"({coverage:.0%} of the window's process CPU)"
        )
        parts += ["", render(b, run.pods_in_window, wall=wall, honest_ms=run.baseline_ms)]
    return "\n".join(parts)


def _cluster(args: argparse.Namespace) -> tuple[DevCluster, bool]:
    """The cluster to use, and whether to stop it at the end."""
    if args.state_dir is None:
        return DevCluster(Path(tempfile.mkdtemp(prefix="lattice-profile-")) / "state"), True
    return DevCluster(Path(args.state_dir)), args.down


def _up(cluster: DevCluster, args: argparse.Namespace) -> None:
    """Reuse the cluster if it runs (with the asked node count), else start it."""
    state = cluster.load_state()
    alive = {k: v for k, v in cluster.running().items() if k != LATTICE}
    if state is not None and alive and all(alive.values()):
        have = int(state.config.get("nodes", -1))
        if have != args.nodes:
            raise SystemExit(
                f"the devcluster in {cluster.state_dir} has {have} nodes, not {args.nodes}: "
                "pass --nodes to match, or another --state-dir"
            )
        print(f"reusing the devcluster in {cluster.state_dir} ({have} kwok nodes)", flush=True)
    else:
        started = time.monotonic()
        state = cluster.up(
            ClusterConfig(nodes=args.nodes, node_ready_timeout=600),
            progress=lambda line: print(f"  {line}", flush=True),
        )
        print(
            f"control plane in {cluster.state_dir} with {args.nodes} kwok nodes ready in "
            f"{time.monotonic() - started:.0f}s",
            flush=True,
        )
    apply_crds(cluster, state)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == [CHILD]:
        _child(argv[1:])
        return 0
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=500, help="kwok nodes (default 500)")
    parser.add_argument(
        "--workload",
        choices=list(WORKLOADS),
        default="plain",
        help="the benchmark's pod shape to profile (default plain); anti-affinity caps "
        "--pods and --existing at one pod per node",
    )
    parser.add_argument(
        "--existing", type=int, default=1000, help="pre-bound pods of the workload's shape"
    )
    parser.add_argument("--pods", type=int, default=2000, help="pods of the workload to schedule")
    parser.add_argument(
        "--rate", type=float, default=None, help="create pods/s (default: 32 calls in flight)"
    )
    parser.add_argument("--qps", type=float, default=5000.0, help="Lattice client QPS")
    parser.add_argument("--burst", type=int, default=None, help="client burst (default 2 x qps)")
    parser.add_argument(
        "--profiler",
        choices=("cprofile", "off"),
        default="cprofile",
        help="off: the same windows unprofiled, for the honest CPU ms/pod",
    )
    parser.add_argument(
        "--timer",
        choices=("cpu", "wall"),
        default="cpu",
        help="cProfile's clock: main-thread CPU time (default) or wall time",
    )
    parser.add_argument(
        "--profile-from",
        choices=("ready", "start"),
        default="ready",
        help="ready: the pod window only (default); start: the whole process up to the "
        "window's end, start-up and initial sync included (no background window)",
    )
    parser.add_argument(
        "--backlog",
        action="store_true",
        help="as `just bench`: the pods created before Lattice starts, the window from the "
        "first binding to the last (no background window)",
    )
    parser.add_argument(
        "--idle", type=float, default=30.0, help="background window without pods, s (0: none)"
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="the .prof file (default: a new one in /tmp)"
    )
    parser.add_argument(
        "--baseline",
        action="store_true",
        help="first the same run unprofiled (a lattice process of its own): the honest CPU "
        "ms/pod, to which the areas' shares are then scaled",
    )
    parser.add_argument("--top", type=int, default=25, help="functions in the top table")
    parser.add_argument(
        "--state-dir",
        default=os.environ.get("LATTICE_STATE_DIR"),
        help="reuse (or start and keep) the devcluster here (default $LATTICE_STATE_DIR; "
        "unset: a temporary one, stopped at the end)",
    )
    parser.add_argument(
        "--down", action="store_true", help="stop the --state-dir devcluster at the end"
    )
    parser.add_argument("--settle", type=float, default=60.0, help="max wait for idle, s")
    parser.add_argument("--timeout", type=float, default=600.0, help="max wait for bindings, s")
    parser.add_argument(
        "--report",
        type=Path,
        default=None,
        help="print an earlier run again from its .prof (and the .json beside it)",
    )
    args = parser.parse_args(argv)
    if args.report is not None:
        run = Run(**json.loads(args.report.with_suffix(".json").read_text()))
        print(full_report(run, args.report, top=args.top))
        return 0
    if args.nodes < 1 or args.pods < 1 or args.existing < 0 or args.qps <= 0 or args.idle < 0:
        parser.error("--nodes and --pods must be >= 1, --existing and --idle >= 0, --qps > 0")
    if args.backlog:
        args.idle = 0.0
    size = sizes(args.workload, nodes=args.nodes, pods=args.pods, stream=0, existing=args.existing)
    for note in size.notes:
        print(f"note: {args.workload}: {note}", flush=True)
    args.pods, args.existing = size.measured, size.existing
    profiled = args.profiler != "off"
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = (args.out or Path(tempfile.gettempdir()) / f"lattice-{stamp}.prof").resolve()
    bg_out = (
        out.with_suffix(".background.prof")
        if profiled and args.idle > 0 and args.profile_from == "ready"
        else None
    )
    for path in (out, bg_out, out.with_suffix(".json")):
        if path is not None:
            path.unlink(missing_ok=True)
    cluster, down = _cluster(args)
    print(
        f"profile of `lattice run`: --workload {args.workload} --nodes {args.nodes} "
        f"--existing {args.existing} --pods {args.pods} --profiler {args.profiler} "
        f"--timer {args.timer}",
        flush=True,
    )
    try:
        _up(cluster, args)
        base: Run | None = None
        if args.baseline and profiled:
            print("unprofiled baseline run:", flush=True)
            base = asyncio.run(Session(cluster, args, out, None, profiled=False)())
            print(summary(base, None), flush=True)
            print("profiled run:", flush=True)
        run = asyncio.run(Session(cluster, args, out, bg_out, profiled=profiled)())
        if base is not None:
            run.baseline_ms, run.baseline_bg_ms = base.cpu_ms, base.bg_ms
            run.baseline_pods_s = base.pods_s
    finally:
        if down:
            cluster.down()
        else:
            print(f"devcluster kept in {cluster.state_dir} (lattice devcluster down to stop)")
    out.with_suffix(".json").write_text(json.dumps(asdict(run), indent=2))
    print()
    print(full_report(run, out, top=args.top) if profiled else summary(run, None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
