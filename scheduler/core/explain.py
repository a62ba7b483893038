"""Decisions and their explanations.

Theory of operation: a cycle records, per node row, which filter rejected it (or that it was
excluded by a PreFilter node set, or that the whole pod was rejected at PreFilter), keeping
each filter's :class:`FilterResult` masks, and each score plugin's normalised scores over
the feasible rows. Everything readable — per-node verdicts, reason histograms, the
kube-scheduler style summary, JSON — is derived lazily from those arrays, so a scheduling
cycle pays nothing for explanations nobody reads.

The summary reproduces ``FitError.Error()``: ``"0/N nodes are available: "`` followed, for a
PreFilter rejection, by its message, otherwise by ``"<count> <reason>"`` entries sorted as
strings (so "10 …" sorts before "9 …", as in Go), each node contributing every reason of the
one plugin that rejected it, and nodes outside a PreFilter node set contributing the absent
status. A successful decision uses the same format with the feasible count in front.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import numpy.typing as npt

from scheduler.core.framework import Code, FilterResult, Preference
from scheduler.core.snapshot import IndexArray, IntArray
from scheduler.model.pod import Pod

if TYPE_CHECKING:
    from scheduler.core.dra.state import ClaimPlan
    from scheduler.core.volumes import VolumePlan

FEASIBLE: Final = -1
ABSENT: Final = -2
"""Excluded by a PreFilter node-name set (kube's "absent" nodes)."""
PREFILTER_REJECTED: Final = -3
NO_NODES_MESSAGE: Final = "no nodes available to schedule pods"


@dataclass(frozen=True, slots=True)
class FilterRecord:
    plugin: str
    result: FilterResult


@dataclass(frozen=True, slots=True)
class ScoreRecord:
    plugin: str
    weight: int
    scores: IntArray
    """Normalised 0..100 scores per node row (meaningful on feasible rows only)."""


@dataclass(frozen=True, slots=True)
class PreferenceRecord:
    plugin: str
    preference: Preference
    applied: bool
    """False when every feasible node was passed over, so the scores alone decided."""


@dataclass(frozen=True, slots=True)
class Rejection:
    """A status applying to many nodes at once (PreFilter rejection or absent nodes)."""

    plugin: str
    code: Code
    message: str


@dataclass(frozen=True, slots=True)
class NodeVerdict:
    name: str
    plugin: str | None
    """The filter that rejected the node; None when the node is feasible."""
    reasons: tuple[str, ...]
    code: Code
    scores: dict[str, int] = field(default_factory=dict)
    """Normalised score per plugin (feasible nodes only)."""
    weighted: dict[str, int] = field(default_factory=dict)
    total: int | None = None
    passed_over: tuple[str, ...] = ()
    """Why a feasible node was ranked after the others regardless of its total."""

    @property
    def message(self) -> str | None:
        return ", ".join(self.reasons) if self.reasons else None


@dataclass(frozen=True)
class Explanation:
    node_names: tuple[str, ...]
    rejected_by: npt.NDArray[np.int16]
    """Per row: index into :attr:`filters`, or FEASIBLE / ABSENT / PREFILTER_REJECTED."""
    filters: tuple[FilterRecord, ...] = ()
    feasible_rows: IndexArray = field(default_factory=lambda: np.zeros(0, dtype=np.intp))
    scores: tuple[ScoreRecord, ...] = ()
    totals: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    prefilter_rejection: Rejection | None = None
    absent: Rejection | None = None
    skipped_filters: tuple[str, ...] = ()
    skipped_scores: tuple[str, ...] = ()
    gated_message: str | None = None
    preferences: tuple[PreferenceRecord, ...] = ()

    @property
    def num_nodes(self) -> int:
        return len(self.node_names)

    @cached_property
    def feasible(self) -> tuple[str, ...]:
        names = self.node_names
        return tuple(names[i] for i in self.feasible_rows.tolist())

    @cached_property
    def _row_of(self) -> dict[str, int]:
        return {name: i for i, name in enumerate(self.node_names)}

    def node(self, name: str) -> NodeVerdict:
        row = self._row_of[name]
        by = int(self.rejected_by[row])
        if by == FEASIBLE:
            # Score arrays and totals are row-aligned (only feasible rows are meaningful).
            scores = {r.plugin: int(r.scores[row]) for r in self.scores}
            weighted = {r.plugin: int(r.scores[row]) * r.weight for r in self.scores}
            passed_over = tuple(
                f"{p.plugin}: {reason}"
                for p in self.preferences
                if p.applied
                for reason in p.preference.reasons_at(row)
            )
            return NodeVerdict(
                name,
                None,
                (),
                Code.SUCCESS,
                scores,
                weighted,
                int(self.totals[row]),
                passed_over,
            )
        if by in (ABSENT, PREFILTER_REJECTED):
            status = self.absent if by == ABSENT else self.prefilter_rejection
            assert status is not None
            return NodeVerdict(name, status.plugin, (status.message,), status.code)
        record = self.filters[by]
        return NodeVerdict(
            name,
            record.plugin,
            tuple(record.result.reasons_at(row)),
            Code(int(record.result.codes[row])),
        )

    def reason_counts(self) -> dict[str, int]:
        """Nodes per reason, counted like kube-scheduler's FailedScheduling message.

        For a PreFilter rejection kube prints the message without a count; we report it as
        applying to every node.
        """
        if self.gated_message is not None:
            return {}
        if self.prefilter_rejection is not None:
            return {self.prefilter_rejection.message: self.num_nodes}
        counts: Counter[str] = Counter()
        for index, record in enumerate(self.filters):
            attributed = self.rejected_by == index
            for reason, mask in record.result.reasons:
                hits = int(np.count_nonzero(mask & attributed))
                if hits:
                    counts[reason] += hits
        if self.absent is not None:
            absent = int(np.count_nonzero(self.rejected_by == ABSENT))
            if absent:
                counts[self.absent.message] += absent
        return dict(counts)

    @property
    def summary(self) -> str:
        if self.gated_message is not None:
            return self.gated_message
        if self.num_nodes == 0:
            return NO_NODES_MESSAGE
        head = f"{len(self.feasible_rows)}/{self.num_nodes} nodes are available"
        if self.prefilter_rejection is not None:
            return f"{head}: {self.prefilter_rejection.message}."
        entries = sorted(f"{count} {reason}" for reason, count in self.reason_counts().items())
        return f"{head}: {', '.join(entries)}." if entries else f"{head}."

    def reached(self, plugin: str) -> tuple[str, ...]:
        """Nodes whose filters ran as far as ``plugin``'s (kube stops at a node's first
        rejection): feasible ones, and those it or a later filter rejected."""
        order = next((i for i, r in enumerate(self.filters) if r.plugin == plugin), None)
        if order is None:
            return ()
        by = self.rejected_by
        rows = np.flatnonzero((by == FEASIBLE) | (by >= order)).tolist()
        return tuple(self.node_names[i] for i in rows)

    @property
    def rejecting_plugins(self) -> frozenset[str]:
        """Plugins that rejected at least one node (kube's UnschedulablePlugins)."""
        plugins = {
            record.plugin
            for index, record in enumerate(self.filters)
            if np.any(self.rejected_by == index)
        }
        for status in (self.prefilter_rejection, self.absent):
            if status is not None:
                plugins.add(status.plugin)
        return frozenset(plugins)

    @property
    def code(self) -> Code:
        """SUCCESS, or the code the queue should act on when no node fits."""
        if len(self.feasible_rows):
            return Code.SUCCESS
        if self.gated_message is not None:
            return Code.UNSCHEDULABLE_AND_UNRESOLVABLE
        if self.prefilter_rejection is not None:
            return self.prefilter_rejection.code
        if np.any(self.node_codes == Code.UNSCHEDULABLE):
            return Code.UNSCHEDULABLE
        return Code.UNSCHEDULABLE_AND_UNRESOLVABLE

    @cached_property
    def node_codes(self) -> npt.NDArray[np.int8]:
        """Per row status code (0 for feasible rows); preemption only helps Unschedulable rows."""
        codes = np.zeros(self.num_nodes, dtype=np.int8)
        for index, record in enumerate(self.filters):
            rows = self.rejected_by == index
            codes[rows] = record.result.codes[rows]
        for marker, status in (
            (ABSENT, self.absent),
            (PREFILTER_REJECTED, self.prefilter_rejection),
        ):
            if status is not None:
                codes[self.rejected_by == marker] = status.code
        return codes

    def to_json(self) -> dict[str, Any]:
        nodes: dict[str, Any] = {}
        for name in self.node_names:
            verdict = self.node(name)
            nodes[name] = {
                "filter": verdict.message,
                "plugin": verdict.plugin,
                "reasons": list(verdict.reasons),
                "code": verdict.code.name,
                "scores": verdict.scores,
                "weighted_scores": verdict.weighted,
                "total": verdict.total,
                "passed_over": list(verdict.passed_over),
            }
        return {
            "feasible": list(self.feasible),
            "summary": self.summary,
            "code": self.code.name,
            "reason_counts": self.reason_counts(),
            "weights": {r.plugin: r.weight for r in self.scores},
            "skipped": {"filters": list(self.skipped_filters), "scores": list(self.skipped_scores)},
            "preferences": [
                {
                    "plugin": p.plugin,
                    "applied": p.applied,
                    "passed_over": [
                        self.node_names[row]
                        for row in self.feasible_rows[p.preference.passed_over[self.feasible_rows]]
                    ],
                }
                for p in self.preferences
            ],
            "nodes": nodes,
        }


@dataclass(frozen=True)
class Decision:
    """The outcome of one scheduling cycle for one pod."""

    pod: Pod
    selected: str | None
    explanation: Explanation
    seed: int = 0
    annotations: Mapping[str, str] = field(default_factory=dict)
    """Annotations to put on the pod with its binding (Binding ``metadata.annotations``),
    e.g. ``lattice.dev/devices``: the devices the Topology plugin chose on ``selected``."""
    volume_plan: VolumePlan | None = None
    """What VolumeBinding must write before the binding (PV claimRefs, the PVCs'
    selected-node) and the claims to wait for; None when the pod's volumes need nothing."""
    claim_plan: ClaimPlan | None = None
    """The ResourceClaim allocations and reservations DynamicResources chose for
    ``selected``, to assume now and write before the binding; None without claims."""

    @property
    def feasible(self) -> tuple[str, ...]:
        return self.explanation.feasible

    @property
    def summary(self) -> str:
        return self.explanation.summary

    @property
    def code(self) -> Code:
        return self.explanation.code

    def reason_counts(self) -> dict[str, int]:
        return self.explanation.reason_counts()

    def to_json(self) -> dict[str, Any]:
        body = self.explanation.to_json()
        return {
            "pod": f"{self.pod.namespace}/{self.pod.name}",
            "selected": self.selected,
            "seed": self.seed,
            "annotations": dict(self.annotations),
            **body,
        }
