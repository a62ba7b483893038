"""DynamicResources' I/O after the decision: its binding-cycle step, and PostFilter's writes.

The step (:class:`DynamicResources`, one per binding, run by
:mod:`~scheduler.control.binding_cycle`): PreBind writes each claim of the decision's
:class:`~scheduler.core.dra.state.ClaimPlan` (finalizer, allocation, reservation; the claim
for extended resources created first), each written claim entering the state at once; then
(DRADeviceBindingConditions, 1.36+) waits until the allocated devices' binding conditions
are met. Its undo, kube's Unreserve: the assumed allocations forgotten and, once the PreBind
ran, the pod taken out of the claims' ``reservedFor`` and the claim made for its extended
resources deleted.

PostFilter (:meth:`DraBinding.deallocate`, :meth:`DraBinding.delete_stale_claim`): an
allocation no node can use given back, a claim an earlier attempt made for extended
resources deleted; the pod retried at once (after its backoff).

The API calls themselves are :mod:`~scheduler.control.dra`'s, through the
:class:`~scheduler.control.kubeio.KubeWriter`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from scheduler.control.binding_cycle import POD_GONE, Cycle, PreBindWaits
from scheduler.control.dra import DraObjects
from scheduler.control.dra import Kind as DraKind
from scheduler.control.kubeio import KubeWriter, PodRef
from scheduler.control.queue import ClusterEvent, ClusterEventType, SchedulingQueue
from scheduler.control.queued import QueuedPod
from scheduler.control.reporter import Reporter
from scheduler.control.settings import SchedulerSettings
from scheduler.control.transient import failure_of, written_or_failure
from scheduler.core.dra.binding import TIMED_OUT, Readiness, binding_check, has_binding_conditions
from scheduler.core.dra.extended import status_body
from scheduler.core.dra.objects import BINDING_CONDITIONS_SINCE_MINOR, ResourceClaim
from scheduler.core.dra.state import ClaimPlan, ClaimWrite
from scheduler.model.pod import Pod
from scheduler.obs.metrics import Metrics

Body = Mapping[str, Any]


class DraBinding:
    """The scheduler's DRA writes: what the per-pod steps and PostFilter share."""

    def __init__(
        self,
        *,
        objects: DraObjects,
        writer: KubeWriter | None,
        queue: SchedulingQueue[QueuedPod],
        reporter: Reporter | None,
        metrics: Metrics,
        waits: PreBindWaits,
        claim_written: Callable[[Body], None],
        settings: Callable[[], SchedulerSettings],
        wall_clock: Callable[[], float],
    ) -> None:
        self.objects = objects
        self.state = objects.state
        self.writer = writer
        self.queue = queue
        self.reporter = reporter
        self.metrics = metrics
        self.waits = waits
        self.claim_written = claim_written
        """Applies a claim as our own write returned it and wakes the pods it can help."""
        self.settings = settings
        self.wall_clock = wall_clock

    def step(self, plan: ClaimPlan) -> DynamicResources:
        """The binding-cycle step for one pod's claims."""
        return DynamicResources(self, plan)

    def binding_timeout(self) -> float | None:
        """DRADeviceBindingConditions (kube 1.36+): the binding timeout; None before,
        where no device with binding conditions is allocated."""
        settings = self.settings()
        if settings.profile.kube_minor < BINDING_CONDITIONS_SINCE_MINOR:
            return None
        return settings.profile.dynamic_resources.binding_timeout

    def _retry(self, pod: Pod, claim: str) -> None:
        """The pod retried at once (after its backoff), not only on the watch's echo."""
        self.queue.move_all_on_event(
            ClusterEvent(ClusterEventType.DRA_CHANGED, subject=f"{DraKind.CLAIM}/{claim}"),
            lambda p: isinstance(p, Pod) and p.uid == pod.uid,
        )

    async def deallocate(self, pod: Pod, claims: Sequence[ResourceClaim], log: Any) -> None:
        """kube's DynamicResources PostFilter: allocations no node can use are given back.

        The claim as written goes into the cache and the pod is retried at once (after its
        backoff), not only on the watch's echo: once in five such cases of the random DRA
        differential the echo left the pod waiting for the periodic flush (cause not found;
        kube 1.34.4 does the same, its pod keeping 'deallocation of ResourceClaim
        completed' for minutes)."""
        assert self.writer is not None
        for claim in claims:
            written, failed = await written_or_failure(
                self.writer.deallocate_claim(claim, pod_uid=pod.uid),
                f"deallocating resourceclaim {claim.namespace}/{claim.name}",
            )
            if failed is not None:
                log.warning("claim_deallocation_failed", reason=failed)
                continue
            if written is None:
                continue
            log.info("claim_deallocated", reason=f"{claim.namespace}/{claim.name}")
            self.claim_written(written)
            self._retry(pod, claim.name)

    async def delete_claim(self, namespace: str, name: str, uid: str, log: Any) -> bool:
        """Delete a claim made for a pod's extended resources; once deleted it leaves the
        state at once (the next attempt must not find it). False if that failed."""
        assert self.writer is not None
        failed = await failure_of(
            self.writer.delete_claim(namespace, name, uid),
            f"deleting resourceclaim {namespace}/{name}",
        )
        if failed is not None:
            log.warning("claim_deletion_failed", reason=failed)
            return False
        log.info("claim_deleted", reason=f"{namespace}/{name}")
        held = self.state.claims.get((namespace, name))
        if held is not None and held.uid == uid:
            self.state.remove_claim(namespace, name)
        return True

    async def delete_stale_claim(self, pod: Pod, claim: ResourceClaim, log: Any) -> None:
        """kube's PostFilter for extended resources: the claim an earlier attempt made is
        deleted, and the pod retried at once (after its backoff), as :meth:`deallocate`."""
        if await self.delete_claim(claim.namespace, claim.name, claim.uid, log):
            self._retry(pod, claim.name)


class DynamicResources:
    """DynamicResources' PreBind and Unreserve for one pod's claims (a binding-cycle
    :class:`~scheduler.control.binding_cycle.Step`)."""

    plugin = "DynamicResources"
    failed_event = "claim_binding_failed"
    gone_reason = "deleted while its devices bound"

    def __init__(self, io: DraBinding, plan: ClaimPlan) -> None:
        self._io = io
        self.plan = plan
        self.started = False
        """The PreBind ran (some claim may be reserved for the pod)."""
        self.made: tuple[str, str, str] | None = None
        """The claim created for the pod's extended resources (namespace, name, uid), which
        the undo deletes."""

    async def run(self, cycle: Cycle) -> str | None:
        self.started = True
        why = await self._bind_claims(cycle.log)
        if why is None:
            why = await self._await_binding_conditions(cycle)
        return why

    async def undo(self, cycle: Cycle) -> None:
        """kube's DynamicResources Unreserve: the allocations not yet written stop
        counting; after the PreBind, the pod leaves the claims' ``reservedFor`` (the
        allocations stay: a retry may reuse them, PostFilter gives back one no node can
        use), and the claim created for its extended resources is deleted (if that
        fails, the next attempt finds it and PostFilter deletes it)."""
        io = self._io
        io.state.forget(self.plan)
        if not self.started:
            return
        assert io.writer is not None
        pod, log = cycle.pod, cycle.log
        for write in self.plan.writes:
            if write.create is not None:
                made, self.made = self.made, None
                if made is not None:
                    await io.delete_claim(*made, log)
                continue
            failed = await failure_of(
                io.writer.unreserve_claim(write, pod_uid=pod.uid),
                f"unreserving resourceclaim {write.namespace}/{write.name}",
            )
            if failed is not None:
                log.warning("claim_unreserve_failed", reason=failed)

    async def _bind_claims(self, log: Any) -> str | None:
        """kube's DynamicResources PreBind: each claim's finalizer, allocation and
        reservation written before the binding; each written claim enters the state at
        once. None when done, else why not."""
        io, plan = self._io, self.plan
        assert io.writer is not None
        for write in plan.writes:
            taken = io.state.taken_since(write, plan.pod_uid)
            if taken:  # another allocation was written since the decision: never write twice
                io.metrics.dra_conflicts.inc()
                devices = ", ".join(f"{d.driver}/{d.pool}/{d.device}" for d in taken[:3])
                return f"resourceclaim {write.namespace}/{write.name}: {devices} allocated since"
            overspent = io.state.overspent(write) + io.state.capacity_overspent(write, plan.pod_uid)
            if overspent:  # a partition of the same device was written since the decision
                io.metrics.dra_conflicts.inc()
                return (
                    f"resourceclaim {write.namespace}/{write.name}: counters or capacity of "
                    f"{', '.join(overspent[:3])} allocated since"
                )
            if write.create is not None:
                failed = await self._create_extended_claim(write)
                if failed is not None:
                    return failed
                continue
            failed = await self._write_claim(write)
            if failed is not None:
                return failed
            if write.allocation is not None:
                io.metrics.dra_allocations.inc()
        log.info("claims_written", reason=f"{len(plan.writes)} claim(s)")
        return None

    async def _create_extended_claim(self, write: ClaimWrite) -> str | None:
        """kube's PreBind for the claim of a pod's extended resources: created, then its
        finalizer, allocation and reservation written like any claim's, then the pod's
        ``status.extendedResourceClaimStatus`` set. The created claim is remembered for
        the undo from its creation on. None when done, else why not."""
        io, plan = self._io, self.plan
        assert io.writer is not None
        assert write.create is not None
        created, failed = await written_or_failure(
            io.writer.create_claim(write.create.body, pod_uid=plan.pod_uid),
            "creating the claim for extended resources",
        )
        if failed is not None:
            return failed
        assert created is not None
        meta = created["metadata"]
        name, uid = str(meta["name"]), str(meta["uid"])
        self.made = (write.namespace, name, uid)
        io.claim_written(created)
        real = ClaimWrite(write.namespace, name, uid, write.allocation, stamp=write.stamp)
        failed = await self._write_claim(real)
        if failed is not None:
            return failed
        # The allocation is the written claim's now: the placeholder's assumption ends.
        io.state.forget(ClaimPlan(plan.pod_name, plan.pod_uid, (write,)))
        io.metrics.dra_allocations.inc()
        pod = PodRef(write.namespace, plan.pod_name, plan.pod_uid)
        return await failure_of(
            io.writer.set_extended_claim_status(pod, status_body(name, write.create.mappings)),
            f"updating pod {pod.namespace}/{pod.name} status",
        )

    async def _write_claim(self, write: ClaimWrite) -> str | None:
        """One claim's finalizer, allocation and reservation written; the written body
        enters the state at once, so the next decision sees it. None when done."""
        io, plan = self._io, self.plan
        assert io.writer is not None
        written, failed = await written_or_failure(
            io.writer.write_claim(write, pod_name=plan.pod_name, pod_uid=plan.pod_uid),
            f"writing resourceclaim {write.namespace}/{write.name}",
        )
        if failed is not None:
            return failed
        assert written is not None
        io.claim_written(written)
        return None

    def _claim_keys(self) -> list[tuple[str, str]]:
        """The claims the plan wrote, the extended-resources claim under its real name."""
        keys: list[tuple[str, str]] = []
        for write in self.plan.writes:
            if write.create is None:
                keys.append((write.namespace, write.name))
            elif self.made is not None:
                keys.append((self.made[0], self.made[1]))
        return keys

    async def _await_binding_conditions(self, cycle: Cycle) -> str | None:
        """kube's PreBind wait (DRADeviceBindingConditions, 1.36+): once the claims are
        written, wait until every binding condition of their allocated devices is True
        in the claims' ``status.devices`` (:func:`~scheduler.core.dra.binding.binding_check`).
        None when ready (or nothing to wait for); else why not: a failure condition
        True, the binding timeout (from the allocation's ``allocationTimestamp``, or
        from the start of the wait), a claim gone, or :data:`POD_GONE`.

        Watch-driven: the claims are read from the cache, which the ResourceClaim watch
        keeps current, on every claim change (and at least once a second, for the
        timeout); kube polls its informer cache every 5 s. It runs in the pod's binding
        task: the loop keeps scheduling other pods and binding them meanwhile."""
        io = self._io
        pod, node, log = cycle.pod, cycle.node, cycle.log
        timeout = io.binding_timeout()
        if timeout is None:
            return None
        keys = self._claim_keys()
        held = [io.state.claims.get(k) for k in keys]
        if not any(c is not None and has_binding_conditions(c.allocation) for c in held):
            return None
        log.info("binding_conditions_pending", node=node)
        if io.reporter is not None:
            io.reporter.event(
                PodRef(pod.namespace, pod.name, pod.uid),
                reason="BindingConditionsPending",
                message=f"waiting for binding conditions for device on node {node}",
                trace_id=cycle.trace_id,
            )
        loop = asyncio.get_running_loop()
        started = loop.time()
        outcome = "error"
        try:
            with io.waits.waiting(pod.uid) as alive:
                while True:
                    if not alive():
                        outcome = "gone"
                        return POD_GONE
                    waiting = ""
                    for namespace, name in keys:
                        claim = io.state.claims.get((namespace, name))
                        if claim is None:
                            return f'resourceclaim "{name}" not found'
                        check = binding_check(claim, now=io.wall_clock(), timeout=timeout)
                        if check.unusable:
                            failed = check.readiness is Readiness.FAILED
                            outcome = "failed" if failed else "timeout"
                            return check.message
                        if check.readiness is Readiness.WAITING:
                            waiting = name
                            break
                    if not waiting:
                        outcome = "ready"
                        log.info("binding_conditions_met", node=node)
                        return None
                    left = started + timeout - loop.time()
                    if left <= 0:
                        outcome = "timeout"
                        return f"{TIMED_OUT}: claim={waiting}"
                    await io.objects.claim_change(min(left, 1.0))
        finally:
            io.metrics.dra_binding_waits.labels(outcome).inc()
            io.metrics.dra_binding_wait_duration.observe(loop.time() - started)
