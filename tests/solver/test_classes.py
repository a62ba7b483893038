"""Member classes: merged only when nothing the framework or the model reads differs;
Topology feasibility and co-location limits come from the Topology plugin itself."""

from __future__ import annotations

from scheduler.model.names import LABEL_HOSTNAME
from scheduler.solver import SolveStatus
from tests.builders import PodBuilder, cluster, make_node
from tests.solver.support import built, member, plan_for, problem_for
from tests.topology.support import annotate, gpu_bed, gpu_pod, holding


def indexed(i: int) -> PodBuilder:
    """An indexed Job's pod: its own index label and annotation, otherwise identical."""
    pod = member(f"job-{i}", 1).label("batch.kubernetes.io/job-completion-index", str(i))
    return annotate(pod, "batch.kubernetes.io/job-completion-index", str(i))


def test_labels_and_annotations_nothing_reads_do_not_split_a_class() -> None:
    snapshot = cluster([make_node(f"n{i}") for i in range(3)])
    problem = problem_for(snapshot, built([indexed(i) for i in range(4)]))
    assert problem.num_classes == 1
    assert problem.classes[0].members == (0, 1, 2, 3)


def test_a_label_some_selector_reads_splits_the_class() -> None:
    snapshot = cluster([make_node(f"n{i}") for i in range(3)])
    members = [
        member(f"m{i}")
        .label("role", "a" if i < 2 else "b")
        .pod_anti_affinity(LABEL_HOSTNAME, {"role": "a"})
        for i in range(4)
    ]
    problem = problem_for(snapshot, built(members))
    assert problem.num_classes == 2
    assert [c.members for c in problem.classes] == [(0, 1), (2, 3)]


def test_a_placed_pods_selector_makes_the_label_readable() -> None:
    guard = member("guard").pod_anti_affinity(LABEL_HOSTNAME, {"tier": "db"})
    snapshot = cluster([make_node(f"n{i}") for i in range(3)], [(guard, "n0")])
    members = [member(f"m{i}").label("tier", "db" if i == 0 else "web") for i in range(3)]
    problem, plan = plan_for(snapshot, members)
    assert problem.num_classes == 2
    assert dict(plan.placements)[0] != "n0"


def test_lattice_annotations_split_the_class() -> None:
    snapshot = cluster([make_node(f"n{i}") for i in range(2)])
    members = [member("m0", 1), annotate(member("m1", 1), "lattice.dev/gpu-alignment", "strict")]
    assert problem_for(snapshot, built(members)).num_classes == 2


def test_without_merging_every_member_is_its_own_class() -> None:
    snapshot = cluster([make_node(f"n{i}") for i in range(2)])
    problem = problem_for(snapshot, built([indexed(i) for i in range(3)]), merge=False)
    assert problem.num_classes == 3


def test_topology_alignment_filters_nodes_per_class() -> None:
    # n0 has one GPU free under every switch: a strict 2-GPU member cannot align there.
    bed = gpu_bed(2)
    holding(bed, "n0", [0, 2, 4, 6])
    members = built([gpu_pod(f"s{i}", 2, alignment="strict") for i in range(2)])
    problem, plan = plan_for(bed.snapshot, members, topology=bed.state)
    assert problem.classes[0].topology_active
    assert "Topology" in problem.classes[0].rejecting_plugins
    assert {node for _, node in plan.placements} == {"n1"}


def test_topology_limits_how_many_aligned_members_share_a_node() -> None:
    # n0 still has 4 GPUs free, but no two under one switch; n1 aligns four 2-GPU members.
    bed = gpu_bed(2)
    holding(bed, "n0", [0, 2, 4, 6])
    members = built([gpu_pod(f"s{i}", 2, alignment="strict") for i in range(5)])
    problem, plan = plan_for(bed.snapshot, members, topology=bed.state)
    n1 = problem.node_names.index("n1")
    assert problem.limit[0, n1] == 4
    assert plan.status is SolveStatus.INFEASIBLE
    assert "4/5 members fit" in plan.message

    preferred = built([gpu_pod(f"p{i}", 2) for i in range(5)])
    _, loose = plan_for(bed.snapshot, preferred, topology=bed.state)
    assert loose.status is SolveStatus.OPTIMAL
    assert len(loose.placements) == 5
