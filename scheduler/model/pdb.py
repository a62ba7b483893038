"""The PodDisruptionBudget record (``policy/v1``), as preemption reads it.

kube-scheduler never computes a budget itself: the disruption controller (in
kube-controller-manager) writes ``status.disruptionsAllowed`` and ``status.disruptedPods``,
and DefaultPreemption spends the former pod by pod, skipping pods listed in the latter
(their eviction is already counted). ``minAvailable``/``maxUnavailable`` are kept, int or
percent, for explanations and for computing a status where no controller runs, but
preemption reads only the status, as kube does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from scheduler.model._fields import integer, mapping, string
from scheduler.model.errors import InvalidObjectError
from scheduler.model.pod import Pod
from scheduler.model.selectors import NOTHING, LabelSelector


@dataclass(frozen=True, slots=True)
class IntOrPercent:
    """An ``intstr.IntOrString`` budget: a count, or a percentage of the selected pods."""

    value: int
    percent: bool = False

    def scaled(self, total: int, *, round_up: bool) -> int:
        """``intstr.GetScaledValueFromIntOrPercent``: the count this value means for
        ``total`` pods (minAvailable rounds up, maxUnavailable too in the controller)."""
        if not self.percent:
            return self.value
        whole, rest = divmod(self.value * total, 100)
        return whole + (1 if round_up and rest else 0)

    @classmethod
    def from_api(cls, raw: object, field: str) -> IntOrPercent | None:
        if raw is None:
            return None
        if isinstance(raw, bool):
            raise InvalidObjectError(field, raw, "must be an integer or a percentage")
        if isinstance(raw, int):
            return cls(integer(raw, field, default=0, minimum=0))
        if isinstance(raw, str) and raw.endswith("%") and raw[:-1].isdigit():
            return cls(int(raw[:-1]), percent=True)
        raise InvalidObjectError(field, raw, "must be an integer or a percentage")


@dataclass(frozen=True, slots=True)
class PodDisruptionBudget:
    name: str
    namespace: str
    selector: LabelSelector = NOTHING
    """``spec.selector``; nil selects nothing, and kube's preemption also ignores an empty
    one (``selector.Empty()``), though the disruption controller reads it as every pod."""
    min_available: IntOrPercent | None = None
    max_unavailable: IntOrPercent | None = None
    disruptions_allowed: int = 0
    disrupted_pods: frozenset[str] = frozenset()
    """``status.disruptedPods`` keys: pod names whose eviction was already granted."""
    observed_generation: int = 0
    generation: int = 0

    def covers(self, pod: Pod) -> bool:
        """Whether evicting ``pod`` spends this budget (``filterPodsWithPDBViolation``)."""
        if pod.namespace != self.namespace or not pod.labels:
            return False
        if self.selector.is_empty or not self.selector.matches(pod.labels):
            return False
        return pod.name not in self.disrupted_pods

    @property
    def status_current(self) -> bool:
        """The controller has written a status for this spec (tests wait for it)."""
        return self.observed_generation >= self.generation

    @classmethod
    def from_api(cls, body: Mapping[str, Any]) -> PodDisruptionBudget:
        metadata = mapping(body.get("metadata"), "metadata")
        spec = mapping(body.get("spec"), "spec")
        status = mapping(body.get("status"), "status")
        name = string(metadata.get("name"), "metadata.name")
        if not name:
            raise InvalidObjectError("metadata.name", name, "a budget needs a name")
        disrupted = mapping(status.get("disruptedPods"), "status.disruptedPods")
        return cls(
            name=name,
            namespace=string(metadata.get("namespace"), "metadata.namespace") or "default",
            selector=LabelSelector.from_api(spec.get("selector"), field="spec.selector"),
            min_available=IntOrPercent.from_api(spec.get("minAvailable"), "spec.minAvailable"),
            max_unavailable=IntOrPercent.from_api(
                spec.get("maxUnavailable"), "spec.maxUnavailable"
            ),
            disruptions_allowed=integer(
                status.get("disruptionsAllowed"), "status.disruptionsAllowed", default=0
            ),
            disrupted_pods=frozenset(str(k) for k in disrupted),
            observed_generation=integer(
                status.get("observedGeneration"), "status.observedGeneration", default=0
            ),
            generation=integer(metadata.get("generation"), "metadata.generation", default=0),
        )
