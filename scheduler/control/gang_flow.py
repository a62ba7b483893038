"""The gang flow: PodGroups and their members from the watch, to one joint placement.

It owns the gangs' state in this process: the :class:`~scheduler.control.gangs.GangBook`,
the PodGroup statuses last seen or written (and which gangs may need a new one), the
members whose bindings are in flight per committed plan, the one solver slot and the
latest plan per gang. Everything else it borrows: the scheduler's cache, queue, load
predictor, reporter and writer, passed in; and through :class:`Host`, what changes with
the settings (profile, seed, solver limits) and the binding path single pods share.

Theory of operation (one asyncio loop; see the table in :mod:`scheduler.control.gangs`):

* The scheduler's watch handlers tell it of members (``member_pending``, ``member_bound``,
  ``member_gone``) and PodGroups (``podgroup_upserted`` / ``podgroup_deleted``); each
  change ends in :meth:`GangFlow.sync`, which makes the queue hold what the gang's state
  says: one gated or ready entry, or, once admitted, the remaining members one by one.
* :meth:`GangFlow.schedule` runs in the scheduler's cycle: it builds the joint problem on
  the snapshot now, other pods' nominations counted as kube's filters count them; the
  solve runs in a worker thread, one gang at a time, while the loop keeps scheduling
  other pods; the commit re-checks every member against the cache as it is *then*,
  assumes all of them or none, and binds them concurrently. A plan the cache overtook
  (a race) is Unschedulable and retried after the gang's backoff, never an error.
* A member whose binding fails is re-placed within the plan's domain at once if it can
  be; otherwise it rejoins its gang, which is then partial and ranked first.
* A gang that does not fit may preempt (:mod:`scheduler.solver.preempt`): the victim
  search runs one trial at a time, each trial's problem built on the loop on the snapshot
  without the trial's pods, checked against the plan in hand and, only if that does not
  fit, solved in the worker thread (with the gang's own time limit). Only when a plan
  places the whole gang with exactly the victims gone are they evicted, through
  :meth:`Host.preempt_for` (the path of single-pod preemption): the members are nominated
  to the plan's nodes and the gang waits, unschedulable, for the deletions; it does not
  preempt again while a victim of its last preemption is still in the cache, and its
  commit ignores its own members' nominations (its plan replaces them).
* PodGroup statuses are written by :meth:`GangFlow.write_statuses` (the app's status
  loop), only for gangs marked dirty and only when the status changed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, Final, Protocol

from scheduler.control.cache import SchedulerCache
from scheduler.control.gangs import Gang, GangBook, GangEntry, GangPhase, entry_key, gang_of
from scheduler.control.kubeio import PODGROUP_GROUP, PODGROUP_VERSION, KubeWriter, PodRef
from scheduler.control.queue import PodKey, QueuedPodInfo, QueueName, SchedulingQueue, pod_key
from scheduler.control.queued import BrokenPod, QueuedPod, relevant_update
from scheduler.control.reporter import SCHEDULER_ERROR, UNSCHEDULABLE, Reporter
from scheduler.control.settings import SchedulerSettings
from scheduler.core.dra.state import ClaimPlan, DraState
from scheduler.core.explain import Decision
from scheduler.core.load import LoadView
from scheduler.core.preemption import Inputs
from scheduler.core.quota import QuotaContext, Rule, Verdict, charged, gang_room
from scheduler.core.reclaim import Reclaimed, Rules, reclaimed
from scheduler.core.schedule import Framework
from scheduler.core.volumes import gang_volume_refusal
from scheduler.model.errors import InvalidObjectError
from scheduler.model.gang import TOPOLOGY_SLICE_ANNOTATION, GangSpec, gang_key
from scheduler.model.names import CPU, MEMORY
from scheduler.model.pod import Pod
from scheduler.model.podgroup import (
    check_levels,
    gang_from_podgroup,
    podgroup_status,
    status_changed,
)
from scheduler.model.workload import (
    UPSTREAM_GROUP,
    UPSTREAM_PREFIX,
    UPSTREAM_VERSION,
    gang_from_upstream,
    initially_scheduled_status,
    is_upstream,
    object_name,
)
from scheduler.obs.logging import new_trace_id
from scheduler.obs.metrics import AttemptResult, Metrics
from scheduler.predict import LoadPredictor
from scheduler.solver import GangPlan, GangProblem, SolveStatus, build_problem, solve
from scheduler.solver.preempt import (
    GangPreemption,
    QuotaGate,
    VictimSearch,
    candidate_units,
    gang_rules,
    ineligible_reason,
    node_lookup,
    problem_without,
    quota_gate,
)

Body = Mapping[str, Any]


class Host(Protocol):
    """What the gang flow asks of its scheduler. Read at each use, never copied: the
    settings and the framework are replaced by ``apply_settings``; bindings go through
    the one path single pods take, so counters, metrics and events stay in one place."""

    @property
    def settings(self) -> SchedulerSettings: ...

    @property
    def framework(self) -> Framework: ...

    def decide(
        self,
        pod: Pod,
        *,
        restrict_to: frozenset[str] | None = None,
        ignore_nominated: frozenset[str] = frozenset(),
    ) -> Decision: ...

    def preemption_inputs(self) -> Inputs: ...

    def nominated(self) -> list[tuple[Pod, str]]: ...

    def quota_context(self, *, exclude: frozenset[str] = frozenset()) -> QuotaContext | None: ...

    def preempt_for(
        self,
        preemptor: str,
        nominations: Sequence[tuple[Pod, str]],
        victims: Sequence[Pod],
        log: Any,
        taken: Mapping[str, Reclaimed] | None = None,
    ) -> None: ...

    def end_nominations(self, keys: Sequence[str]) -> None: ...

    def bind(
        self,
        info: QueuedPodInfo[QueuedPod] | None,
        pod: Pod,
        node: str,
        annotations: dict[str, str],
        log: Any,
        trace_id: str,
        *,
        gang: str | None = None,
        gang_queued: tuple[float | None, int] | None = None,
        claim_plan: ClaimPlan | None = None,
    ) -> Coroutine[Any, Any, None]: ...


@dataclasses.dataclass(frozen=True, slots=True)
class Placed:
    """A member's re-check that found a node: where, its annotations, its claims' writes."""

    node: str
    annotations: dict[str, str]
    claims: ClaimPlan | None = None


def shared_unallocated_claim(members: Sequence[Pod], dra: DraState) -> str | None:
    """A claim two members name that is not allocated yet (``namespace/name``), or None.

    The commit allocates member by member: the first would allocate it and the next find
    it still being allocated. An allocated shared claim is fine (its nodeSelector is a
    filter, the same for every member)."""
    users: dict[tuple[str, str], int] = {}
    for member in members:
        names = set()
        for ref in member.resource_claims:
            name = member.claim_name(ref)
            if name:
                names.add((member.namespace, name))
        for key in names:
            users[key] = users.get(key, 0) + 1
    for key, count in sorted(users.items()):
        claim = dra.claims.get(key)
        if count > 1 and (claim is None or claim.allocation is None):
            return f"{key[0]}/{key[1]}"
    return None


class GangFlow:
    """Every gang of one scheduler, from its PodGroup and members to its bound plan."""

    def __init__(
        self,
        host: Host,
        *,
        cache: SchedulerCache,
        queue: SchedulingQueue[QueuedPod],
        load: LoadPredictor,
        metrics: Metrics,
        reporter: Reporter | None,
        writer: KubeWriter | None,
        clock: Callable[[], float],
        wall_clock: Callable[[], float],
        spawn: Callable[[Coroutine[Any, Any, None]], None],
        log: Any,
    ) -> None:
        self._host = host
        self._cache = cache
        self._queue = queue
        self._load = load
        self._metrics = metrics
        self._reporter = reporter
        self._writer = writer
        self._clock = clock
        self._wall_clock = wall_clock
        self._spawn = spawn
        self._log = log
        self.gangs = GangBook()
        self.dirty: set[str] = set()
        """Gangs whose PodGroup status may have changed since it was last written."""
        self._statuses: dict[str, dict[str, Any]] = {}
        """Per gang, the PodGroup status last seen in the watch or written by us."""
        self._binding: dict[str, set[str]] = {}
        """Members of a committed plan whose bindings are in flight, per gang."""
        self._solve_slot = asyncio.Semaphore(1)
        self.last_plans: dict[str, GangPlan] = {}
        self._level_refused: dict[str, Body] = {}
        """PodGroups refused only for a slice level that is not configured: read again
        when ``spec.topology.levels`` changes (:meth:`levels_changed`)."""
        self._slice_of: dict[str, dict[str, tuple[int, str]]] = {}
        """Per gang with slices, per member of its last commit: (slice, planned node), so
        a member whose binding fails is re-placed in its slice's domain with its slice."""
        """The latest plan per gang, for status and explanations."""
        self._victims: dict[str, set[tuple[PodKey, str]]] = {}
        """Per gang, the (key, uid) of the pods its last preemption evicted."""
        self._claim_plans: dict[str, ClaimPlan] = {}
        """Members assumed by a commit still in progress (by :attr:`Pod.key`): the claim
        allocations to forget if the commit rolls back."""

    def placed_members(self) -> tuple[dict[str, str], dict[str, tuple[Pod, ...]]]:
        """Placed gang members as preemption reads them (each gang evicted whole): pod key
        (uid) -> gang key, and gang key -> its placed members' records in the cache."""
        gangs: dict[str, str] = {}
        members: dict[str, tuple[Pod, ...]] = {}
        for gang in self.gangs:
            pods = [c.pod for k in gang.placed if (c := self._cache.cached_pod(k)) is not None]
            if not pods:
                continue
            members[gang.key] = tuple(pods)
            for pod in pods:
                gangs[pod.key] = gang.key
        return gangs, members

    def podgroup_keys(self, *, upstream: bool = False) -> set[str]:
        """Gangs with a PodGroup of one API (a re-list of that API reconciles them): the
        scheduler-plugins one, or with ``upstream`` Kubernetes' own, keyed by
        :func:`_group_key`."""
        return {
            g.key
            for g in self.gangs
            if (g.spec is not None or g.spec_error is not None) and is_upstream(g.name) == upstream
        }

    # -- watch side: PodGroups and members -------------------------------------
    def podgroup_upserted(self, body: Body, *, upstream: bool = False) -> None:
        """Its status is remembered (what we would write is compared with it); its spec
        changes the gang's revision only where a solve reads it. ``upstream``: a
        ``scheduling.k8s.io`` PodGroup (:mod:`scheduler.model.workload`)."""
        key = _group_key(body, upstream)
        gang = self.gangs.obtain(key)
        self._statuses[key] = dict(body.get("status") or {})
        self._level_refused.pop(key, None)
        try:
            spec: GangSpec | None = (
                gang_from_upstream(body) if upstream else gang_from_podgroup(body)
            )
            assert spec is not None
            try:
                topology = self._host.settings.topology
                source = (
                    "spec.topology.levels"
                    if topology.from_kueue is None
                    else f"the levels of Kueue Topology {topology.from_kueue}"
                )
                check_levels(spec, topology.levels, source=source)
            except InvalidObjectError:
                self._level_refused[key] = body
                raise
            error = None
        except InvalidObjectError as exc:
            spec, error = None, str(exc)
            self._log.warning("podgroup_unreadable", gang=key, reason=error)
        if spec == gang.spec and error == gang.spec_error:
            return  # a status write (ours, mostly): nothing a solve reads changed
        solve_inputs_changed = (
            spec is None
            or gang.spec is None
            or dataclasses.replace(spec, schedule_start_time=None, generation=None)
            != dataclasses.replace(gang.spec, schedule_start_time=None, generation=None)
        )
        gang.spec, gang.spec_error = spec, error
        if solve_inputs_changed:
            gang.revision += 1
        self.sync(key)

    def levels_changed(self) -> None:
        """``spec.topology.levels`` changed: PodGroups refused for their slice level are
        read again (gangs whose slice level went away are refused at their next solve)."""
        for key, body in list(self._level_refused.items()):
            self.podgroup_upserted(body, upstream=is_upstream(key.split("/", 1)[1]))

    def podgroup_deleted(self, body: Body, *, upstream: bool = False) -> None:
        """The gang is kept while it has members: they wait, gated, for a PodGroup."""
        key = _group_key(body, upstream)
        gang = self.gangs.get(key)
        if gang is None:
            return
        gang.spec, gang.spec_error = None, None
        gang.revision += 1
        self._statuses.pop(key, None)
        self._victims.pop(key, None)
        self._slice_of.pop(key, None)
        self._level_refused.pop(key, None)
        self.sync(key)
        self.gangs.discard_if_idle(key)

    def member_pending(self, gkey: str, key: PodKey, queued: QueuedPod) -> None:
        """A pending member of ours, parsed or not: queued through its gang, never alone
        before admission."""
        gang = self.gangs.obtain(gkey)
        old = gang.pending.get(key)
        gang.placed.discard(key)
        if old is None or relevant_update(old, queued):
            gang.revision += 1
        gang.pending[key] = queued
        self.sync(gkey)

    def member_bound(self, gkey: str, key: PodKey, body: Body) -> None:
        """A member on a node, bound by anyone: it counts as placed (and as running)."""
        if (body.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            self.member_gone(gkey, key)  # finished: it holds nothing any more
            return
        gang = self.gangs.obtain(gkey)
        changed = gang.pending.pop(key, None) is not None or key not in gang.placed
        gang.placed.add(key)
        running = (body.get("status") or {}).get("phase") == "Running"
        if running != (key in gang.running):
            changed = True
            (gang.running.add if running else gang.running.discard)(key)
        if changed:
            self.sync(gkey)

    def member_gone(self, gkey: str, key: PodKey) -> None:
        """A member deleted or finished: it counts neither for quorum nor as placed."""
        gang = self.gangs.get(gkey)
        if gang is None:
            return
        was = gang.pending.pop(key, None) is not None
        was = (key in gang.placed) or was
        gang.placed.discard(key)
        gang.running.discard(key)
        gang.reported.pop(key, None)
        if was:
            gang.revision += 1
            self.sync(gkey)
        self.gangs.discard_if_idle(gkey)

    def note_bound_members(self, bodies: list[dict[str, Any]]) -> None:
        """Bound pods from a full list (start-up, re-list): count them in their gangs, so
        a new leader knows which gangs are partial."""
        for body in bodies:
            meta = body.get("metadata") or {}
            namespace = str(meta.get("namespace", ""))
            gang = gang_of(body)
            if gang is not None:
                self.member_bound(gang, pod_key(namespace, str(meta.get("name", ""))), body)

    def sync(self, gkey: str) -> None:
        """Make the queue hold what the gang's state says (see the table in gangs.py)."""
        gang = self.gangs.get(gkey)
        if gang is None:
            return
        gang.placed = {k for k in gang.placed if self._cache.cached_pod(k) is not None}
        self.dirty.add(gkey)
        if not gang.short:
            gang.short_since, gang.boost_ended = None, False
        elif gang.short_since is None:
            gang.short_since = self._clock()
        ekey = entry_key(gkey)
        queued = self._queue.get(ekey)
        phase = gang.phase
        if phase is GangPhase.READY and gang.quorum_at is None:
            gang.quorum_at = self._clock()
        if phase is GangPhase.READY and gang.started_wall is None:
            gang.started_wall = self._wall_clock()
        if phase is GangPhase.ADMITTED:
            if queued is not None and self._queue.where(ekey) is not QueueName.IN_FLIGHT:
                self._queue.delete(queued.pod)
            for key, member in gang.pending.items():
                if key not in self._queue:
                    self._queue.add(member)
            return
        for key, member in gang.pending.items():
            where = self._queue.where(key)
            if where is not None and where is not QueueName.IN_FLIGHT:
                self._queue.delete(member)
        if not gang.pending:
            if queued is not None and self._queue.where(ekey) is not QueueName.IN_FLIGHT:
                self._queue.delete(queued.pod)
            return
        entry = gang.entry()
        if queued is None:
            self._queue.add(entry)
        else:
            self._queue.update(entry)
        if phase in (GangPhase.MISSING, GangPhase.WAITING):
            self._report_waiting(gang, phase)

    def _report_waiting(self, gang: Gang, phase: GangPhase) -> None:
        """Once per member and phase: why it waits (no PodGroup, or no quorum yet)."""
        message = gang.waiting_message()
        for key, member in gang.pending.items():
            if gang.reported.get(key) == phase.value:
                continue
            gang.reported[key] = phase.value
            if self._reporter is not None:
                ref = PodRef(member.namespace, member.name, member.uid)
                self._reporter.failed(ref, message, trace_id=new_trace_id())

    def boost_limit(self, gang: Gang) -> int:
        """Seconds a partial gang ranks ahead of every pod: its PodGroup's
        scheduleTimeoutSeconds, else the scheduler's ``spec.gang.partialBoostSeconds``."""
        spec = gang.spec
        if spec is not None and spec.schedule_timeout_s is not None:
            return spec.schedule_timeout_s
        return self._host.settings.gang.partial_boost_s

    def timeouts(self, now_wall: float) -> None:
        """Mark gangs whose scheduleTimeoutSeconds passed unadmitted (status Failed), and
        end the partial boost of gangs short of minMember for longer than its limit."""
        now = self._clock()
        for gang in self.gangs:
            since = gang.short_since
            if since is not None and not gang.boost_ended and now - since > self.boost_limit(gang):
                gang.boost_ended = True
                self._log.warning(
                    "gang_boost_ended",
                    gang=gang.key,
                    reason=f"partial for more than {self.boost_limit(gang)} s",
                )
                self.sync(gang.key)
            spec = gang.spec
            if (
                spec is None
                or spec.schedule_timeout_s is None
                or gang.timed_out
                or gang.phase is GangPhase.ADMITTED
            ):
                continue
            start = spec.schedule_start_time
            if start is not None and now_wall - start > spec.schedule_timeout_s:
                gang.timed_out = True
                gang.revision += 1
                self._log.warning("gang_timed_out", gang=gang.key)
                self.sync(gang.key)
                self._event(
                    gang,
                    "ScheduleTimeout",
                    f"not admitted within scheduleTimeoutSeconds "
                    f"({spec.schedule_timeout_s}); still retrying: {gang.last_message}",
                )

    # -- scheduling side: solve, commit, bind, report ---------------------------
    def schedule(self, info: QueuedPodInfo[QueuedPod]) -> None:
        """Build the gang's joint problem on the snapshot now; solve and commit later."""
        started = time.perf_counter()
        entry = info.pod
        assert isinstance(entry, GangEntry)
        gang = self.gangs.get(entry.gang)
        trace_id = new_trace_id()
        log = self._log.bind(
            gang=entry.gang,
            attempt=info.attempts,
            cycle=self._queue.scheduling_cycle,
            trace_id=trace_id,
        )
        if gang is None or gang.phase is GangPhase.ADMITTED:
            self._queue.done(info)
            if gang is not None:
                self.sync(gang.key)
            return
        if gang.phase is not GangPhase.READY or gang.spec is None:
            # Lost its quorum or PodGroup while queued: back to waiting (gated).
            self._queue.requeue_after_failure(info, unschedulable=False, reason="not ready")
            return
        members = gang.ready_members()
        need = gang.need
        broken = [p for p in gang.pending.values() if isinstance(p, BrokenPod)]
        if len(members) < need:
            detail = "; ".join(f"{b.namespace}/{b.name}: {b.error}" for b in broken)
            message = (
                f"gang {gang.key}: {len(members)}/{need} members can be placed: "
                f"unreadable members: {detail or 'none'}"
            )
            self._failed(info, gang, message, log, started, unschedulable=False)
            return
        shared = shared_unallocated_claim(members, self._cache.dra)
        if shared is not None:  # a claim change (its allocation) wakes the gang
            message = (
                f"gang {gang.key}: resourceclaim {shared} is shared by several members and "
                "not allocated yet; Lattice places gangs whose members have claims of their "
                "own (templates) or share an allocated claim"
            )
            self._failed(info, gang, message, log, started, unschedulable=True)
            return
        if any(m.storage_volumes for m in members):
            refusal = gang_volume_refusal(members, self._cache.volumes)
            if refusal is not None:  # a storage change wakes the gang
                self._failed(
                    info, gang, f"gang {gang.key}: {refusal}", log, started, unschedulable=True
                )
                return
        members, verdict = self._quota_admitted(gang.namespace, members, need)
        refusal = verdict.message if not verdict.admitted else ""
        gate: QuotaGate | None = None
        if refusal:  # a pod of a quota namespace finishing, or a quota change, wakes it
            members = members[:need]
            message = f"gang {gang.key}: {refusal}"
            if verdict.rule is Rule.MIN:  # the sum of mins: reclaim may serve it
                inputs = self._host.preemption_inputs()
                gate = quota_gate(members, inputs)
                rules = gang_rules(members, inputs) if gate is None else None
                if rules is not None:  # why it may not
                    message = rules.noted(message)
            if gate is None:  # it waits
                self._failed(info, gang, message, log, started, unschedulable=True)
                return
        built = time.perf_counter()
        try:
            problem = build_problem(
                self._host.framework,
                self._cache.snapshot,
                gang.spec,
                members,
                need=need,
                topology=self._cache.topology,
                load=LoadView(self._load, self._wall_clock()),
                seed=self._host.settings.seed,
                volumes=self._cache.volumes,
                nominated=self._host.nominated(),
                dra=self._cache.dra,
                levels=self._host.settings.topology.levels,
                home=self._bound_domain(gang),
                slice_bound=self._bound_slices(gang),
                bound_nodes=self._bound_nodes(gang),
            )
        except Exception as exc:  # a bug must cost the gang a retry, not the scheduler
            log.exception("gang_cycle_failed", reason=repr(exc))
            self._failed(info, gang, f"internal error: {exc}", log, started, unschedulable=False)
            return
        log.info(
            "gang_problem_built",
            reason=f"{len(members)} members, need {need}",
            duration_ms=round((time.perf_counter() - built) * 1000, 3),
        )
        if gate is not None:
            self._spawn(
                self._reclaim(info, gang.key, members, problem, gate, refusal, log, started)
            )
            return
        self._spawn(
            self._solve_and_commit(info, gang.key, members, problem, log, trace_id, started)
        )

    async def _reclaim(
        self,
        info: QueuedPodInfo[QueuedPod],
        gkey: str,
        members: list[Pod],
        problem: GangProblem,
        gate: QuotaGate,
        refusal: str,
        log: Any,
        started: float,
    ) -> None:
        """A gang its quota refused while within its min (the other quotas borrow the sum
        of mins): evict borrowers' pods so that the quota admits it and it fits, else it
        waits with the quota's refusal."""
        message = f"gang {gkey}: {refusal}"
        try:
            handled = await self._preempt(info, gkey, members, problem, message, log, started, gate)
        except Exception as exc:  # a bug in reclaim costs the gang its reclaim
            log.exception("gang_preemption_failed", reason=repr(exc))
            handled = False
        if not handled and (gang := self.gangs.get(gkey)) is not None:
            self._failed(info, gang, message, log, started, unschedulable=True)
        elif not handled:
            self._queue.done(info)

    async def _solve_and_commit(
        self,
        info: QueuedPodInfo[QueuedPod],
        gkey: str,
        members: list[Pod],
        problem: GangProblem,
        log: Any,
        trace_id: str,
        started: float,
    ) -> None:
        """``started``: when the attempt began (its pop), for the cycle's duration."""
        cfg = self._host.settings.gang
        try:
            async with self._solve_slot:
                # OR-tools releases the GIL: the loop keeps scheduling ordinary pods.
                plan = await asyncio.to_thread(
                    solve,
                    problem,
                    time_limit_s=cfg.solver_time_limit_s,
                    seed=self._host.settings.seed,
                    use_solver=cfg.use_solver,
                )
        except Exception as exc:
            log.exception("gang_solve_failed", reason=repr(exc))
            gang = self.gangs.get(gkey)
            if gang is not None:
                self._failed(
                    info, gang, f"internal error: {exc}", log, started, unschedulable=False
                )
            else:
                self._queue.done(info)
            return
        self._metrics.gang_attempts.labels(outcome=plan.status.value).inc()
        self._metrics.gang_solve_duration.observe(plan.solve_time_s)
        self._note_invalid(plan, log)
        self.last_plans[gkey] = plan
        gang = self.gangs.get(gkey)
        if gang is None:
            self._queue.done(info)
            return
        if plan.status is SolveStatus.INVALID:
            # Our bug, not the cluster's answer: no preemption on its word; retry (backoff).
            self._failed(info, gang, plan.message, log, started, unschedulable=False)
            return
        if not plan.admitted:
            try:
                handled = await self._preempt(
                    info, gkey, members, problem, plan.message, log, started
                )
            except Exception as exc:  # a bug in preemption costs the gang its preemption
                log.exception("gang_preemption_failed", reason=repr(exc))
                handled = False
            if not handled and (gang := self.gangs.get(gkey)) is not None:
                self._failed(info, gang, plan.message, log, started, unschedulable=True)
            elif not handled:
                self._queue.done(info)
            return
        self._victims.pop(gkey, None)
        self._commit(info, gang, members, plan, log, trace_id, started)

    def _note_invalid(self, plan: GangPlan, log: Any) -> None:
        """A plan that broke its own problem's rules (``solve`` replaced it or admitted
        nothing): logged with its gang (bound in ``log``) and counted."""
        if not plan.rejected:
            return
        self._metrics.gang_invalid_plans.inc()
        log.warning(
            "gang_plan_invalid",
            reason=f"{plan.status.value}: " + "; ".join(plan.rejected[:5]),
        )

    def _victims_left(self, gkey: str) -> int:
        """Pods the gang's last preemption evicted that the cache still holds."""
        victims = self._victims.get(gkey)
        if not victims:
            return 0
        left = {
            (k, uid)
            for k, uid in victims
            if (c := self._cache.cached_pod(k)) is not None and c.pod.uid == uid
        }
        if left:
            self._victims[gkey] = left
        else:
            del self._victims[gkey]
        return len(left)

    async def _preempt(
        self,
        info: QueuedPodInfo[QueuedPod],
        gkey: str,
        members: list[Pod],
        problem: GangProblem,
        failed: str,
        log: Any,
        started: float,
        gate: QuotaGate | None = None,
    ) -> bool:
        """After a solve that could not place the gang (``failed``: its message): wait for
        the last preemption's victims, or search for victims whose eviction lets the whole
        gang fit and evict them. ``gate``: reclaim for a gang its quota refused (a trial
        counts only where the quota admits it). True when the attempt's outcome was
        reported here."""
        gang = self.gangs.get(gkey)
        if gang is None or gang.spec is None:
            return False
        spec, need = gang.spec, gang.need
        left = self._victims_left(gkey)
        if left:
            message = f"{failed}; waiting for {left} preempted pods to terminate"
            self._failed(info, gang, message, log, started, unschedulable=True)
            return True
        host = self._host
        snapshot = self._cache.snapshot
        inputs = host.preemption_inputs()
        reason = ineligible_reason(snapshot, members, inputs)
        if reason is not None:
            self._failed(
                info,
                gang,
                f"{failed} preemption: {reason}",
                log,
                started,
                unschedulable=True,
            )
            return True
        self._metrics.preemption_attempts.inc()
        reps = [members[c.members[0]] for c in problem.classes] or None
        seed = host.settings.seed
        units = candidate_units(
            host.framework,
            snapshot,
            members,
            inputs,
            own_gang=gkey,
            representatives=reps,
            seed=seed,
        )
        search = VictimSearch(units, inputs, node_lookup(snapshot), gate=gate)
        cfg = host.settings.gang
        while (removed := search.trial()) is not None:
            why = gate.refusal(removed) if gate is not None else None
            if why is not None:  # the quota still refuses: no solve can help
                rejected = dataclasses.replace(problem, rejection=why)
                if search.needs_solve(rejected):
                    search.tell(solve(rejected))  # at once: a rejection is not searched
                await asyncio.sleep(0)
                continue
            trial = problem_without(
                host.framework,
                self._cache.snapshot,
                spec,
                members,
                removed,
                need=need,
                topology=self._cache.topology,
                load=LoadView(self._load, self._wall_clock()),
                seed=seed,
                volumes=self._cache.volumes,
                nominated=host.nominated(),
                dra=self._cache.dra,
                levels=host.settings.topology.levels,
                home=self._bound_domain(gang),
                slice_bound=self._bound_slices(gang),
                bound_nodes=self._bound_nodes(gang),
            )
            if not search.needs_solve(trial):
                await asyncio.sleep(0)  # the plan in hand decided: let the loop run between
                continue
            # Every trial gets the gang's own limit: a shorter one only times out big gangs,
            # and a timeout spares its unit (the search never evicts on one).
            async with self._solve_slot:
                plan = await asyncio.to_thread(
                    solve,
                    trial,
                    time_limit_s=cfg.solver_time_limit_s,
                    seed=seed,
                    use_solver=cfg.use_solver,
                )
            self._note_invalid(plan, log)
            search.tell(plan)
        found = search.result()
        gang = self.gangs.get(gkey)
        if gang is None:
            return False
        if found is None:
            # As kube for a pod: no eviction helps, so the members' nominations end.
            was = {p.key for p, _ in inputs.nominated} | {
                m.key for m in members if m.nominated_node_name
            }
            ended = [m for m in members if m.key in was]
            host.end_nominations([m.key for m in ended])
            message = f"{failed} preemption: {search.message}"
            rules = gang_rules(members, inputs)
            if rules is not None:  # as for a pod: why not other quotas' pods
                message = rules.noted(message)
            cleared = {pod_key(m.namespace, m.name): "" for m in ended}
            self._failed(
                info, gang, message, log, started, unschedulable=True, nominated=cleared or None
            )
            return True
        still = [
            m
            for m in members
            if getattr(gang.pending.get(pod_key(m.namespace, m.name)), "uid", None) == m.uid
        ]
        if len(still) != len(members) or gang.need != need:
            return False  # the gang changed while the search ran: try again from the start
        self._evict(
            info, gang, members, found, log, started, gang_rules(members, inputs), reclaim=gate
        )
        return True

    def _evict(
        self,
        info: QueuedPodInfo[QueuedPod],
        gang: Gang,
        members: list[Pod],
        found: GangPreemption,
        log: Any,
        started: float,
        rules: Rules | None = None,
        *,
        reclaim: QuotaGate | None = None,
    ) -> None:
        """Evict ``found``'s victims and nominate the members to its plan's nodes; the gang
        waits (unschedulable) for the deletions, which move it. Victims of other quotas
        get the reclaim event naming the gang's quota and PodGroup."""
        nominations = [(members[i], node) for i, node in found.plan.placements]
        victims = found.victims
        self._victims[gang.key] = {(pod_key(v.namespace, v.name), v.uid) for v in victims}
        log.info(
            "gang_reclaiming" if reclaim is not None else "gang_preempting",
            reason=f"{len(victims)} victims ({found.units} units, {found.trials} solves, "
            f"{found.checks} checks): " + ", ".join(f"{v.namespace}/{v.name}" for v in victims),
        )
        preemptor = f"PodGroup {gang.key}"
        taken: dict[str, Reclaimed] = {}
        if rules is not None:  # the gang's rules: its lowest-priority member as preemptor
            snapshot = self._cache.snapshot
            for v in victims:
                node = snapshot.node_of_pod(v.key) or ""
                taken.update(reclaimed(rules, [v], node, preemptor=preemptor))
        self._host.preempt_for(preemptor, nominations, victims, log, taken or None)
        nodes = found.nodes
        what = (
            f"reclaiming {len(victims)} pods of quotas above their min"
            if reclaim is not None
            else f"preempting {len(victims)} lower-priority pods"
        )
        self._event(
            gang,
            "Preempting",
            f"{what} so that {found.plan.placed} members "
            f"fit on {len(nodes)} nodes ({', '.join(nodes)})",
            warning=False,
        )
        message = f"gang {gang.key}: {what}; waiting for them to terminate"
        nominated = {pod_key(m.namespace, m.name): node for m, node in nominations}
        self._failed(info, gang, message, log, started, unschedulable=True, nominated=nominated)

    def _bound_domain(self, gang: Gang) -> str | None:
        """The required key's value on the node of a member bound already (None: no
        required key, or no member bound): a partial gang's rest must join it there."""
        key = gang.spec.topology_key if gang.spec is not None else None
        if not key:
            return None
        for member in sorted(gang.placed):
            cached = self._cache.cached_pod(member)
            node = self._cache.snapshot.get_node(cached.node) if cached is not None else None
            if node is not None and (value := node.labels.get(key)) is not None:
                return value
        return None

    def _bound_nodes(self, gang: Gang) -> list[str]:
        """The nodes of the members bound already: a partial gang's rest goes near them
        at its preferred level."""
        out: list[str] = []
        for member in sorted(gang.placed):
            cached = self._cache.cached_pod(member)
            if cached is not None and cached.node:
                out.append(cached.node)
        return out

    def _bound_slices(self, gang: Gang) -> list[tuple[str, int]]:
        """(value of the slice level, slice) per bound member with a slice annotation:
        a partial gang's rest completes the slices they are short of."""
        key = gang.spec.slice_key if gang.spec is not None else None
        if not key:
            return []
        out: list[tuple[str, int]] = []
        for member in sorted(gang.placed):
            cached = self._cache.cached_pod(member)
            if cached is None:
                continue
            raw = (cached.annotations or {}).get(TOPOLOGY_SLICE_ANNOTATION)
            if raw is None:
                raw = cached.pod.annotations.get(TOPOLOGY_SLICE_ANNOTATION)
            node = self._cache.snapshot.get_node(cached.node)
            value = node.labels.get(key) if node is not None else None
            if raw is not None and raw.isdigit() and value is not None:
                out.append((value, int(raw)))
        return out

    def _domain_nodes(self, gang: Gang, node: str, key: str | None = None) -> frozenset[str] | None:
        """The nodes of ``node``'s domain of ``key``, by default the gang's required
        topology key (None: no constraint)."""
        if key is None:
            key = gang.spec.topology_key if gang.spec is not None else None
        if not key:
            return None
        home = self._cache.snapshot.get_node(node)
        value = home.labels.get(key) if home is not None else None
        if value is None:
            return frozenset()
        return frozenset(n.name for n in self._cache.snapshot.nodes() if n.labels.get(key) == value)

    def _place_member(
        self,
        pod: Pod,
        preferred: str | None,
        domain: frozenset[str] | None,
        own: frozenset[str] = frozenset(),
    ) -> Placed | str:
        """Re-check one member against the cache as it is now: its planned node if it
        still fits, else any node of the plan's domain. A node, its annotations and its
        claims' allocations, or why not. ``own``: the gang's members, whose nominations
        (from a preemption) the plan replaces."""
        tries: list[frozenset[str] | None] = [domain]
        if preferred is not None:
            tries.insert(0, frozenset({preferred}))
        summary = ""
        for restrict in tries:
            decision = self._host.decide(pod, restrict_to=restrict, ignore_nominated=own)
            if decision.volume_plan is not None:  # a claim unbound since the gang was checked
                return f"{pod.namespace}/{pod.name}: a claim is no longer bound"
            if decision.selected is not None:
                return Placed(decision.selected, dict(decision.annotations), decision.claim_plan)
            summary = decision.summary
        return summary

    def _assume_member(self, gang: Gang, pod: Pod, placed: Placed) -> None:
        """The member counts on its node, and its claims' devices as used (kube's Reserve),
        so the next member's re-check allocates around them."""
        key = pod_key(pod.namespace, pod.name)
        self._cache.assume(pod, placed.node, placed.annotations)
        if placed.claims is not None:
            self._cache.dra.assume(placed.claims)
            self._claim_plans[pod.key] = placed.claims
        requests = pod.resources.requests
        self._load.note_placement(
            placed.node, key, requests.get(CPU, 0), requests.get(MEMORY, 0), self._wall_clock()
        )
        gang.pending.pop(key, None)
        gang.placed.add(key)

    def _unassume_member(self, gang: Gang, pod: Pod) -> None:
        key = pod_key(pod.namespace, pod.name)
        self._cache.forget(pod)
        claims = self._claim_plans.pop(pod.key, None)
        if claims is not None:
            self._cache.dra.forget(claims)
        self._load.forget_pod(key)
        gang.placed.discard(key)
        gang.pending[key] = pod

    def _quota_admitted(
        self, namespace: str, members: list[Pod], need: int
    ) -> tuple[list[Pod], Verdict]:
        """CapacityScheduling for a gang: its quorum is admitted against its namespace's
        ElasticQuota as one unit or not at all (members, the quorum's verdict), and only as
        many more members as the quota admits go to the solver, so no plan can pass
        ``max``."""
        context = self._host.quota_context(exclude=frozenset(m.key for m in members))
        if context is None or not context.snapshot.governs(namespace) or need <= 0:
            return members, Verdict(Rule.NO_QUOTA)
        count, verdict = gang_room(
            context.snapshot,
            namespace,
            [charged(m, self._cache.dra) for m in members],
            need,
            priority=min(m.priority for m in members),
            nominated=context.others(""),
        )
        if count == 0:
            return members, verdict
        return members[:count], verdict

    def _commit(
        self,
        info: QueuedPodInfo[QueuedPod],
        gang: Gang,
        members: list[Pod],
        plan: GangPlan,
        log: Any,
        trace_id: str,
        started: float,
    ) -> None:
        """All members assumed, or none: the plan is re-checked against the cache as it is
        now (ordinary pods were placed while the solver ran)."""
        assumed: list[tuple[Pod, Placed]] = []
        domain: frozenset[str] | None = None
        failure = ""
        own = frozenset(m.key for m in members)
        slices = dict(plan.slices)
        slice_key = gang.spec.slice_key if gang.spec is not None else None
        planned_members = [members[i] for i, _ in plan.placements]
        kept, verdict = self._quota_admitted(gang.namespace, planned_members, gang.need)
        refusal = verdict.message if not verdict.admitted else ""
        if refusal or len(kept) < len(planned_members):
            # Quota used while the solver ran: the plan as a whole is no longer admitted.
            message = (
                f"gang {gang.key}: the plan no longer fits: {refusal or 'quota used meanwhile'}"
            )
            self._failed(info, gang, message, log, started, unschedulable=True, race=True)
            return
        for index, planned in plan.placements:
            pod = members[index]
            key = pod_key(pod.namespace, pod.name)
            current = gang.pending.get(key)
            if not isinstance(current, Pod) or current.uid != pod.uid:
                continue  # left the gang (deleted, recreated) while the solver ran
            if domain is None:
                domain = self._domain_nodes(gang, planned)
            where = domain
            if index in slices and slice_key:
                # A member re-checked elsewhere stays in its slice's domain.
                inside = self._domain_nodes(gang, planned, slice_key)
                where = inside if domain is None or inside is None else domain & inside
            placed = self._place_member(current, planned, where, own)
            if isinstance(placed, str):
                failure = f"{key}: {placed}"
                break
            if index in slices:
                placed.annotations[TOPOLOGY_SLICE_ANNOTATION] = str(slices[index])
                self._slice_of.setdefault(gang.key, {})[key] = (slices[index], placed.node)
            self._assume_member(gang, current, placed)
            assumed.append((current, placed))
        if failure or gang.need > 0:
            for pod, _ in assumed:
                self._unassume_member(gang, pod)
            # A race (pods placed, nominations made, members gone while the solver ran),
            # not an error: Unschedulable, retried after the gang's backoff on the cache
            # as it is now.
            message = f"gang {gang.key}: the plan no longer fits: {failure or 'members left'}"
            self._failed(info, gang, message, log, started, unschedulable=True, race=True)
            return
        self._queue.done(info)
        self._metrics.observe_attempt(AttemptResult.SCHEDULED, time.perf_counter() - started)
        gang.last_reason, gang.last_message = "Scheduled", plan.message
        gang.partial_reported = False
        log.info(
            "gang_assumed",
            reason=f"{len(assumed)} members, {plan.status.value}",
            duration_ms=round(plan.solve_time_s * 1000, 3),
        )
        binding = self._binding.setdefault(gang.key, set())
        for pod, placed in assumed:
            binding.add(pod_key(pod.namespace, pod.name))
            member_log = log.bind(pod=f"{pod.namespace}/{pod.name}")
            self._claim_plans.pop(pod.key, None)  # the binding path owns them from here
            self._spawn(
                self._host.bind(
                    None,
                    pod,
                    placed.node,
                    placed.annotations,
                    member_log,
                    trace_id,
                    gang=gang.key,
                    gang_queued=(info.first_queued_at, info.attempts),
                    claim_plan=placed.claims,
                )
            )
        self.sync(gang.key)

    def _failed(
        self,
        info: QueuedPodInfo[QueuedPod],
        gang: Gang,
        message: str,
        log: Any,
        started: float,
        *,
        unschedulable: bool,
        nominated: Mapping[PodKey, str] | None = None,
        race: bool = False,
    ) -> None:
        """The gang as one unit: one requeue (one backoff), an event per member;
        ``nominated``: members' nodes after a preemption, written with PodScheduled;
        ``race``: unschedulable because the cluster moved during the attempt (a short
        requeue: backoff, not the unschedulable pool).

        Metrics: one cycle, timed from the pop (solve and victim search included), as a
        single pod's cycle is; kube-scheduler's attempts one per pending member, as it
        counts pods (each member of a coscheduling gang fails its own cycle)."""
        result = AttemptResult.UNSCHEDULABLE if unschedulable else AttemptResult.ERROR
        elapsed = time.perf_counter() - started
        self._metrics.observe_attempt(result, elapsed)
        self._metrics.count_attempt(
            result, self._host.settings.scheduler_name, pods=max(len(gang.pending), 1)
        )
        queue = self._queue.requeue_after_failure(
            info, unschedulable=unschedulable, reason=message, race=race
        )
        reason = UNSCHEDULABLE if unschedulable else SCHEDULER_ERROR
        gang.last_reason = reason
        gang.last_message = message
        self.dirty.add(gang.key)
        log.info(
            "gang_unschedulable",
            reason=message,
            queue=str(queue),
            duration_ms=round(elapsed * 1000, 3),
        )
        if self._reporter is None:
            return
        for key, member in gang.pending.items():
            ref = PodRef(member.namespace, member.name, member.uid)
            node = nominated.get(key) if nominated is not None else None
            self._reporter.failed(ref, message, reason=reason, nominated=node)

    def binding_failed(
        self,
        gkey: str,
        pod: Pod,
        detail: str,
        log: Any,
        trace_id: str,
        *,
        replace: bool = True,
    ) -> None:
        """A member's binding failed (told by :meth:`Host.bind`): re-place it within the
        plan's domain at once, or give it back to its gang, which is then partial and goes
        first. ``replace=False``: give it back at once (a binding task that crashed; a
        re-placement would retry without backoff what may crash again)."""
        gang = self.gangs.get(gkey)
        key = pod_key(pod.namespace, pod.name)
        if gang is None:
            return
        landed = self._cache.seen_bound(key, pod.uid)
        if landed is not None:
            # The binding landed though its reply was lost (the watch showed it first):
            # the member is placed; assuming it again would be illegal (ADDED).
            gang.pending.pop(key, None)
            gang.placed.add(key)
            log.info("gang_member_bound_after_all", node=landed, reason=detail)
            self.sync(gkey)
            return
        gang.placed.discard(key)
        bound = [k for k in gang.placed if self._cache.cached_pod(k) is not None]
        domain = None
        if bound:
            cached = self._cache.cached_pod(bound[0])
            if cached is not None:
                domain = self._domain_nodes(gang, cached.node)
        planned = self._slice_of.get(gkey, {}).get(key)
        slice_key = gang.spec.slice_key if gang.spec is not None else None
        if planned is not None and slice_key:
            # Its slice stays where the rest of the slice is.
            inside = self._domain_nodes(gang, planned[1], slice_key)
            domain = inside if domain is None or inside is None else domain & inside
        placed = self._place_member(pod, None, domain) if replace else "not re-placed"
        if not isinstance(placed, str):
            if planned is not None:
                placed.annotations[TOPOLOGY_SLICE_ANNOTATION] = str(planned[0])
            self._assume_member(gang, pod, placed)
            self._claim_plans.pop(pod.key, None)
            self._binding.setdefault(gkey, set()).add(key)
            log.info("gang_member_replaced", node=placed.node, reason=detail)
            self._spawn(
                self._host.bind(
                    None,
                    pod,
                    placed.node,
                    placed.annotations,
                    log,
                    trace_id,
                    gang=gkey,
                    claim_plan=placed.claims,
                )
            )
            return
        gang.pending[key] = pod
        gang.revision += 1
        gang.last_reason = "Partial"
        gang.last_message = f"member {key} could not be bound ({detail}) nor re-placed: {placed}"
        log.warning("gang_partial", gang=gkey, reason=gang.last_message)
        if not gang.partial_reported:
            gang.partial_reported = True
            self._event(gang, "GangPartial", gang.last_message)
        self.sync(gkey)

    def binding_ended(self, gkey: str, key: str) -> None:
        """A member's binding ended, whatever its outcome (told by :meth:`Host.bind`); the
        last one of a plan observes the time from quorum to admission."""
        binding = self._binding.get(gkey)
        if binding is None:
            return
        binding.discard(key)
        if binding:
            return
        del self._binding[gkey]
        gang = self.gangs.get(gkey)
        if gang is not None and gang.phase is GangPhase.ADMITTED and gang.quorum_at is not None:
            self._metrics.gang_admit_duration.observe(self._clock() - gang.quorum_at)
            gang.quorum_at = None

    def _event(self, gang: Gang, reason: str, message: str, *, warning: bool = True) -> None:
        if self._reporter is None or gang.spec is None:
            return
        upstream = is_upstream(gang.name)
        self._reporter.event(
            PodRef(gang.namespace, object_name(gang.name), gang.spec.uid),
            reason=reason,
            message=message,
            warning=warning,
            kind="PodGroup",
            api_version=(
                f"{UPSTREAM_GROUP}/{UPSTREAM_VERSION}"
                if upstream
                else f"{PODGROUP_GROUP}/{PODGROUP_VERSION}"
            ),
        )

    def status(self, gang: Gang) -> Mapping[str, Any] | None:
        """The PodGroup status this process would write now (None: no PodGroup)."""
        spec = gang.spec
        if spec is None:
            return None
        phase = gang.phase
        if is_upstream(gang.name):
            # As kube-scheduler: nothing before the gang's first attempt (quorum), then the
            # attempt's outcome.
            admitted = phase is GangPhase.ADMITTED
            if not admitted and (phase is GangPhase.WAITING or not gang.last_message):
                return None
            reason = gang.last_reason if gang.last_reason in UPSTREAM_REASONS else "Unschedulable"
            return initially_scheduled_status(
                admitted=admitted,
                reason=reason,
                message=gang.last_message,
                now=self._wall_clock(),
                previous=self._statuses.get(gang.key),
            )
        if phase is GangPhase.ADMITTED:
            name = "Running" if len(gang.running) >= spec.min_member else "Scheduled"
        elif gang.timed_out:
            name = "Failed"
        elif phase is GangPhase.READY:
            name = "Scheduling"
        else:
            name = "Pending"
        start = spec.schedule_start_time
        if start is None and phase in (GangPhase.READY, GangPhase.ADMITTED):
            start = gang.started_wall if gang.started_wall is not None else self._wall_clock()
        reason = gang.last_reason or ("Scheduled" if phase is GangPhase.ADMITTED else "Waiting")
        message = gang.last_message
        if phase in (GangPhase.WAITING,):
            reason, message = "WaitingForQuorum", gang.waiting_message()
        if gang.timed_out and phase is not GangPhase.ADMITTED:
            reason = "ScheduleTimeout"
        return podgroup_status(
            phase=name,
            scheduled=len(gang.placed),
            running=len(gang.running),
            succeeded=0,
            failed=0,
            schedule_start_time=start,
            reason=reason,
            message=message,
            now=self._wall_clock(),
            previous=self._statuses.get(gang.key),
        )

    async def write_statuses(self) -> None:
        """Write the status of every gang that changed, and only if it did."""
        if self._writer is None:
            self.dirty.clear()
            return
        dirty, self.dirty = self.dirty, set()
        for gkey in dirty:
            gang = self.gangs.get(gkey)
            if gang is None:
                continue
            try:
                status = self.status(gang)
            except ValueError as exc:  # a bug in what we would write must not stop the loop
                self._log.warning("podgroup_status_failed", gang=gkey, reason=str(exc))
                continue
            if status is None:
                continue
            previous = self._statuses.get(gkey)
            if not status_changed(previous, status):
                continue
            try:
                if is_upstream(gang.name):
                    await self._writer.upstream_podgroup_status(
                        gang.namespace, object_name(gang.name), status
                    )
                else:
                    await self._writer.podgroup_status(gang.namespace, gang.name, status)
            except Exception as exc:  # best effort; retried on the next change
                self._log.warning("podgroup_status_failed", gang=gkey, reason=str(exc)[:200])
                self.dirty.add(gkey)
                continue
            self._statuses[gkey] = dict(status)


UPSTREAM_REASONS: Final = frozenset({"Unschedulable", "SchedulerError"})
"""The reasons kube-scheduler writes on ``PodGroupInitiallyScheduled`` False."""


def _group_key(body: Body, upstream: bool) -> str:
    """The gang key of a PodGroup of either API (:mod:`scheduler.model.workload`)."""
    meta = body.get("metadata") or {}
    name = str(meta.get("name", ""))
    return gang_key(str(meta.get("namespace", "")), UPSTREAM_PREFIX + name if upstream else name)
