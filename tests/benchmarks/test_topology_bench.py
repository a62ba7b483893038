"""The live topology benchmark's pure parts: the simulator's stream as PodGroup, pod and
node bodies, the placement checks and the figures, on hand-made placements."""

from __future__ import annotations

import pytest

from lattice_dev.benchmarks.gangs import GangWindow, PodRecord
from lattice_dev.benchmarks.topology import (
    LIVE,
    gang_podgroup,
    kube_key,
    live_result,
    member_bodies,
    node_bodies,
    placement_violations,
    scheduler_body,
    upstream_podgroup,
)
from scheduler.model.gang import POD_GROUP_LABEL
from scheduler.model.pod import Pod
from scheduler.model.podgroup import check_levels, gang_from_podgroup
from scheduler.model.workload import UPSTREAM_GROUP, UPSTREAM_VERSION
from scheduler.sim.topology import (
    BLOCK,
    KINDS,
    LEVELS,
    PREFERRED_RACK,
    RACK,
    REQUIRED_RACK,
    SLICES,
    Layout,
    Shape,
    make_gang,
    topology_cluster,
    topology_stream,
)

SHAPE = Shape.parse("1x2x2x8")


def labels() -> dict[str, dict[str, str]]:
    return {b["metadata"]["name"]: b["metadata"]["labels"] for b in node_bodies(SHAPE)}


def test_nodes_carry_the_simulators_names_and_levels() -> None:
    bodies = node_bodies(Shape.parse("2x4x4x8"))
    sim = topology_cluster(Shape.parse("2x4x4x8"))
    assert [b["metadata"]["name"] for b in bodies] == [n.name for n in sim]
    for body, node in zip(bodies, sim, strict=True):
        assert {k: body["metadata"]["labels"][k] for k in LEVELS} == {
            k: node.labels[k] for k in LEVELS
        }
        assert body["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    with pytest.raises(ValueError, match="GPUs"):
        node_bodies(Shape.parse("1x1x1x4"))


def test_stream_becomes_podgroups_lattice_reads_back_as_the_same_gangs() -> None:
    stream = topology_stream(Shape.parse("2x4x4x8"), gangs=60, load=1.2, seed=5, mean_run=20)
    assert {g.kind for g in stream} == set(KINDS)
    for gang in stream:
        body = gang_podgroup(gang, 22)
        body["metadata"]["namespace"] = "bench-topology"
        spec = gang_from_podgroup(body)
        check_levels(spec, LEVELS)
        assert spec.min_member == gang.members
        assert (spec.topology_key, spec.topology_preferred) == (
            gang.spec.topology_key,
            gang.spec.topology_preferred,
        )
        assert (spec.slice_size, spec.slice_key) == (gang.spec.slice_size, gang.spec.slice_key)
        pods = member_bodies(gang)
        assert [p["metadata"]["name"] for p in pods] == [p.name for p in gang.pods]
        for raw in pods:
            raw["metadata"]["namespace"] = "bench-topology"
            pod = Pod.from_api(raw)
            assert pod.labels[POD_GROUP_LABEL] == gang.name
            assert pod.scheduler_name == "lattice"
            assert pod.resources.requests["nvidia.com/gpu"] == gang.gpus
    assert scheduler_body(1.0)["spec"]["topology"]["levels"] == list(LEVELS)


def test_required_rack_check_reads_the_racks_of_the_nodes() -> None:
    gang = make_gang("req", REQUIRED_RACK, 2, 8)
    assert placement_violations(gang, [("b0-r0-n0", None), ("b0-r0-n1", None)], labels()) == []
    bad = placement_violations(gang, [("b0-r0-n0", None), ("b0-r1-n0", None)], labels())
    assert len(bad) == 1
    assert "required example.com/rack" in bad[0]
    assert "1 members bound" in placement_violations(gang, [("b0-r0-n0", None)], labels())[0]


def test_slice_check_wants_every_slice_whole_and_in_one_rack() -> None:
    gang = make_gang("sl", SLICES, 4, 4, slice_size=2)
    assert gang.spec.slice_key == RACK
    assert gang.spec.topology_preferred == BLOCK
    good = [("b0-r0-n0", "0"), ("b0-r0-n1", "0"), ("b0-r1-n0", "1"), ("b0-r1-n0", "1")]
    assert placement_violations(gang, good, labels()) == []
    split = [("b0-r0-n0", "0"), ("b0-r0-n1", "0"), ("b0-r1-n0", "1"), ("b0-r0-n0", "1")]
    assert placement_violations(gang, split, labels()) == [
        "sl: slice 1 in example.com/racks ['b0-r0', 'b0-r1']"
    ]
    unsliced = [("b0-r0-n0", "0"), ("b0-r0-n1", "0"), ("b0-r1-n0", "0"), ("b0-r1-n0", None)]
    got = placement_violations(gang, unsliced, labels())
    assert any("without a slice annotation" in v for v in got)
    assert any("slice 0 has 3 members" in v for v in got)


def test_the_kube_arm_asks_one_required_key_of_the_upstream_podgroup() -> None:
    """kube-scheduler 1.37 takes one required key: the required rack, else the slice level
    (a sliced gang in one rack); a preferred gang is a plain gang. Its pods name the group
    in ``spec.schedulingGroup`` and go to the default scheduler; its check holds it to that
    key and reads no slice annotations."""
    required = make_gang("req", REQUIRED_RACK, 2, 8)
    sliced = make_gang("sl", SLICES, 4, 4, slice_size=2)
    preferred = make_gang("pr", PREFERRED_RACK, 2, 8)
    assert [kube_key(g) for g in (required, sliced, preferred)] == [RACK, RACK, None]
    body = upstream_podgroup(sliced)
    assert body["apiVersion"] == f"{UPSTREAM_GROUP}/{UPSTREAM_VERSION}"
    assert body["spec"] == {
        "schedulingPolicy": {"gang": {"minCount": 4}},
        "schedulingConstraints": {"topology": [{"key": RACK}]},
    }
    assert "schedulingConstraints" not in upstream_podgroup(preferred)["spec"]
    for pod in member_bodies(sliced, "kube"):
        assert pod["spec"]["schedulerName"] == "default-scheduler"
        assert pod["spec"]["schedulingGroup"] == {"podGroupName": "sl"}
    one_rack = [("b0-r0-n0", None), ("b0-r0-n0", None), ("b0-r0-n1", None), ("b0-r0-n1", None)]
    assert placement_violations(sliced, one_rack, labels(), arm="kube") == []
    two = [("b0-r0-n0", None), ("b0-r0-n0", None), ("b0-r1-n1", None), ("b0-r1-n1", None)]
    assert placement_violations(sliced, two, labels(), arm="kube") == [
        "sl: required example.com/rack, members in ['b0-r0', 'b0-r1']"
    ]
    assert placement_violations(sliced, two, labels()) != []  # Lattice: no slice annotations


def _bind(rec: PodRecord, at: float, node: str, gone: float | None) -> PodRecord:
    rec.created, rec.bound, rec.node, rec.gone = at - 0.5, at, node, gone
    return rec


def test_live_figures_from_a_hand_made_timeline() -> None:
    """A (preferred rack, 2 x 8 GPUs) lands in two racks on an empty cluster (1 was
    possible); C lands in two while A leaves one node per rack (2 was the fewest), its second
    member 0.2 s later; B never binds. Allocated over [0, 10] on 32 GPUs."""
    a = make_gang("a", PREFERRED_RACK, 2, 8, created=0.0, run=4.0)
    c = make_gang("c", PREFERRED_RACK, 2, 8, created=3.0, run=4.0)
    b = make_gang("b", REQUIRED_RACK, 2, 8, created=10.0, run=4.0)
    stream = [a, c, b]
    records = {p.name: PodRecord(p.name, g.gpus, gang=g.name) for g in stream for p in g.pods}
    _bind(records["a-0"], 1.0, "b0-r0-n0", 5.0)
    _bind(records["a-1"], 1.0, "b0-r1-n0", 5.0)
    _bind(records["c-0"], 4.0, "b0-r0-n1", 8.0)
    _bind(records["c-1"], 4.2, "b0-r1-n1", 8.0)
    windows = {
        "a": GangWindow("a", ("a-0", "a-1"), opened=0.5, closed=5.0),
        "c": GangWindow("c", ("c-0", "c-1"), opened=3.5, closed=8.0),
        "b": GangWindow("b", ("b-0", "b-1"), opened=10.0, closed=30.0),
    }
    nodes = topology_cluster(SHAPE)
    result = live_result(
        stream,
        records,
        windows,
        Layout.of(nodes),
        dict.fromkeys((n.name for n in nodes), 8),
        horizon=30.0,
        seconds=31.0,
    )
    assert result.policy == LIVE
    assert (result.gangs, result.admitted, result.given_up) == (3, 2, 1)
    assert result.admitted_by_kind[PREFERRED_RACK] == 2
    assert result.arrived_by_kind[REQUIRED_RACK] == 1
    assert result.spans == [(2, 1), (2, 2)]
    assert result.allocated_pct_time == pytest.approx(100 * (16 * 4 + 8 * 4 + 8 * 3.8) / 10 / 32)
    assert result.waits == pytest.approx([0.5, 0.7])
