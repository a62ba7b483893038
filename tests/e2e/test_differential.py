"""Differential test: Lattice's core against the real kube-scheduler, on random clusters.

kube-scheduler's semantics are the contract. For every generated case the pod
is scheduled by kube-scheduler on a real control plane; then Lattice's core is
run on the same objects read back from the API server:

* kube-scheduler bound the pod to n  =>  n is in Lattice's feasible set;
* kube-scheduler failed              =>  Lattice's feasible set is empty and its
  per-reason node counts equal those in kube-scheduler's FailedScheduling message.

``--diff-cases`` (default 300) and ``--diff-seed`` choose how many and which (the seed is
drawn per run unless given; see ``tests/e2e/differential/seeds.py``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kubernetes_asyncio import client

from scheduler.core.explain import Decision
from scheduler.core.from_api import as_pending, snapshot_from_api
from scheduler.core.schedule import Framework
from scheduler.devcluster.kube import api_client
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
    with own_plane(tmp_path_factory, "diffplane") as kubeconfig:
        yield kubeconfig


@pytest.fixture(scope="module")
async def diff_api(diff_plane: Path) -> AsyncIterator[client.ApiClient]:
    async with api_client(diff_plane) as api:
        yield api


def lattice_decides(state: State) -> Decision:
    """Lattice's core on exactly the objects kube-scheduler saw."""
    built = snapshot_from_api(state.nodes, state.pods, state.namespaces)
    assert not built.skipped
    return Framework().schedule(built.snapshot, Pod.from_api(as_pending(state.pod)), seed=0)


@dataclass
class Disagreement:
    case: str
    kube: Verdict
    lattice: Decision
    pod: Body

    def __str__(self) -> str:
        ours = f"feasible={list(self.lattice.feasible)} counts={self.lattice.reason_counts()}"
        theirs = self.kube.node or self.kube.message
        return f"{self.case}: kube-scheduler: {theirs}\n    lattice: {ours}\n    pod: {self.pod}"


def agree(kube: Verdict, ours: Decision) -> bool:
    if kube.node is not None:
        return kube.node in ours.feasible
    if ours.feasible:
        return False
    if kube.reasons is not None:
        return ours.reason_counts() == kube.reasons
    return kube.prefilter is not None and kube.prefilter in ours.summary


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
    bound = done = 0
    for index in range((cases + PODS_PER_CLUSTER - 1) // PODS_PER_CLUSTER):
        cl = gen.cluster(index, min(PODS_PER_CLUSTER, cases - done))
        await kube.setup(cl)
        for pod in cl.incoming:
            verdict, state = await kube.place(cl, pod)
            decision = lattice_decides(state)
            done += 1
            bound += verdict.node is not None
            if not agree(verdict, decision):
                case = f"seed {seed} cluster {index} {pod['metadata']['name']}"
                disagreements.append(Disagreement(case, verdict, decision, pod))
        await kube.teardown(cl)
    rate = 100.0 * (done - len(disagreements)) / done
    report_line(
        f"differential vs kube-scheduler: {done} cases (seed {seed}, {bound} bound, "
        f"{done - bound} unschedulable), {done - len(disagreements)} agree ({rate:.1f}%)"
    )
    assert done == cases
    assert not disagreements, (
        failure_hint(diff_run, DIFF_SUITE) + "\n" + "\n".join(str(d) for d in disagreements[:20])
    )
