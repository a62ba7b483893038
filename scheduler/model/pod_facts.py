"""What preemption reads of a pod beyond the scheduling record (:class:`~scheduler.model.pod.Pod`).

kube-scheduler orders victims by start time, refuses to preempt again for a pod whose
nominated node still has a victim terminating *by preemption* (``DisruptionTarget`` with
reason ``PreemptionByScheduler``), and honours ``preemptionPolicy``. These live in the pod
body but not in the record, so they travel beside it, keyed by pod.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

from scheduler.model._fields import mapping, object_list, string
from scheduler.model.errors import InvalidObjectError
from scheduler.model.topology import parse_time

DISRUPTION_TARGET: Final = "DisruptionTarget"
PREEMPTION_BY_SCHEDULER: Final = "PreemptionByScheduler"


class PreemptionPolicy(StrEnum):
    PREEMPT_LOWER_PRIORITY = "PreemptLowerPriority"
    NEVER = "Never"


@dataclass(frozen=True, slots=True)
class PodFacts:
    """What preemption reads of a pod beyond the snapshot's :class:`Pod` record."""

    start_time: float | None = None
    """``status.startTime`` (Unix seconds); None: not started, which kube reads as "now"."""
    terminating_by_preemption: bool = False
    """``deletionTimestamp`` set and ``DisruptionTarget=True`` with reason
    PreemptionByScheduler (kube's ``podTerminatingByPreemption``)."""
    preemption_policy: PreemptionPolicy = PreemptionPolicy.PREEMPT_LOWER_PRIORITY

    @property
    def start_key(self) -> float:
        return math.inf if self.start_time is None else self.start_time

    @classmethod
    def from_api(cls, body: Mapping[str, Any]) -> PodFacts:
        metadata = mapping(body.get("metadata"), "metadata")
        spec = mapping(body.get("spec"), "spec")
        status = mapping(body.get("status"), "status")
        raw_start = string(status.get("startTime"), "status.startTime")
        try:
            start = parse_time(raw_start).timestamp() if raw_start else None
        except ValueError as exc:
            raise InvalidObjectError("status.startTime", raw_start, str(exc)) from exc
        by_preemption = False
        if metadata.get("deletionTimestamp") is not None:
            for cond in object_list(status.get("conditions"), "status.conditions"):
                if cond.get("type") == DISRUPTION_TARGET:  # the first one decides, as in kube
                    by_preemption = (
                        cond.get("status") == "True"
                        and cond.get("reason") == PREEMPTION_BY_SCHEDULER
                    )
                    break
        raw_policy = spec.get("preemptionPolicy")
        policy = PreemptionPolicy.PREEMPT_LOWER_PRIORITY
        if raw_policy is not None:
            if raw_policy not in [p.value for p in PreemptionPolicy]:
                raise InvalidObjectError(
                    "spec.preemptionPolicy", raw_policy, 'must be "PreemptLowerPriority" or "Never"'
                )
            policy = PreemptionPolicy(raw_policy)
        return cls(start, by_preemption, policy)
