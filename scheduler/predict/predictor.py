"""Per-node load prediction: smoothed measurements plus what was just placed.

Theory of operation
-------------------
Requests are promises, not load; a scheduler that scores on measured load
must still avoid the classic traps, and this module is built around them:

* **Noise and spikes** - each node's CPU and memory use (absolute millicores
  and bytes) is smoothed by a continuous-time EWMA (`ewma.py`), so reports at
  irregular intervals, a missed report or a single spike are handled with a
  fixed time constant.
* **Just-placed pods are invisible to metrics** - `note_placement` records an
  estimate of every pod placed on a node (its requests times a per-resource
  scale, or a default for a pod that requests nothing). The estimate counts in
  full until a report dated after placement + `settle_delay_s` arrives. From
  then on the pod is in the samples, but the EWMA takes it in only gradually
  (weight a per report), so the estimate fades by (1-a) with every covering
  report: smoothed level + residual estimate stay close to the true load
  instead of dipping while the EWMA catches up. Below `inflight_min_weight`
  the estimate is dropped (1.0 drops it at the first covering report). Deleted
  or unbound pods are dropped at once with `forget_pod`.
* **Stale metrics** - a node whose newest sample is older than
  `stale_after_s` is STALE and a node that never reported is UNKNOWN; for
  both the prediction is the caller's requested totals over allocatable, i.e.
  exactly what kube-scheduler believes. A silent node is never read as idle.
  The caller's requested totals include assumed pods, so in-flight estimates
  are not added again for such nodes. After an outage longer than
  `stale_after_s` the series restarts from the next sample.
* **Bad reports** - duplicates, out-of-order, future-dated (clock skew) and
  malformed reports are ignored and reported as an `ObserveOutcome`.

Fresh nodes are measured against the capacity the agent reports (the same
source as the measurement, so system daemons count against the machine);
stale and unknown nodes against the allocatable the caller passes.

Everything is pure: no I/O, no clock (every call that needs the time takes
`now`, seconds as a float, on the same clock as the agents' sample times).
The predictor is not thread-safe; use it from one thread (the event loop).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike, NDArray

from scheduler.predict.config import PredictConfig
from scheduler.predict.ewma import Series, update
from scheduler.predict.types import (
    CpuMem,
    LoadReport,
    LoadStatus,
    NodeLoadBreakdown,
    ObserveOutcome,
    PodEstimate,
    PredictionBatch,
    PsiSample,
)


def estimate_pod(
    config: PredictConfig, cpu_request_milli: int, mem_request_bytes: int
) -> PodEstimate:
    """Expected use of a pod from its requests; a zero request gets the configured default.

    The default is per resource and absolute (not scaled): a pod that asks for
    nothing still uses something, and treating it as free is how best-effort
    pods pile up on one node.
    """
    if cpu_request_milli < 0 or mem_request_bytes < 0:
        raise ValueError(f"negative request: cpu={cpu_request_milli} mem={mem_request_bytes}")
    cpu = (
        cpu_request_milli * config.cpu_request_scale
        if cpu_request_milli > 0
        else float(config.default_cpu_milli)
    )
    mem = (
        mem_request_bytes * config.memory_request_scale
        if mem_request_bytes > 0
        else float(config.default_memory_bytes)
    )
    return PodEstimate(cpu_milli=cpu, memory_bytes=mem)


@dataclass(slots=True)
class _Inflight:
    placed_at: float
    cpu_request_milli: int
    mem_request_bytes: int
    # Raw requests are kept (not the estimate) so a config change applies at once.
    cpu_weight: float = 1.0
    mem_weight: float = 1.0


@dataclass(frozen=True, slots=True)
class _Reported:
    report: LoadReport
    cpu: Series
    mem: Series


@dataclass(slots=True)
class _NodeState:
    reported: _Reported | None = None
    inflight: dict[str, _Inflight] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class _View:
    status: LoadStatus
    age_s: float
    predicted_cpu: float
    predicted_mem: float
    inflight_cpu: float
    inflight_mem: float
    used_cpu: float
    used_mem: float
    cap_cpu: float
    cap_mem: float
    psi: PsiSample | None


def _valid(report: LoadReport) -> bool:
    numbers = (
        report.sample_time,
        report.cpu_used_milli,
        report.mem_used_bytes,
        report.psi.cpu_some,
        report.psi.memory_some,
        report.psi.memory_full,
    )
    if not all(math.isfinite(x) for x in numbers):
        return False
    return (
        report.cpu_used_milli >= 0
        and report.mem_used_bytes >= 0
        and report.cpu_capacity_milli > 0
        and report.mem_capacity_bytes > 0
        and min(report.psi.cpu_some, report.psi.memory_some, report.psi.memory_full) >= 0
    )


class LoadPredictor:
    """Predicted CPU and memory use of every node; see the module docstring."""

    def __init__(self, config: PredictConfig | None = None) -> None:
        self._config = config if config is not None else PredictConfig()
        self._nodes: dict[str, _NodeState] = {}
        self._pod_node: dict[str, str] = {}
        self._table = _RowTable()
        self._newest_sample: float | None = None
        """The newest accepted sample time of any node (never lowered: a bound, not a fact)."""

    @property
    def config(self) -> PredictConfig:
        return self._config

    def replace_config(self, config: PredictConfig) -> None:
        """Swap settings live (from the custom resource), keeping every series and estimate.

        New alphas apply from the next report, new scales and defaults at once
        (estimates are kept as raw requests), new staleness at the next query.
        """
        self._config = config
        for name in self._nodes:
            self._refresh(name)

    # --- inputs ----------------------------------------------------------

    def observe(
        self,
        node: str,
        sample_time: float,
        cpu_used_milli: float,
        mem_used_bytes: float,
        cpu_capacity_milli: int,
        mem_capacity_bytes: int,
        *,
        psi: PsiSample | None = None,
        now: float | None = None,
    ) -> ObserveOutcome:
        """Fold one agent report in; `now`, when given, guards against future-dated samples."""
        report = LoadReport(
            node=node,
            sample_time=sample_time,
            cpu_used_milli=cpu_used_milli,
            mem_used_bytes=mem_used_bytes,
            cpu_capacity_milli=cpu_capacity_milli,
            mem_capacity_bytes=mem_capacity_bytes,
            psi=psi if psi is not None else PsiSample(),
        )
        return self.observe_report(report, now=now)

    def observe_report(self, report: LoadReport, *, now: float | None = None) -> ObserveOutcome:
        """Same as `observe`, for a report already in its value form."""
        cfg = self._config
        if not _valid(report):
            return ObserveOutcome.INVALID
        if now is not None and report.sample_time > now + cfg.max_future_skew_s:
            # Accepting it would freeze the node: every later honest report would be "old".
            return ObserveOutcome.FROM_FUTURE
        state = self._nodes.setdefault(report.node, _NodeState())
        prev = state.reported
        if prev is not None:
            if report.sample_time == prev.report.sample_time:
                return ObserveOutcome.DUPLICATE
            if report.sample_time < prev.report.sample_time:
                return ObserveOutcome.OUT_OF_ORDER
        if prev is None or report.sample_time - prev.report.sample_time > cfg.stale_after_s:
            cpu, mem = Series(report.cpu_used_milli), Series(report.mem_used_bytes)
            a_cpu = a_mem = 1.0
        else:
            dt = report.sample_time - prev.report.sample_time
            beta, interval = cfg.trend_beta, cfg.report_interval_s
            cpu, a_cpu = update(
                prev.cpu,
                report.cpu_used_milli,
                dt=dt,
                alpha=cfg.cpu_alpha,
                beta=beta,
                interval=interval,
            )
            mem, a_mem = update(
                prev.mem,
                report.mem_used_bytes,
                dt=dt,
                alpha=cfg.memory_alpha,
                beta=beta,
                interval=interval,
            )
        state.reported = _Reported(report=report, cpu=cpu, mem=mem)
        if self._newest_sample is None or report.sample_time > self._newest_sample:
            self._newest_sample = report.sample_time
        self._fade_covered(state, report.sample_time, a_cpu, a_mem)
        self._refresh(report.node)
        return ObserveOutcome.ACCEPTED

    def note_placement(
        self,
        node: str,
        pod_key: str,
        cpu_request_milli: int,
        mem_request_bytes: int,
        now: float,
    ) -> None:
        """Count a pod just assumed on `node` until reports show it.

        Idempotent: noting the same pod on the same node again keeps the first
        placement time (a replayed event must not restart the settle delay);
        noting it on another node moves it.
        """
        if cpu_request_milli < 0 or mem_request_bytes < 0:
            raise ValueError(f"negative request: cpu={cpu_request_milli} mem={mem_request_bytes}")
        if self._pod_node.get(pod_key) == node:
            return
        self.forget_pod(pod_key)
        state = self._nodes.setdefault(node, _NodeState())
        state.inflight[pod_key] = _Inflight(
            placed_at=now, cpu_request_milli=cpu_request_milli, mem_request_bytes=mem_request_bytes
        )
        self._pod_node[pod_key] = node
        self._refresh(node)

    def forget_pod(self, pod_key: str) -> bool:
        """Drop a pod's estimate (pod deleted, or binding failed); True if there was one."""
        node = self._pod_node.pop(pod_key, None)
        if node is None:
            return False
        state = self._nodes[node]
        del state.inflight[pod_key]
        if state.reported is None and not state.inflight:
            del self._nodes[node]
        self._refresh(node)
        return True

    def forget_node(self, node: str) -> bool:
        """Drop everything about a deleted node; True if anything was known."""
        state = self._nodes.pop(node, None)
        if state is None:
            return False
        for pod_key in state.inflight:
            del self._pod_node[pod_key]
        self._refresh(node)
        return True

    def _refresh(self, node: str) -> None:
        """Bring `node`'s row of the prediction table in line with its state (O(its pods))."""
        state = self._nodes.get(node)
        if state is None:
            self._table.drop(node)
            return
        cfg = self._config
        inflight_cpu = inflight_mem = 0.0
        for entry in state.inflight.values():
            est = estimate_pod(cfg, entry.cpu_request_milli, entry.mem_request_bytes)
            inflight_cpu += est.cpu_milli * entry.cpu_weight
            inflight_mem += est.memory_bytes * entry.mem_weight
        self._table.set(node, state.reported, inflight_cpu, inflight_mem)

    def _fade_covered(
        self, state: _NodeState, sample_time: float, a_cpu: float, a_mem: float
    ) -> None:
        cutoff = sample_time - self._config.settle_delay_s
        floor = self._config.inflight_min_weight
        for pod_key, entry in list(state.inflight.items()):
            if entry.placed_at >= cutoff:
                continue  # the sample predates placement + settle: the pod is not in it
            entry.cpu_weight *= 1.0 - a_cpu
            entry.mem_weight *= 1.0 - a_mem
            if entry.cpu_weight < floor:
                entry.cpu_weight = 0.0
            if entry.mem_weight < floor:
                entry.mem_weight = 0.0
            if entry.cpu_weight == 0.0 and entry.mem_weight == 0.0:
                del state.inflight[pod_key]
                del self._pod_node[pod_key]

    # --- queries ---------------------------------------------------------

    def estimate_pod(self, cpu_request_milli: int, mem_request_bytes: int) -> PodEstimate:
        """`estimate_pod` with the current config, for scoring an incoming pod."""
        return estimate_pod(self._config, cpu_request_milli, mem_request_bytes)

    def status(self, node: str, now: float) -> LoadStatus:
        state = self._nodes.get(node)
        if state is None or state.reported is None:
            return LoadStatus.UNKNOWN
        if now - state.reported.report.sample_time > self._config.stale_after_s:
            return LoadStatus.STALE
        return LoadStatus.FRESH

    def may_have_fresh(self, now: float) -> bool:
        """False only when no node can be FRESH at ``now`` (nothing reported within
        ``stale_after_s``): lets a cycle on a cluster without agents skip the whole-cluster
        :meth:`predict` that would only say so. O(1)."""
        newest = self._newest_sample
        return newest is not None and now - newest <= self._config.stale_after_s

    def sample_time(self, node: str) -> float | None:
        """Time of the node's newest accepted sample; None if it never reported."""
        state = self._nodes.get(node)
        if state is None or state.reported is None:
            return None
        return state.reported.report.sample_time

    def inflight_pods(self, node: str) -> tuple[str, ...]:
        state = self._nodes.get(node)
        return tuple(sorted(state.inflight)) if state is not None else ()

    def predict(
        self,
        nodes: Sequence[str],
        requested_cpu_milli: ArrayLike,
        requested_mem_bytes: ArrayLike,
        allocatable_cpu_milli: ArrayLike,
        allocatable_mem_bytes: ArrayLike,
        *,
        now: float,
    ) -> PredictionBatch:
        """Predictions for `nodes` in order, for one scheduling cycle.

        The requested totals (including assumed pods) and allocatable come
        from the caller's snapshot; they are the fallback for nodes that are
        not fresh.
        """
        n = len(nodes)
        req_cpu, req_mem, alloc_cpu, alloc_mem = (
            _column(name, values, n)
            for name, values in (
                ("requested_cpu_milli", requested_cpu_milli),
                ("requested_mem_bytes", requested_mem_bytes),
                ("allocatable_cpu_milli", allocatable_cpu_milli),
                ("allocatable_mem_bytes", allocatable_mem_bytes),
            )
        )
        cfg = self._config
        t = self._table.gather(nodes)
        has = ~np.isnan(t.sample_time)
        with np.errstate(invalid="ignore"):
            age = np.maximum(now - t.sample_time, 0.0)  # NaN stays NaN for unknown nodes
            fresh = has & (age <= cfg.stale_after_s)
        lead = np.nan_to_num(age) + cfg.horizon_s
        # The trend may overshoot; use stays within [0, capacity] (or the level, if above).
        pred_cpu = np.clip(
            t.cpu_level + t.cpu_trend * lead, 0.0, np.maximum(t.cpu_cap, t.cpu_level)
        )
        pred_mem = np.clip(
            t.mem_level + t.mem_trend * lead, 0.0, np.maximum(t.mem_cap, t.mem_level)
        )
        used_cpu = np.where(fresh, pred_cpu + t.inflight_cpu, req_cpu)
        used_mem = np.where(fresh, pred_mem + t.inflight_mem, req_mem)
        cap_cpu = np.where(fresh, t.cpu_cap, alloc_cpu)
        cap_mem = np.where(fresh, t.mem_cap, alloc_mem)
        status = np.where(
            fresh, np.int8(LoadStatus.FRESH), np.where(has, np.int8(LoadStatus.STALE), np.int8(2))
        ).astype(np.int8)
        cpu_psi = np.where(fresh, t.cpu_psi, np.nan)
        mem_psi = np.where(fresh, t.mem_psi, np.nan)
        for array in (used_cpu, used_mem, cap_cpu, cap_mem, status, age, cpu_psi, mem_psi):
            array.flags.writeable = False  # a cycle's snapshot: scores derive, never edit
        return PredictionBatch(
            nodes=tuple(nodes),
            cpu_used_milli=used_cpu,
            mem_used_bytes=used_mem,
            cpu_capacity_milli=cap_cpu,
            mem_capacity_bytes=cap_mem,
            status=status,
            age_s=age,
            cpu_pressure=cpu_psi,
            memory_pressure=mem_psi,
        )

    def explain(
        self,
        node: str,
        *,
        requested: CpuMem,
        allocatable: CpuMem,
        now: float,
    ) -> NodeLoadBreakdown:
        """Every term of one node's prediction, for explanations."""
        v = self._view(
            node, requested.cpu, requested.memory, allocatable.cpu, allocatable.memory, now
        )
        state = self._nodes.get(node)
        last = state.reported.report if state is not None and state.reported is not None else None
        return NodeLoadBreakdown(
            node=node,
            status=v.status,
            age_s=None if last is None else v.age_s,
            measured=None if last is None else CpuMem(last.cpu_used_milli, last.mem_used_bytes),
            predicted=None if last is None else CpuMem(v.predicted_cpu, v.predicted_mem),
            inflight=CpuMem(v.inflight_cpu, v.inflight_mem),
            inflight_pods=self.inflight_pods(node),
            requested=requested,
            total=CpuMem(v.used_cpu, v.used_mem),
            capacity=CpuMem(v.cap_cpu, v.cap_mem),
            utilisation=CpuMem(
                v.used_cpu / v.cap_cpu if v.cap_cpu > 0 else math.inf,
                v.used_mem / v.cap_mem if v.cap_mem > 0 else math.inf,
            ),
            psi=v.psi,
        )

    def _view(
        self,
        node: str,
        req_cpu: float,
        req_mem: float,
        alloc_cpu: float,
        alloc_mem: float,
        now: float,
    ) -> _View:
        cfg = self._config
        state = self._nodes.get(node)
        inflight_cpu = inflight_mem = 0.0
        if state is not None:
            for entry in state.inflight.values():
                est = estimate_pod(cfg, entry.cpu_request_milli, entry.mem_request_bytes)
                inflight_cpu += est.cpu_milli * entry.cpu_weight
                inflight_mem += est.memory_bytes * entry.mem_weight
        reported = state.reported if state is not None else None
        if reported is None:
            return _View(
                status=LoadStatus.UNKNOWN,
                age_s=math.nan,
                predicted_cpu=math.nan,
                predicted_mem=math.nan,
                inflight_cpu=inflight_cpu,
                inflight_mem=inflight_mem,
                used_cpu=float(req_cpu),
                used_mem=float(req_mem),
                cap_cpu=float(alloc_cpu),
                cap_mem=float(alloc_mem),
                psi=None,
            )
        report = reported.report
        age = max(now - report.sample_time, 0.0)
        lead = age + cfg.horizon_s
        # The trend may overshoot; use stays within [0, capacity] (or the level, if above).
        pred_cpu = _clamp(
            reported.cpu.forecast(lead), max(report.cpu_capacity_milli, reported.cpu.level)
        )
        pred_mem = _clamp(
            reported.mem.forecast(lead), max(report.mem_capacity_bytes, reported.mem.level)
        )
        if age > cfg.stale_after_s:
            return _View(
                status=LoadStatus.STALE,
                age_s=age,
                predicted_cpu=pred_cpu,
                predicted_mem=pred_mem,
                inflight_cpu=inflight_cpu,
                inflight_mem=inflight_mem,
                used_cpu=float(req_cpu),
                used_mem=float(req_mem),
                cap_cpu=float(alloc_cpu),
                cap_mem=float(alloc_mem),
                psi=None,
            )
        return _View(
            status=LoadStatus.FRESH,
            age_s=age,
            predicted_cpu=pred_cpu,
            predicted_mem=pred_mem,
            inflight_cpu=inflight_cpu,
            inflight_mem=inflight_mem,
            used_cpu=pred_cpu + inflight_cpu,
            used_mem=pred_mem + inflight_mem,
            cap_cpu=float(report.cpu_capacity_milli),
            cap_mem=float(report.mem_capacity_bytes),
            psi=report.psi,
        )


def _clamp(value: float, upper: float) -> float:
    return min(max(value, 0.0), upper)


def _column(name: str, values: ArrayLike, n: int) -> NDArray[np.float64]:
    array = np.asarray(values, dtype=np.float64)
    if array.shape != (n,):
        raise ValueError(f"{name} has shape {array.shape}, expected ({n},) to match nodes")
    return array


_FIELDS: tuple[str, ...] = (
    "sample_time",
    "cpu_level",
    "cpu_trend",
    "mem_level",
    "mem_trend",
    "cpu_cap",
    "mem_cap",
    "cpu_psi",
    "mem_psi",
    "inflight_cpu",
    "inflight_mem",
)


@dataclass(frozen=True, slots=True)
class _Columns:
    sample_time: NDArray[np.float64]
    """NaN where the node never reported (or is unknown)."""
    cpu_level: NDArray[np.float64]
    cpu_trend: NDArray[np.float64]
    mem_level: NDArray[np.float64]
    mem_trend: NDArray[np.float64]
    cpu_cap: NDArray[np.float64]
    mem_cap: NDArray[np.float64]
    cpu_psi: NDArray[np.float64]
    mem_psi: NDArray[np.float64]
    inflight_cpu: NDArray[np.float64]
    inflight_mem: NDArray[np.float64]


class _RowTable:
    """Per-node prediction inputs as columns, so a cycle over all nodes is pure numpy.

    Row 0 is the sentinel every unknown node gathers from (never reported, nothing in
    flight). Rows are updated one node at a time when its state changes; the name -> row
    gather for a node list is memoised on the list object (the snapshot hands out the same
    tuple until its node set changes) and on the table's layout version. A node given its
    first row patches the memoised gather in place instead of invalidating it: otherwise
    every cycle that places a pod on a node without reports (all of them, on a cluster
    without agents, until each node has a pod) rebuilds the gather over every node.
    """

    def __init__(self) -> None:
        self._rows: dict[str, int] = {}
        self._free: list[int] = []
        self._size = 1
        self._data = np.zeros((len(_FIELDS), 16), dtype=np.float64)
        self._data[0, 0] = np.nan
        self._layout = 0
        self._gather_key: tuple[Sequence[str], int] | None = None
        self._gather_index: NDArray[np.intp] = np.zeros(0, dtype=np.intp)
        self._gather_pos: dict[str, int] = {}
        """Position of each node in the memoised gather's node list."""

    def set(
        self, node: str, reported: _Reported | None, inflight_cpu: float, inflight_mem: float
    ) -> None:
        row = self._rows.get(node)
        if row is None:
            row = self._free.pop() if self._free else self._append()
            self._rows[node] = row
            key = self._gather_key
            current = key is not None and key[1] == self._layout
            self._layout += 1
            if current and key is not None:
                pos = self._gather_pos.get(node)
                if pos is not None:
                    self._gather_index[pos] = row
                self._gather_key = (key[0], self._layout)
        col = self._data[:, row]
        if reported is None:
            col[:] = 0.0
            col[0] = np.nan
        else:
            r = reported.report
            col[0:9] = (
                r.sample_time,
                reported.cpu.level,
                reported.cpu.trend,
                reported.mem.level,
                reported.mem.trend,
                r.cpu_capacity_milli,
                r.mem_capacity_bytes,
                r.psi.cpu_some,
                r.psi.memory_some,
            )
        col[9] = inflight_cpu
        col[10] = inflight_mem

    def drop(self, node: str) -> None:
        row = self._rows.pop(node, None)
        if row is not None:
            self._data[:, row] = 0.0
            self._data[0, row] = np.nan
            self._free.append(row)
            self._layout += 1

    def _append(self) -> int:
        if self._size == self._data.shape[1]:
            grown = np.zeros((len(_FIELDS), 2 * self._size), dtype=np.float64)
            grown[:, : self._size] = self._data
            self._data = grown
        self._size += 1
        return self._size - 1

    def gather(self, nodes: Sequence[str]) -> _Columns:
        key = self._gather_key
        if key is None or key[0] is not nodes or key[1] != self._layout:
            rows = self._rows
            self._gather_index = np.fromiter(
                map(rows.get, nodes, itertools.repeat(0)), dtype=np.intp, count=len(nodes)
            )
            self._gather_pos = {name: i for i, name in enumerate(nodes)}
            self._gather_key = (nodes, self._layout)
        taken = self._data[:, self._gather_index]
        return _Columns(*taken)
