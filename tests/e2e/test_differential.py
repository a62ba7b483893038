"""Differential test: Lattice's core against the real kube-scheduler, on random clusters.

kube-scheduler's semantics are the contract. For every generated case the pod
is scheduled by kube-scheduler on a real control plane; then Lattice's core is
run on the same objects read back from the API server:

* kube-scheduler bound the pod to n  =>  n is in Lattice's feasible set, and n is among
  the nodes kube-scheduler's default profile as Lattice's core computes it
  (:func:`kube_profile`: Lattice's own plugins removed) scores highest (ties allowed:
  kube-scheduler breaks them at random);
* kube-scheduler failed              =>  Lattice's feasible set is empty and its
  per-reason node counts equal those in kube-scheduler's FailedScheduling message.

kube-scheduler runs with ``percentageOfNodesToScore: 100``, so its choice is over every
feasible node (the clusters are far below its 100-node floor anyway). The generated pods
carry what kube scores: preferred node affinity, preferred and required pod (anti-)affinity
on both sides, PreferNoSchedule taints, ScheduleAnyway spread, and requests that make
LeastAllocated and BalancedAllocation differ.

``--diff-cases`` (default 300) and ``--diff-seed`` choose how many and which (the seed is
drawn per run unless given; see ``tests/e2e/differential/seeds.py``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kubernetes_asyncio import client

from lattice_dev.devcluster.build import kubernetes_version
from lattice_dev.devcluster.kube import api_client
from scheduler.core.explain import Decision
from scheduler.core.from_api import as_pending, snapshot_from_api
from scheduler.core.profile import Profile, kube_profile
from scheduler.core.schedule import Framework
from scheduler.model.pod import Pod
from tests.conftest import report_line
from tests.e2e.differential.gen import Body, Generator
from tests.e2e.differential.harness import KubeSide, State, Verdict, own_plane
from tests.e2e.differential.seeds import DiffRun, failure_hint

PODS_PER_CLUSTER = 10

DIFF_SUITE = "core"
"""Its seeds: the run's, and ``REGRESSIONS["core"]`` (tests/e2e/differential/seeds.py)."""


@pytest.fixture(scope="module")
def diff_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    with own_plane(tmp_path_factory, "diffplane", percentage_of_nodes_to_score=100) as kubeconfig:
        yield kubeconfig


@pytest.fixture(scope="module")
async def diff_api(diff_plane: Path) -> AsyncIterator[client.ApiClient]:
    async with api_client(diff_plane) as api:
        yield api


KUBE_MINOR = int(kubernetes_version().split(".")[1])
"""The release of the control plane the suite runs: kube-scheduler's scores follow it."""
LATTICE = Framework(Profile(kube_minor=KUBE_MINOR))
KUBE = Framework(kube_profile(kube_minor=KUBE_MINOR))


@dataclass(frozen=True)
class Ours:
    """Lattice's core on one case: the default profile (whose filters must agree with
    kube-scheduler's) and kube-scheduler's profile as the core computes it (whose scores
    must)."""

    decision: Decision
    scored: Decision

    @property
    def best(self) -> frozenset[str]:
        """The feasible nodes with the highest total under kube-scheduler's profile."""
        ex = self.scored.explanation
        rows = ex.feasible_rows
        if not len(rows):
            return frozenset()
        totals = ex.totals[rows]
        top = totals.max()
        return frozenset(ex.node_names[int(r)] for r in rows[totals == top])

    def scores(self) -> str:
        """Each feasible node's total and per-plugin scores, best first."""
        ex = self.scored.explanation
        verdicts = sorted((ex.node(n) for n in ex.feasible), key=lambda v: -(v.total or 0))
        return "; ".join(f"{v.name}={v.total} {v.scores}" for v in verdicts)


def lattice_decides(state: State) -> Ours:
    """Lattice's core on exactly the objects kube-scheduler saw."""
    built = snapshot_from_api(state.nodes, state.pods, state.namespaces, kube_minor=KUBE_MINOR)
    assert not built.skipped
    pod = Pod.from_api(as_pending(state.pod))
    return Ours(LATTICE.schedule(built.snapshot, pod, seed=0), KUBE.schedule(built.snapshot, pod))


@dataclass
class Disagreement:
    case: str
    kube: Verdict
    lattice: Ours
    pod: Body

    def __str__(self) -> str:
        ours = self.lattice.decision
        line = f"feasible={list(ours.feasible)} counts={ours.reason_counts()}"
        if self.kube.node is not None and self.kube.node in ours.feasible:
            line = f"best={sorted(self.lattice.best)} scores: {self.lattice.scores()}"
        theirs = self.kube.node or self.kube.message
        return f"{self.case}: kube-scheduler: {theirs}\n    lattice: {line}\n    pod: {self.pod}"


def agree_on_feasibility(kube: Verdict, decision: Decision) -> bool:
    """kube's node is feasible for us; or no node is, for the same reasons."""
    if kube.node is not None:
        return kube.node in decision.feasible
    if decision.feasible:
        return False
    if kube.reasons is not None:
        return decision.reason_counts() == kube.reasons
    return kube.prefilter is not None and kube.prefilter in decision.summary


def agree(kube: Verdict, ours: Ours) -> bool:
    """Feasibility, and kube's node among our highest scored."""
    if not agree_on_feasibility(kube, ours.decision):
        return False
    return kube.node is None or kube.node in ours.best


async def test_core_agrees_with_kube_scheduler(
    diff_api: client.ApiClient,
    diff_run: DiffRun,
    request: pytest.FixtureRequest,
    record_property: Callable[[str, object], None],
) -> None:
    cases = diff_run.cases_or(request.config.getoption("--diff-cases"))
    seed = diff_run.seed
    record_property("diff_seed", seed)
    gen = Generator(seed)
    kube = KubeSide(diff_api)
    disagreements: list[Disagreement] = []
    bound = done = contested = 0
    for index in range((cases + PODS_PER_CLUSTER - 1) // PODS_PER_CLUSTER):
        cl = gen.cluster(index, min(PODS_PER_CLUSTER, cases - done))
        await kube.setup(cl)
        for pod in cl.incoming:
            verdict, state = await kube.place(cl, pod)
            ours = lattice_decides(state)
            done += 1
            bound += verdict.node is not None
            # A choice the scores decide: several feasible nodes, not all scored alike.
            contested += verdict.node is not None and len(ours.best) < len(ours.decision.feasible)
            if not agree(verdict, ours):
                case = f"seed {seed} cluster {index} {pod['metadata']['name']}"
                disagreements.append(Disagreement(case, verdict, ours, pod))
        await kube.teardown(cl)
    rate = 100.0 * (done - len(disagreements)) / done
    report_line(
        f"differential vs kube-scheduler: {done} cases (seed {seed}, {bound} bound, "
        f"{done - bound} unschedulable, {contested} chosen by score among unequal nodes), "
        f"{done - len(disagreements)} agree ({rate:.1f}%)"
    )
    assert done == cases
    # The choice comparison means something only if scores often decide it.
    assert contested >= cases // 5, f"only {contested}/{cases} choices were decided by score"
    assert not disagreements, (
        failure_hint(diff_run, DIFF_SUITE) + "\n" + "\n".join(str(d) for d in disagreements[:20])
    )
