"""What preemption keeps between cycles, and the writes that carry one out.

The choice of victims is the pure core's (:mod:`scheduler.core.preemption` for a pod,
:mod:`scheduler.solver.preempt` for a gang); it reads what is kept here, fed by the watch:
PodDisruptionBudgets (their ``status.disruptionsAllowed``), each pod's facts (start time,
terminating by preemption, ``preemptionPolicy``; only non-default ones, re-parsed only
when what they are read from changed) and the nominations (pending pods and the node a
preemption, ours or a previous leader's, reserved for them). A nomination counts for pods
of lower or equal priority in later cycles until its pod binds, is deleted or is nominated
elsewhere; a preemption ends the nominations of lower-priority pods to its nodes.

The writes (:meth:`Preemptor.evict`) are kube's ``prepareCandidate``: per victim
concurrently the ``DisruptionTarget`` condition (reason ``PreemptionByScheduler``), then a
DELETE with its uid precondition and default grace period, then a ``Preempted`` Event
naming the preemptor; then the ended nominations are cleared in the API. A failed write is
logged; the preemptor retries on its next cycle like any Unschedulable pod.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from scheduler.control.kubeio import KubeWriter, PodRef
from scheduler.control.kubeio import api_now as dt_now
from scheduler.control.reporter import Reporter
from scheduler.core.reclaim import Reclaimed
from scheduler.model.errors import InvalidObjectError
from scheduler.model.pdb import PodDisruptionBudget
from scheduler.model.pod import Pod
from scheduler.model.pod_facts import DISRUPTION_TARGET, PREEMPTION_BY_SCHEDULER, PodFacts

Body = Mapping[str, Any]

_NO_FACTS = PodFacts()


def ident(body: Body) -> str:
    """A pod body's :attr:`Pod.key` (its uid; namespace/name without one): what facts and
    nominations are kept by, as preemption looks them up."""
    meta = body.get("metadata") or {}
    return str(meta.get("uid") or "") or f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def _facts_inputs(body: Body) -> tuple[object, ...]:
    """What :meth:`PodFacts.from_api` reads, cheaply: re-parsed only when this changes."""
    meta = body.get("metadata") or {}
    status = body.get("status") or {}
    target = None
    if meta.get("deletionTimestamp") is not None:
        for cond in status.get("conditions") or ():
            if isinstance(cond, Mapping) and cond.get("type") == DISRUPTION_TARGET:
                target = (cond.get("status"), cond.get("reason"))
                break
    return (
        status.get("startTime"),
        meta.get("deletionTimestamp") is not None,
        target,
        (body.get("spec") or {}).get("preemptionPolicy"),
    )


class Preemptor:
    """Budgets, pod facts and nominations, and the eviction writes (see the module)."""

    def __init__(
        self,
        *,
        writer: KubeWriter | None,
        reporter: Reporter | None,
        scheduler_name: Callable[[], str],
        log: Any,
    ) -> None:
        self.writer = writer
        self.reporter = reporter
        self._scheduler_name = scheduler_name
        """Read at each use: settings can rename the scheduler."""
        self.log = log
        self.pdbs: dict[str, PodDisruptionBudget] = {}
        """PodDisruptionBudgets by namespace/name (preemption spends their status)."""
        self.facts: dict[str, PodFacts] = {}
        """What preemption reads of pods beyond their records (only non-default facts), by
        :attr:`Pod.key` (the uid)."""
        self._facts_seen: dict[str, tuple[object, ...]] = {}
        self.nominations: dict[str, tuple[Pod, str]] = {}
        self.evicting: dict[str, set[str]] = {}
        """Preemptors (by :attr:`Pod.key`) whose victims (by key) were sent to eviction and
        not yet seen going (gone, or terminating). kube's async preemption keeps such a pod
        out of the cycle until its last victim goes (DefaultPreemption's PreEnqueue); here
        it may still be placed, but does not preempt again (:meth:`still_evicting`): a retry
        before the watch shows the deletions would find the victims in place and evict
        more pods for the same room."""
        self.releasing: dict[str, set[str]] = {}
        """Preemptors (by key) whose victims (by key) went, but whose devices may still be
        allocated to them: the resourceclaim controller unreserves and deallocates a gone
        pod's claims a moment later. Until it has, a retry finds the devices taken and no
        victim left to evict; kube then clears the nomination and a lower-priority pod may
        take the devices as they come free (:meth:`releasing_devices`)."""
        self._pending_seen: set[str] = set()
        """Pending pods (by uid) seen before: a gated pod's nomination counts only when it
        arrives by an update (see :meth:`note_nomination`)."""
        """Pending pods nominated to a node (by our preemption or their status), with it, by
        :attr:`Pod.key` (the uid)."""

    # -- budgets ------------------------------------------------------------------------
    def pdb_upserted(self, body: Body) -> None:
        """A PodDisruptionBudget; one that cannot be read is logged and left out (as if it
        did not exist), never fatal."""
        meta = body.get("metadata") or {}
        key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        try:
            pdb = PodDisruptionBudget.from_api(body)
        except (InvalidObjectError, ValueError, TypeError) as exc:
            self.log.warning("pdb_unreadable", pod=key, reason=str(exc))
            self.pdbs.pop(key, None)
            return
        self.pdbs[key] = pdb

    def pdb_deleted(self, body: Body) -> None:
        meta = body.get("metadata") or {}
        self.pdbs.pop(f"{meta.get('namespace', '')}/{meta.get('name', '')}", None)

    def pdb_keys(self) -> set[str]:
        """Budgets known (a re-list reconciles them)."""
        return set(self.pdbs)

    # -- pod facts ----------------------------------------------------------------------
    def note_facts(self, key: str, body: Body) -> None:
        """Start time, termination by preemption, preemptionPolicy: parsed only when one of
        them changed (a bound pod's status updates come through here)."""
        seen = _facts_inputs(body)
        if self._facts_seen.get(key) == seen:
            return
        self._facts_seen[key] = seen
        try:
            facts = PodFacts.from_api(body)
        except InvalidObjectError as exc:
            self.log.warning("pod_facts_unreadable", pod=key, reason=str(exc))
            facts = _NO_FACTS
        if facts == _NO_FACTS:
            self.facts.pop(key, None)
        else:
            self.facts[key] = facts
        if seen[1]:  # deletionTimestamp: terminating, the eligibility rule takes over
            self.victim_going(key, released=True)

    def forget_pod(self, key: str) -> None:
        self.facts.pop(key, None)
        self._facts_seen.pop(key, None)
        self._pending_seen.discard(key)
        self.end_nomination(key)
        self.evicting.pop(key, None)
        self.releasing.pop(key, None)
        self.victim_going(key, released=True)

    def pod_bound(self, key: str) -> None:
        """The pod is placed: no nomination, and no longer a pending pod seen."""
        self._pending_seen.discard(key)
        self.end_nomination(key)
        self.evicting.pop(key, None)
        self.releasing.pop(key, None)

    # -- evictions in flight ------------------------------------------------------------
    def evicting_for(self, preemptors: Sequence[str], victims: Sequence[str]) -> None:
        """These preemptors' victims were just sent to eviction."""
        if victims:
            for key in preemptors:
                self.evicting.setdefault(key, set()).update(victims)

    def victim_going(self, key: str, *, released: bool = False) -> None:
        """A victim is gone, terminating (``released``), or its eviction failed: nobody
        waits on it any more; a released one may still hold devices (:attr:`releasing`)."""
        for preemptor in [p for p, victims in self.evicting.items() if key in victims]:
            victims = self.evicting[preemptor]
            victims.discard(key)
            if released:
                self.releasing.setdefault(preemptor, set()).add(key)
            if not victims:
                del self.evicting[preemptor]

    def releasing_devices(self, key: str, holds: Callable[[str], bool]) -> bool:
        """Whether some victim of the pod's preemption went but still ``holds`` devices
        (a claim allocated to it): the pod then waits, nominated, as for a terminating
        victim, instead of finding no victim and losing its nomination. Victims that
        hold nothing any more are dropped."""
        victims = self.releasing.get(key)
        if not victims:
            return False
        still = {v for v in victims if holds(v)}
        if still:
            self.releasing[key] = still
            return True
        del self.releasing[key]
        return False

    def still_evicting(self, key: str) -> bool:
        """Whether the pod's last preemption still has a victim in place (see
        :attr:`evicting`)."""
        return key in self.evicting

    # -- nominations --------------------------------------------------------------------
    def note_nomination(self, pod: Pod) -> None:
        """A pending pod's record: a known nomination follows the new record (ours is newer
        than any status it may show); a pod nominated by its status (a previous leader,
        kube-scheduler before it was ours) counts as nominated there."""
        known = self.nominations.get(pod.key)
        first_sight = pod.key not in self._pending_seen
        self._pending_seen.add(pod.key)
        if known is not None:
            self.nominations[pod.key] = (pod, known[1])
        elif pod.nominated_node_name and not (first_sight and pod.scheduling_gates):
            # kube-scheduler 1.34 adds a pod's nomination when it enters the active queue
            # and on every update; a gated pod seen first (a restart, a new leader) goes
            # to unschedulablePods without it, and counts from its next update.
            self.nominations[pod.key] = (pod, pod.nominated_node_name)
        else:
            self.nominations.pop(pod.key, None)

    def end_nomination(self, key: str) -> None:
        self.nominations.pop(key, None)

    def nominated(self) -> list[tuple[Pod, str]]:
        """Pending pods and their nominated nodes, for cycles and preemption."""
        return list(self.nominations.values())

    def nominate(self, nominations: Sequence[tuple[Pod, str]]) -> list[Pod]:
        """Each pod nominated to its node now; the lower-priority pods nominated to those
        nodes lose their nomination, and are returned (to be cleared in the API)."""
        cleared: dict[str, Pod] = {}
        keys = {pod.key for pod, _ in nominations}
        for pod, node in nominations:
            self.nominations[pod.key] = (pod, node)
        for pod, node in nominations:
            for other, at in self.nominations.values():
                if at == node and other.priority < pod.priority and other.key not in keys:
                    cleared[other.key] = other
        for other in cleared.values():
            self.end_nomination(other.key)
        return list(cleared.values())

    # -- the writes ---------------------------------------------------------------------
    async def evict(
        self,
        preemptor: str,
        victims: Sequence[tuple[Pod, str]],
        cleared: Sequence[Pod],
        log: Any,
        *,
        reclaimed: Mapping[str, Reclaimed] | None = None,
        counted: Callable[[str, str], None] | None = None,
    ) -> None:
        """Mark, delete and announce each victim (on its node), then clear the ended
        nominations (see the module docstring). A victim in ``reclaimed`` (by
        :attr:`Pod.key`) was taken from another ElasticQuota: its Event says so, and
        ``counted(namespace, quota)`` is called once it is deleted."""
        taken = reclaimed or {}
        writer = self.writer
        assert writer is not None
        condition = {
            "type": DISRUPTION_TARGET,
            "status": "True",
            "reason": PREEMPTION_BY_SCHEDULER,
            "message": f"{self._scheduler_name()}: preempting to accommodate a higher priority pod",
            "lastTransitionTime": dt_now(),
        }

        async def one(victim: Pod, node: str) -> None:
            ref = PodRef(victim.namespace, victim.name, victim.uid)
            key = f"{victim.namespace}/{victim.name}"
            try:
                if not await writer.patch_pod_status(ref, {"conditions": [condition]}):
                    log.info("victim_gone", node=node, reason=key)
                    return
                if not await writer.delete_pod(ref):
                    log.info("victim_gone", node=node, reason=key)
                    return
            except Exception as exc:
                log.warning("victim_eviction_failed", node=node, reason=f"{key}: {exc!r}")
                self.victim_going(victim.key)  # as kube: the preemptor may try again
                return
            log.info("victim_deleted", node=node, reason=key)
            reclaim = taken.get(victim.key)
            if reclaim is not None and counted is not None:
                counted(reclaim.namespace, reclaim.quota)
            if self.reporter is not None:
                self.reporter.event(
                    ref,
                    reason="Preempted",
                    action="Preempting",
                    message=(
                        reclaim.message
                        if reclaim is not None
                        else f"Preempted by {preemptor} on node {node}"
                    ),
                )

        await asyncio.gather(*(one(v, node) for v, node in victims))
        for other in cleared:
            ref = PodRef(other.namespace, other.name, other.uid)
            try:
                await writer.patch_pod_status(ref, {"nominatedNodeName": None})
            except Exception as exc:
                log.warning("nomination_clear_failed", reason=f"{other.key}: {exc!r}")
