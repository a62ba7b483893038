"""Differential test of the volume plugins against the real kube-scheduler and PV binder.

For every generated case (local PVs with node affinity, zone-pinned PVs and zone labels,
WaitForFirstConsumer with a no-provisioner class, Immediate claims the PV controller binds
or cannot bind, a provisioner limited by allowedTopologies, ReadWriteOncePod claims held by
bound pods, CSINode attach limits, missing claims, inline GCE PD / EBS / RBD / iSCSI disks
shared with bound pods, inline in-tree disks against the attach limits of the CSI drivers
they migrate to) kube-scheduler decides on a real control plane; Lattice's core then
decides on the same objects read back from the API server:

* kube-scheduler chose node n (bound the pod, or annotated a claim to provision there)
  =>  n is in Lattice's feasible set, and Lattice's volume plan for n is valid: it binds
  to existing PVs the claims kube-scheduler bound and provisions those it provisioned, each
  PV it picked passes an independent check (``volumes_check.py``), and it is kube's PV
  where only one fits (as small as kube's where the pod binds one claim);
* kube-scheduler failed  =>  Lattice's feasible set is empty and its per-reason node
  counts (or PreFilter message) equal those of kube-scheduler's FailedScheduling message.

``--volume-cases`` (default 100) sets how many, ``--diff-seed`` which (drawn per run unless
given; see ``tests/e2e/differential/seeds.py``).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kubernetes_asyncio import client

from lattice_dev.devcluster.build import kubernetes_version
from lattice_dev.devcluster.kube import api_client
from scheduler.core.explain import Decision
from scheduler.core.from_api import counts_on_node, snapshot_from_api
from scheduler.core.plugins.volume_binding import plan_volume_bindings
from scheduler.core.profile import Profile
from scheduler.core.snapshot import Snapshot
from scheduler.core.volumes import VolumeState, volume_state_from_api
from scheduler.model.pod import Pod
from tests.conftest import report_line
from tests.e2e.differential.gen import Body
from tests.e2e.differential.harness import Verdict, own_plane
from tests.e2e.differential.seeds import DiffRun, failure_hint
from tests.e2e.differential.volumes_check import KubeVolumes, plan_problems
from tests.e2e.differential.volumes_gen import VolumeGenerator
from tests.e2e.differential.volumes_harness import VolumeKubeSide, VolumeWorld
from tests.e2e.differential.volumes_objects import schedule_with_volumes
from tests.e2e.test_differential import agree_on_feasibility

PROFILE = Profile(kube_minor=int(kubernetes_version().split(".")[1]))
"""Lattice as it runs against this plane's release (behaviour follows the API server's)."""

CASES_PER_CLUSTER = 10

DIFF_SUITE = "volumes"
"""Its seeds: the run's, and ``REGRESSIONS["volumes"]`` (tests/e2e/differential/seeds.py)."""


@pytest.fixture(scope="module")
def volume_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    with own_plane(tmp_path_factory, "volplane") as kubeconfig:
        yield kubeconfig


@pytest.fixture(scope="module")
async def volume_api(volume_plane: Path) -> AsyncIterator[client.ApiClient]:
    async with api_client(volume_plane) as api:
        yield api


def lattice_view(world: VolumeWorld) -> tuple[Snapshot, VolumeState]:
    """Lattice's snapshot and VolumeState of exactly the objects kube-scheduler saw."""
    built = snapshot_from_api(world.nodes, world.pods, world.namespaces)
    assert not built.skipped
    volumes = volume_state_from_api(
        pvs=world.pvs,
        pvcs=world.pvcs,
        classes=world.classes,
        csi_nodes=world.csi_nodes,
        attachments=world.attachments,
        placed_pods=[Pod.from_api(p) for p in world.pods if counts_on_node(p)],
    )
    assert not volumes.skipped
    return built.snapshot, volumes.state


@dataclass
class Disagreement:
    case: str
    kube: Verdict
    lattice: Decision
    pod: Body
    plan: list[str] | None = None
    """Why Lattice's volume plan for kube's node is invalid (the choices agreed)."""

    def __str__(self) -> str:
        ours = f"feasible={list(self.lattice.feasible)} counts={self.lattice.reason_counts()}"
        if self.plan:
            ours = "volume plan: " + "; ".join(self.plan)
        theirs = self.kube.node or self.kube.message
        return f"{self.case}: kube-scheduler: {theirs}\n    lattice: {ours}\n    pod: {self.pod}"


def check_plan(
    snapshot: Snapshot,
    volumes: VolumeState,
    pod: Pod,
    body: Body,
    node: str,
    world: VolumeWorld,
    kube: KubeVolumes,
) -> list[str]:
    """Lattice's volume plan for kube's node, checked against the pod's API body and the
    objects as they were when its case began (empty: valid)."""
    try:
        plan = plan_volume_bindings(snapshot, volumes, pod, node)
    except ValueError as exc:
        return [f"no plan for kube's node: {exc}"]
    ns = pod.namespace
    (node_body,) = [n for n in world.nodes if n["metadata"]["name"] == node]
    claims = {
        v["persistentVolumeClaim"]["claimName"]
        for v in body["spec"].get("volumes") or ()
        if "persistentVolumeClaim" in v
    }
    unbound = {
        c["metadata"]["name"]: c
        for c in world.pvcs
        if c["metadata"]["namespace"] == ns
        and c["metadata"]["name"] in claims
        and not c["spec"].get("volumeName")
    }
    pvs = {p["metadata"]["name"]: p for p in world.pvs}
    # Claims the PV controller had bound before the case (Immediate ones) are not kube's.
    kube = KubeVolumes(
        {c: v for c, v in kube.static.items() if c in unbound},
        frozenset(c for c in kube.provisioned if c in unbound),
    )
    return plan_problems(plan, kube, namespace=ns, node=node_body, unbound=unbound, pvs=pvs)


async def test_volume_plugins_agree_with_kube_scheduler(
    volume_api: client.ApiClient,
    diff_run: DiffRun,
    request: pytest.FixtureRequest,
    record_property: Callable[[str, object], None],
) -> None:
    cases = diff_run.cases_or(request.config.getoption("--volume-cases"))
    seed = diff_run.seed
    record_property("diff_seed", seed)
    gen = VolumeGenerator(seed)
    kube = VolumeKubeSide(volume_api)
    disagreements: list[Disagreement] = []
    bound = done = planned = inline = 0
    seen: Counter[str] = Counter()
    started = time.monotonic()
    for index in range((cases + CASES_PER_CLUSTER - 1) // CASES_PER_CLUSTER):
        vc = gen.cluster(index, min(CASES_PER_CLUSTER, cases - done))
        world = await kube.setup(vc)
        snapshot, volumes = lattice_view(world)
        for case in vc.cases:
            verdict, written = await kube.place(vc, case)
            pod = Pod.from_api(case.pod)
            decision, _ = schedule_with_volumes(snapshot, pod, volumes, profile=PROFILE)
            done += 1
            inline += any(v.disk for v in pod.storage_volumes)
            bound += verdict.node is not None
            seen.update(
                list(verdict.reasons or ()) or ([verdict.prefilter] if verdict.prefilter else [])
            )
            ok = agree_on_feasibility(verdict, decision)
            problems: list[str] = []
            if ok and verdict.node is not None:
                # Lattice could bind there too: its volume writes for kube's node are valid.
                problems = check_plan(
                    snapshot, volumes, pod, case.pod, verdict.node, world, written
                )
                planned += bool(written.static or written.provisioned)
            if not ok or problems:
                name = f"seed {seed} cluster {index} {case.pod['metadata']['name']}"
                disagreements.append(Disagreement(name, verdict, decision, case.pod, problems))
        await kube.teardown(vc)
    wall = time.monotonic() - started
    rate = 100.0 * (done - len(disagreements)) / done
    report_line(
        f"volume differential vs kube-scheduler: {done} cases (seed {seed}, {bound} placed, "
        f"{done - bound} unschedulable, {planned} with volume writes, {inline} with inline "
        "disks), "
        f"{done - len(disagreements)} agree ({rate:.1f}%), {wall:.0f} s"
    )
    report_line(
        "volume differential, kube-scheduler's reasons (cases): "
        + "; ".join(f"{reason} ({n})" for reason, n in seen.most_common())
    )
    assert done == cases
    # The plan check means something only if kube wrote volumes in some cases.
    assert planned >= cases // 20, f"only {planned}/{cases} cases had volume writes to compare"
    assert not disagreements, (
        failure_hint(diff_run, DIFF_SUITE) + "\n" + "\n".join(str(d) for d in disagreements[:20])
    )
