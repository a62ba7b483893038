"""What the scheduling queue holds, and which of its updates matter.

A pending pod of ours is queued as a parsed :class:`~scheduler.model.pod.Pod`, or as a
:class:`BrokenPod` when its body did not parse; a gang until admitted is one
:class:`~scheduler.control.gangs.GangEntry`. Kept apart from the scheduler so that the
watch side, the cycle and the gang flow can share them without importing one another.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from scheduler.control.gangs import GangEntry
from scheduler.model.pod import Pod


@dataclass(frozen=True)
class BrokenPod:
    """A pending pod whose body did not parse: it waits in the queue with its error,
    so it gets a FailedScheduling event and is retried when it is updated."""

    namespace: str
    name: str
    uid: str
    error: str
    priority: int = 0
    scheduling_gates: tuple[str, ...] = ()


QueuedPod = Pod | BrokenPod | GangEntry


def relevant_update(old: QueuedPod, new: QueuedPod) -> bool:
    """Status-only changes (our own condition patch) must not retrigger the pod."""
    if isinstance(old, GangEntry) and isinstance(new, GangEntry):
        return old.revision != new.revision or old.scheduling_gates != new.scheduling_gates
    if isinstance(old, Pod) and isinstance(new, Pod):
        masked = dataclasses.replace(
            new, phase=old.phase, nominated_node_name=old.nominated_node_name
        )
        return masked != old
    return old != new
