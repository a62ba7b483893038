"""Differential test of preemption: Lattice's evaluator against kube-scheduler's
DefaultPreemption, on random clusters with priorities, budgets, full nodes and claims
(ReadWriteOncePod claims held by pods of lower or higher priority than the preemptor that
mounts them).

For every case kube-scheduler meets one high-priority pod on a pool of full nodes; Lattice's
evaluator then runs on the objects read back *before* that pod was created (plus the pod as
stored). Agreement means:

* kube-scheduler preempted on node n with victims V  =>  Lattice found a preemption, n is
  among the nodes it found tied at every criterion (kube breaks the last tie at random), and
  Lattice's victims on n are exactly V;
* kube-scheduler did not preempt  =>  neither did Lattice, and its PostFilter message (the
  part after ``preemption:``: not eligible, or the dry run's per-node reasons) is Lattice's
  :func:`no_preemption_message`; if kube bound the pod without preempting, Lattice found that
  node feasible.

``--preempt-cases`` (default 200) sets how many cases, ``--diff-seed`` which (drawn per run
unless given; see ``tests/e2e/differential/seeds.py``).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kubernetes_asyncio import client

from scheduler.core.explain import Decision
from scheduler.core.from_api import as_pending, counts_on_node, snapshot_from_api
from scheduler.core.preemption import (
    Inputs,
    Preemption,
    no_preemption_message,
    preempt,
)
from scheduler.core.schedule import Framework
from scheduler.core.volumes import volume_state_from_api
from scheduler.devcluster.kube import api_client
from scheduler.model.pdb import PodDisruptionBudget
from scheduler.model.pod import Pod
from scheduler.model.pod_facts import PodFacts
from tests.conftest import report_line
from tests.e2e.differential.harness import own_plane
from tests.e2e.differential.preemption import Before, KubePreemption, PreemptionKubeSide
from tests.e2e.differential.preemption_gen import Body, PreemptionGenerator
from tests.e2e.differential.seeds import DiffRun, failure_hint

CASES_PER_ROUND = 25

DIFF_SUITE = "preemption"
"""Its seeds: the run's, and ``REGRESSIONS["preemption"]`` (tests/e2e/differential/seeds.py)."""


@pytest.fixture(scope="module")
def preempt_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    with own_plane(tmp_path_factory, "preemptplane") as kubeconfig:
        yield kubeconfig


@pytest.fixture(scope="module")
async def preempt_api(preempt_plane: Path) -> AsyncIterator[client.ApiClient]:
    async with api_client(preempt_plane) as api:
        yield api


@dataclass
class Ours:
    decision: Decision
    preemption: Preemption | None
    message: str | None = None
    """Our PostFilter message when we did not preempt."""


def lattice_preempts(before: Before, stored: Body) -> Ours:
    """Lattice's decision and evaluator on exactly what kube-scheduler saw."""
    built = snapshot_from_api(before.nodes, before.pods, before.namespaces)
    assert not built.skipped
    pod = Pod.from_api(as_pending(stored))
    facts = {Pod.from_api(b).key: PodFacts.from_api(b) for b in before.pods}
    facts[pod.key] = PodFacts.from_api(stored)
    storage = volume_state_from_api(
        pvs=before.pvs,
        pvcs=before.pvcs,
        classes=before.classes,
        placed_pods=[Pod.from_api(p) for p in before.pods if counts_on_node(p)],
    )
    assert not storage.skipped
    volumes = storage.state
    framework = Framework()
    decision = framework.schedule(built.snapshot, pod, seed=0, volumes=volumes)
    if decision.selected is not None:
        return Ours(decision, None)
    inputs = Inputs(
        pdbs=[PodDisruptionBudget.from_api(b) for b in before.pdbs],
        facts=facts,
        volumes=volumes,
    )
    found = preempt(framework, built.snapshot, decision, inputs)
    if found is not None:
        return Ours(decision, found)
    return Ours(decision, None, no_preemption_message(framework, built.snapshot, decision, inputs))


def agree(kube: KubePreemption, ours: Ours) -> bool:
    p = ours.preemption
    if kube.node is None or not kube.victims:
        if kube.bound is not None:
            return p is None and kube.bound in ours.decision.feasible
        if p is not None or ours.decision.selected is not None:
            return False
        # "<cycle's FitError>. [other PostFilter messages, ]preemption: <ours>"
        _, found, theirs = (kube.message or "").partition("preemption: ")
        return bool(found) and theirs == ours.message
    if p is None or kube.node not in p.tied:
        return False
    (on_node,) = [c for c in p.candidates if c.node == kube.node]
    return {v.name for v in on_node.victims} == set(kube.victims)


def describe(case: str, kube: KubePreemption, ours: Ours, stored: Body) -> str:
    p = ours.preemption
    mine = (
        f"none: {ours.message}"
        if p is None
        else f"{p.node} {sorted(v.name for v in p.victims)} violations={p.pdb_violations} "
        f"tied={list(p.tied)} candidates="
        + str({c.node: sorted(v.name for v in c.victims) for c in p.candidates})
    )
    theirs = f"{kube.node} {sorted(kube.victims)} bound={kube.bound} message={kube.message!r}"
    return (
        f"{case}:\n    kube-scheduler: {theirs}\n    lattice: {mine}\n"
        f"    lattice cycle: {ours.decision.summary}\n    pod: {stored.get('spec')}"
    )


def _mounts(pod: Body, claim: str) -> bool:
    return any(
        (v.get("persistentVolumeClaim") or {}).get("claimName") == claim
        for v in pod["spec"].get("volumes", [])
    )


async def test_preemption_agrees_with_kube_scheduler(
    preempt_api: client.ApiClient,
    diff_run: DiffRun,
    request: pytest.FixtureRequest,
    record_property: Callable[[str, object], None],
) -> None:
    cases = diff_run.cases_or(request.config.getoption("--preempt-cases"))
    seed = diff_run.seed
    record_property("diff_seed", seed)
    gen = PreemptionGenerator(seed)
    kube = PreemptionKubeSide(preempt_api)
    await kube.install_priority_classes()
    started = time.monotonic()
    disagreements: list[str] = []
    done = preempted = bound = 0
    victims_total = ties = 0
    claimed = rwop_preempted = 0
    round_index = 0
    while done < cases:
        batch = [gen.case(round_index, i) for i in range(min(CASES_PER_ROUND, cases - done))]
        before = await kube.prepare(batch)
        stored, verdicts = await kube.preempt(batch)
        for case, body, verdict in zip(batch, stored, verdicts, strict=True):
            ours = lattice_preempts(before, body)
            done += 1
            preempted += bool(verdict.victims)
            bound += verdict.bound is not None and not verdict.victims
            victims_total += len(verdict.victims)
            p = ours.preemption
            ties += p is not None and len(p.tied) > 1
            wanted = set(case.preemptor_claims)
            claimed += bool(wanted)
            rwop_preempted += any(
                c in case.rwop_claims and _mounts(v, c)
                for c in wanted
                for v in case.pods
                if v["metadata"]["name"] in verdict.victims
            )
            if not agree(verdict, ours):
                disagreements.append(describe(f"seed {seed} {case.namespace}", verdict, ours, body))
        await kube.teardown(batch)
        round_index += 1
    elapsed = time.monotonic() - started
    agreed = done - len(disagreements)
    report_line(
        f"preemption differential vs kube-scheduler: {done} cases (seed {seed}, {preempted} "
        f"preempted with {victims_total} victims, {bound} bound without preemption, "
        f"{done - preempted - bound} not helped; {ties} with nodes tied at every criterion; "
        f"{claimed} preemptors with a claim, {rwop_preempted} of them evicting the holder "
        "of its ReadWriteOncePod claim), "
        f"{agreed} agree ({100.0 * agreed / done:.1f}%), {elapsed:.0f} s"
    )
    assert done == cases
    assert not disagreements, (
        failure_hint(diff_run, DIFF_SUITE) + "\n" + "\n".join(disagreements[:20])
    )
    # The volume cases are not vacuous: some preemptions free a ReadWriteOncePod claim.
    assert cases < 50 or rwop_preempted > 0
