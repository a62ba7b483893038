"""One attempt's device search: a budget over all its nodes, and the nodes still to search.

Why. The structured allocator (:mod:`scheduler.core.dra.allocator`) is a depth-first
search that kube bounds per node (its 10 s filter timeout), not per attempt. A mis-sized
pod (two claims of 9 on 16-device nodes as firstAvailable lists of one, which the
allocator's count check leaves to the search, or 6 + 5 on 10 under 1.35's search by orders)
runs to that timeout on every node: on 1000 DRA nodes, hours of one attempt. kube-scheduler
searches on 16 parallel workers off its informers, so its other goroutines go on; Lattice
has one event loop, whose watches, bindings, ``/healthz`` and leader lease (10 s) stall
behind a search run on it.

What. :class:`DeviceSearch` is the attempt's search: a wall-clock ``budget`` over all its
nodes (``spec.dra.searchBudgetSeconds``, :data:`SEARCH_BUDGET` by default). Each node's
search keeps kube's own timeout (and kube's verdict on it per release: the node does not
fit in 1.35, an error of the attempt from 1.36) where that comes first; where the budget
comes first the search stops and the attempt's verdict is the budget's:

* a node whose search the budget cut short: from 1.36, where kube's search that does not
  end is an error of the attempt, an Error (SchedulerError, backoff) naming the budget and
  the node; in 1.35 the node does not fit;
* nodes never searched: rejected as Unschedulable, "not searched: the device search budget
  ... ran out after N node(s)"; with feasible nodes found already the attempt goes on with
  those (a pod placed within the budget is placed); without any it is Unschedulable, so it
  waits for a device change that can help, then backs off as any.

``enough`` (from ``percentageOfNodesToScore`` when it is set; Lattice's default is to
evaluate every node): the search stops once that many nodes fit, kube's
``numFeasibleNodesToFind``, counting nodes the memo answers as well.

Where it runs. Two modes, one filter (DynamicResources):

* **inline** (no search given, as in gang re-checks, preemption's dry runs, ``lattice
  simulate``): nodes are searched in the filter, under a budget of their own;
* **deferred** (the controller's single-pod cycles): the filter searches on the loop only
  for the decision's first :data:`INLINE` seconds (a search past that is dropped there).
  Nodes the memo cannot answer then become :class:`Job`\\ s and their rows are left out
  of that decision; the attempt then continues in a task of its own: it waits for the
  worker thread (one search at a time; its budget starts then), runs the jobs there
  (:func:`run_jobs`),
  writes the outcomes into the memo (unless a class or slice changed meanwhile:
  :attr:`~scheduler.core.dra.state.DraState.generation`), and decides again. Other pods
  are scheduled meanwhile. The decision with no jobs left is the one acted on; it is
  taken on the loop, on the snapshot as it is then, with no await inside, so no event
  lands in the middle of a decision.

Why not the whole decision in a thread: the snapshot, the DRA ledger and the nominations
are changed on the loop by watch events and by binding outcomes (forget, confirm, expire),
and deferring every one of those while a decision runs would touch every write site of the
control side, and would stop every other pod's cycle for the search. The allocator is the
only part that can blow up, and its inputs are already immutable values (the slice index
and the devices in use are rebuilt, never changed in place;
:meth:`~scheduler.core.dra.allocator.Allocator.detached` copies the classes), so only it
leaves the loop. Searching in a thread costs a second decision for a pod whose nodes the
memo did not know; a pod whose nodes it knows, or whose unknown nodes take less than
:data:`INLINE` to search (the common case: the one node the previous pod with the same
claims took devices on), is decided at once. The worker holds the GIL while it
searches; it pauses after every 2 ms of search (:meth:`DeviceSearch.yielding_now`), 1 ms
while the loop is idle and 8 ms while it has work, so the loop comes first: slower, never
stopped. One worker: threads
give Python no parallel speed-up on pure-Python search, and the budget, not parallelism,
is what bounds an attempt.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from scheduler.core.dra.allocator import (
    AllocationError,
    Allocator,
    BudgetExhausted,
    NodeAllocationError,
    untolerated_taints,
)
from scheduler.core.dra.objects import ResourceClaim
from scheduler.model.selectors import Labels

SEARCH_BUDGET: Final = 10.0
"""Seconds of device search one scheduling attempt may take over all its nodes, in the
worker: kube's per-node timeout (DRASchedulerFilterTimeout), so no node's search is cut
before kube-scheduler's own would be (2 s was: the random differential found a pod kube
judged Unschedulable within its 10 s that Lattice's budget cut short under load)."""
ON_LOOP_BUDGET: Final = 2.0
"""The most a search that runs on the event loop may take (a gang's device counts,
preemption's dry runs, explain): the loop also renews the lease (10 s deadline)."""
WORK_SLICE: Final = 0.002
"""Seconds the worker searches between pauses."""
PAUSE: Final = 0.001
"""Seconds the worker pauses, GIL released, so the event loop runs."""
BUSY_PAUSE: Final = 0.008
"""The pause while the loop has pods to schedule (:attr:`DeviceSearch.loop_busy`): the
loop then has the interpreter at least 80 % of the time, so one pod's search costs the
other pods' cycles a fifth at most (a third, when the pause was :data:`PAUSE` always,
doubled plain pods' p99 at 1000 nodes)."""
INLINE: Final = 0.005
"""Seconds a deferred attempt may search on the loop before it leaves nodes to the worker.
A pod's usual search is one node the memo does not know yet (the one the previous pod with
its claims took devices on), well under a millisecond; searched in the worker instead, it
costs a second decision over every node (bench-dra at 1000 nodes: 50 ms of CPU per pod
against 18 in the core). A search that runs past it is cut and handed to the worker whole,
so the loop is held this long (plus up to 256 allocator steps) per decision at most."""
CANNOT_ALLOCATE: Final = "cannot allocate all claims"
TAINTS_NAMED: Final = 3
"""Untolerated taints a reason names before it says how many more there are."""
MIN_FEASIBLE: Final = 100
"""kube's ``minFeasibleNodesToFind``."""
MIN_PERCENTAGE: Final = 5
"""kube's ``minFeasibleNodesPercentageToFind``."""
BASE_PERCENTAGE: Final = 50
"""kube's ``DefaultPercentageOfNodesToScore`` base of the adaptive percentage."""

UNSCHEDULABLE: Final = 2
UNSCHEDULABLE_AND_UNRESOLVABLE: Final = 3
"""kube's status codes (:class:`~scheduler.core.framework.Code`; core/dra stays below the
framework, so the numbers are repeated here and checked equal in the tests)."""


def feasible_to_find(num_nodes: int, percentage: int) -> int:
    """kube's ``numFeasibleNodesToFind``: how many feasible nodes end the search
    (``percentage`` 0: kube's adaptive default)."""
    if num_nodes < MIN_FEASIBLE or percentage >= 100:
        return num_nodes
    adaptive = percentage
    if adaptive <= 0:
        adaptive = max(BASE_PERCENTAGE - num_nodes // 125, MIN_PERCENTAGE)
    return max(num_nodes * adaptive // 100, MIN_FEASIBLE)


def cannot_allocate(taints: Sequence[str] = ()) -> str:
    """The Filter's reason for a node whose devices cannot take the claims, naming the
    device taints that keep a request from enough of them (none: kube's own words)."""
    if not taints:
        return CANNOT_ALLOCATE
    named = list(taints[:TAINTS_NAMED])
    if len(taints) > TAINTS_NAMED:
        named.append(f"{len(taints) - TAINTS_NAMED} more")
    plural = "s" if len(taints) > 1 else ""
    return f"{CANNOT_ALLOCATE} (untolerated device taint{plural}: {' and '.join(named)})"


@dataclass(frozen=True, slots=True)
class Fit:
    allocations: list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class NoFit:
    reason: str
    code: int


@dataclass(frozen=True, slots=True)
class Failed:
    """An allocator error: kube ends the whole attempt with it."""

    message: str


Outcome = Fit | NoFit | Failed


@dataclass(frozen=True, slots=True)
class Job:
    """One node the memo could not answer, to search off the loop."""

    row: int
    node: str
    labels: Labels
    claims: tuple[ResourceClaim, ...]
    key: tuple[object, ...]
    """The node's memo key when the job was made (:meth:`DraState.node_key`)."""
    allocator: Allocator


def search_node(
    allocator: Allocator,
    node: str,
    labels: Labels,
    claims: Sequence[ResourceClaim],
    stop_at: float | None,
) -> Outcome:
    """One node's verdict; raises :class:`BudgetExhausted` when ``stop_at`` ends it.
    Where no allocation exists and some device of the node is in use, Unschedulable (not
    kube's UnschedulableAndUnresolvable): evicting lower-priority holders can make room."""
    try:
        found = allocator.allocate(node, labels, claims, stop_at=stop_at)
    except AllocationError as err:
        return Failed(str(err))
    except NodeAllocationError as err:
        return NoFit(str(err), UNSCHEDULABLE)
    if found is not None:
        return Fit(found)
    reason = cannot_allocate(untolerated_taints(allocator, node, labels, claims))
    in_use = allocator.any_in_use(node, labels)
    return NoFit(reason, UNSCHEDULABLE if in_use else UNSCHEDULABLE_AND_UNRESOLVABLE)


@dataclass(slots=True)
class DeviceSearch:
    """One attempt's device search (see the module docstring)."""

    budget: float = SEARCH_BUDGET
    deferred: bool = False
    """Nodes the memo cannot answer become :attr:`jobs` instead of being searched (once
    the :attr:`inline` allowance is spent)."""
    inline: float = 0.0
    """Deferred: seconds of search on the loop per decision before nodes become jobs
    (:data:`INLINE` for the controller's cycles)."""
    inline_until: float | None = None
    """The clock's reading at which the current decision's inline allowance ends (set
    by its first inline search, cleared by :meth:`take_jobs`)."""
    enough: int | None = None
    """Stop once this many nodes fit (None: search every node)."""
    clock: Callable[[], float] = time.monotonic
    loop_busy: Callable[[], bool] = lambda: False
    """Whether the event loop has pods to schedule now; read from the worker thread, so
    it must only read (a flag, a length)."""
    sleep: Callable[[float], None] = time.sleep
    deadline: float = 0.0
    searched: int = 0
    """Nodes whose allocator ran in this attempt (inline or in the worker)."""
    exhausted: bool = False
    """The budget ran out: nodes not searched are rejected, not searched."""
    cut: str | None = None
    """The node whose search the budget ended (no verdict for it)."""
    jobs: list[Job] = field(default_factory=list)
    outcomes: dict[tuple[object, ...], Outcome] = field(default_factory=dict)
    """Worker verdicts by memo key (errors, which the memo does not keep, and all others
    for this attempt even if the memo was trimmed meanwhile)."""
    abandoned: bool = False
    seconds: float = 0.0
    """Time spent in the allocator in the worker (the allocation-duration metric)."""
    last_pause: float = 0.0

    def __post_init__(self) -> None:
        self.deadline = self.clock() + self.budget

    def now(self) -> float:
        """The search's clock: +inf once the attempt is abandoned, so a worker still
        searching stops at its next look at the clock."""
        return math.inf if self.abandoned else self.clock()

    def yielding_now(self) -> float:
        """:meth:`now` for the worker: after each :data:`WORK_SLICE` of search it sleeps,
        letting the GIL go (the allocator looks at its clock every 256 steps): :data:`PAUSE`
        while the loop is idle, so a search that is alone loses a third of its budget to
        the pauses, and :data:`BUSY_PAUSE` while the loop has pods to schedule, so their
        cycles come first and the search goes on in what the loop leaves."""
        now = self.clock()
        if now - self.last_pause >= WORK_SLICE:
            self.sleep(BUSY_PAUSE if self.loop_busy() else PAUSE)
            now = self.last_pause = self.clock()
        return math.inf if self.abandoned else now

    def expired(self) -> bool:
        if not self.exhausted and self.now() > self.deadline:
            self.exhausted = True
        return self.exhausted

    def abandon(self) -> None:
        self.abandoned = True

    def inline_search(
        self,
        allocator: Allocator,
        node: str,
        labels: Labels,
        claims: Sequence[ResourceClaim],
    ) -> Outcome | None:
        """A deferred attempt's node searched on the loop while the decision's
        :attr:`inline` allowance lasts; None: the node goes to the worker (the allowance
        is spent, or this search ran past it and is dropped, to be done there)."""
        if not self.deferred or self.inline <= 0:
            return None
        now = self.clock()
        if self.inline_until is None:
            self.inline_until = now + self.inline
        if now >= self.inline_until:
            return None
        stop = min(self.inline_until, self.deadline)
        try:
            outcome = search_node(allocator, node, labels, claims, stop_at=stop)
        except BudgetExhausted:
            self.inline_until = -math.inf
            if stop >= self.deadline:
                # The attempt's budget, not the allowance, ended it: the node is the one
                # the budget cut (an error of the attempt from 1.36), as if the worker had.
                self.exhausted = True
                self.cut = node
            return None
        self.searched += 1
        return outcome

    def take_jobs(self) -> list[Job]:
        """The nodes left to search, once each (a decision with nominated pods runs the
        filter more than once)."""
        self.inline_until = None
        once: dict[tuple[object, ...], Job] = {}
        for job in self.jobs:
            once.setdefault(job.key, job)
        self.jobs = []
        return list(once.values())

    def over_budget(self) -> str:
        """The reason of the nodes left unsearched."""
        return (
            f"node(s) not searched: the device search budget ({self.budget:g}s per attempt) "
            f"ran out after {self.searched} node(s)"
        )

    def cut_message(self, node: str) -> str:
        """The error of an attempt whose node search the budget ended (1.36+)."""
        return (
            f"node {node}: the device search budget ({self.budget:g}s per attempt) ran out "
            f"while allocating devices, after {self.searched} node(s) searched"
        )


def run_jobs(search: DeviceSearch, jobs: Sequence[Job], wanted: int | None) -> None:
    """Search ``jobs`` in order until the budget runs out, ``wanted`` of them fit, or one
    ends in an allocator error (kube aborts the attempt at the first); verdicts go to
    ``search.outcomes``. Runs in a worker thread: reads only the jobs' detached
    allocators, writes only ``search``, which the loop reads once this returns."""
    detached: dict[int, Allocator] = {}
    started = time.perf_counter()
    found = 0
    try:
        for job in jobs:
            if wanted is not None and found >= wanted:
                return
            if search.expired():
                return
            allocator = detached.get(id(job.allocator))
            if allocator is None:
                allocator = detached[id(job.allocator)] = job.allocator.detached(
                    search.yielding_now
                )
            search.searched += 1
            try:
                outcome = search_node(
                    allocator, job.node, job.labels, job.claims, stop_at=search.deadline
                )
            except BudgetExhausted:
                search.exhausted = True
                search.cut = job.node
                return
            search.outcomes[job.key] = outcome
            if isinstance(outcome, Fit):
                found += 1
            elif isinstance(outcome, Failed):
                return
    finally:
        search.seconds += time.perf_counter() - started
