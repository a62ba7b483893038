"""VolumeBinding: claims decide the node together with their PVs, as kube-scheduler 1.34."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core.plugins.volume_binding import (
    REASON_BIND_CONFLICT,
    REASON_NODE_CONFLICT,
    REASON_PV_NOT_EXIST,
    REASON_UNBOUND_IMMEDIATE,
    plan_volume_bindings,
)
from scheduler.core.profile import DEFAULT_PROFILE, Profile
from scheduler.core.snapshot import Snapshot
from scheduler.core.volumes import VolumeState, volume_state_from_api
from scheduler.model.pod import Pod
from scheduler.model.volume import BOUND_BY_CONTROLLER, SELECTED_NODE, PersistentVolume
from tests.builders import make_node, make_pod
from tests.e2e.differential.volumes_objects import (
    Body,
    claim_volume,
    pv,
    pvc,
    schedule_with_volumes,
    storage_class,
)

ZONE = "topology.kubernetes.io/zone"


def cluster(n: int = 3) -> Snapshot:
    snap = Snapshot()
    for i in range(n):
        snap.add_node(make_node(f"node-{i}").label(ZONE, f"z{i % 2}").build())
    return snap


def state(
    pvs: Sequence[Body] = (), pvcs: Sequence[Body] = (), classes: Sequence[Body] = ()
) -> VolumeState:
    built = volume_state_from_api(
        pvs=pvs,
        pvcs=pvcs,
        classes=[storage_class("local"), storage_class("fast", mode="Immediate"), *classes],
    )
    assert not built.skipped
    return built.state


def pod_with(*claims: str, uid: str = "") -> Pod:
    builder = make_pod("p").uid(uid) if uid else make_pod("p")
    builder.body["spec"]["volumes"] = [claim_volume(f"v{i}", c) for i, c in enumerate(claims)]
    return builder.build()


def feasible(snap: Snapshot, pod: Pod, volumes: VolumeState) -> list[str]:
    decision, _ = schedule_with_volumes(snap, pod, volumes)
    return list(decision.feasible)


def test_wait_for_first_consumer_lands_on_the_only_matching_local_pv() -> None:
    snap = cluster()
    volumes = state(pvs=[pv("pv-1", host="node-1")], pvcs=[pvc("data")])
    decision, plan = schedule_with_volumes(snap, pod_with("data"), volumes)
    assert decision.selected == "node-1"
    assert plan is not None
    assert plan.node == "node-1"
    assert [(s.pv, s.claim_name, s.set_bound_by_controller) for s in plan.static] == [
        ("pv-1", "data", True)
    ]
    assert decision.reason_counts() == {REASON_BIND_CONFLICT: 2}
    (patch,) = plan.patches()
    assert patch.kind == "PersistentVolume"
    assert patch.name == "pv-1"
    assert patch.body["spec"]["claimRef"]["name"] == "data"
    assert patch.body["metadata"]["annotations"] == {BOUND_BY_CONTROLLER: "yes"}


def test_smallest_fitting_pv_is_chosen_and_each_claim_gets_its_own() -> None:
    snap = cluster(1)
    pvs = [
        pv("big", "100Gi", host="node-0"),
        pv("small", "6Gi", host="node-0"),
        pv("tiny", "1Gi", host="node-0"),
        pv("mid", "20Gi", host="node-0"),
    ]
    volumes = state(pvs=pvs, pvcs=[pvc("a", "5Gi"), pvc("b", "10Gi"), pvc("c", "5Gi")])
    _, plan = schedule_with_volumes(snap, pod_with("b", "a", "c"), volumes)
    assert plan is not None
    # Smallest request first: a -> small, c -> mid (small is taken), b -> big.
    assert {s.claim_name: s.pv for s in plan.static} == {"a": "small", "c": "mid", "b": "big"}


def test_claims_competing_for_one_pv_fail_without_a_provisioner() -> None:
    snap = cluster(1)
    volumes = state(pvs=[pv("only", host="node-0")], pvcs=[pvc("a"), pvc("b")])
    decision, _ = schedule_with_volumes(snap, pod_with("a", "b"), volumes)
    assert decision.selected is None
    assert decision.reason_counts() == {REASON_BIND_CONFLICT: 1}


@pytest.mark.parametrize(
    ("volume", "claim"),
    [
        pytest.param(pv("x", "1Gi", host="node-0"), pvc("c", "2Gi"), id="too-small"),
        pytest.param(pv("x", modes=["ReadOnlyMany"], host="node-0"), pvc("c"), id="modes"),
        pytest.param(pv("x", storage_class="other", host="node-0"), pvc("c"), id="class"),
        pytest.param(pv("x", volume_mode="Block", host="node-0"), pvc("c"), id="volume-mode"),
        pytest.param(pv("x", phase="Released", host="node-0"), pvc("c"), id="not-available"),
        pytest.param(pv("x", claim=("default", "other"), host="node-0"), pvc("c"), id="claimed"),
        pytest.param(
            pv("x", labels={"tier": "gold"}, host="node-0"),
            pvc("c", selector={"matchLabels": {"tier": "silver"}}),
            id="selector",
        ),
    ],
)
def test_pv_that_does_not_match_the_claim_is_not_used(volume: Body, claim: Body) -> None:
    snap = cluster(1)
    decision, _ = schedule_with_volumes(snap, pod_with("c"), state(pvs=[volume], pvcs=[claim]))
    assert decision.reason_counts() == {REASON_BIND_CONFLICT: 1}


def test_prebound_pv_wins_over_a_smaller_one_and_keeps_its_claim_ref() -> None:
    snap = cluster(2)
    pvs = [
        pv("small", "5Gi", host="node-0"),
        pv("mine", "50Gi", host="node-1", claim=("default", "c")),
    ]
    decision, plan = schedule_with_volumes(snap, pod_with("c"), state(pvs=pvs, pvcs=[pvc("c")]))
    assert decision.selected == "node-1"
    assert plan is not None
    assert [(s.pv, s.set_bound_by_controller) for s in plan.static] == [("mine", False)]


def test_bound_claim_follows_its_pv_node_affinity() -> None:
    snap = cluster()
    volumes = state(
        pvs=[pv("pv-2", host="node-2", phase="Bound", claim=("default", "c"))],
        pvcs=[pvc("c", volume_name="pv-2", bound=True)],
    )
    decision, plan = schedule_with_volumes(snap, pod_with("c"), volumes)
    assert decision.selected == "node-2"
    assert plan is None
    assert decision.reason_counts() == {REASON_NODE_CONFLICT: 2}


def test_pv_affinity_on_metadata_name_never_matches() -> None:
    """kube checks a PV's affinity against a node of labels only: no name to match."""
    snap = cluster(1)
    volume = pv("x", phase="Bound")
    volume["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"] = [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-0"]}]}
    ]
    volumes = state(pvs=[volume], pvcs=[pvc("c", volume_name="x", bound=True)])
    decision, _ = schedule_with_volumes(snap, pod_with("c"), volumes)
    assert decision.reason_counts() == {REASON_NODE_CONFLICT: 1}


def test_claim_bound_to_a_missing_pv_is_reported_per_node() -> None:
    snap = cluster(2)
    volumes = state(pvs=[], pvcs=[pvc("c", volume_name="gone", bound=True)])
    # VolumeZone's PreFilter reads the PV too and rejects first, as kube's does.
    decision, _ = schedule_with_volumes(snap, pod_with("c"), volumes)
    assert decision.reason_counts() == {'persistentvolume "gone" not found': 2}
    no_zone = Profile(filters=tuple(f for f in DEFAULT_PROFILE.filters if f != "VolumeZone"))
    decision, _ = schedule_with_volumes(snap, pod_with("c"), volumes, profile=no_zone)
    assert decision.reason_counts() == {REASON_PV_NOT_EXIST: 2}


@pytest.mark.parametrize(
    ("claims", "message"),
    [
        pytest.param([], 'persistentvolumeclaim "c" not found', id="missing"),
        pytest.param([pvc("c", storage_class="fast")], REASON_UNBOUND_IMMEDIATE, id="immediate"),
        pytest.param([pvc("c", storage_class=None)], REASON_UNBOUND_IMMEDIATE, id="no-class"),
        pytest.param(
            [pvc("c", storage_class="unknown")], REASON_UNBOUND_IMMEDIATE, id="unknown-class"
        ),
        pytest.param(
            [pvc("c", volume_name="pv-x")], REASON_UNBOUND_IMMEDIATE, id="prebound-not-complete"
        ),
    ],
)
def test_pod_is_rejected_whole(claims: list[Body], message: str) -> None:
    snap = cluster()
    decision, _ = schedule_with_volumes(snap, pod_with("c"), state(pvcs=claims))
    assert decision.selected is None
    assert decision.explanation.prefilter_rejection is not None
    assert decision.explanation.prefilter_rejection.message == message


def test_claim_being_deleted_or_lost() -> None:
    snap = cluster(1)
    deleting = pvc("c")
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    decision, _ = schedule_with_volumes(snap, pod_with("c"), state(pvcs=[deleting]))
    assert decision.summary.endswith('persistentvolumeclaim "c" is being deleted.')
    lost = pvc("c", volume_name="old")
    lost["status"] = {"phase": "Lost"}
    decision, _ = schedule_with_volumes(snap, pod_with("c"), state(pvcs=[lost]))
    assert 'bound to non-existent persistentvolume "old"' in decision.summary


def ephemeral_pod(uid: str) -> Pod:
    template = {"spec": {"accessModes": ["ReadWriteOnce"], "resources": {}}}
    builder = make_pod("p").uid(uid)
    builder.body["spec"]["volumes"] = [
        {"name": "scratch", "ephemeral": {"volumeClaimTemplate": template}}
    ]
    return builder.build()


def test_generic_ephemeral_claim_must_exist_and_belong_to_the_pod() -> None:
    snap = cluster(1)
    decision, _ = schedule_with_volumes(snap, ephemeral_pod("u1"), state())
    assert decision.explanation.prefilter_rejection is not None
    assert decision.explanation.prefilter_rejection.message == (
        'waiting for ephemeral volume controller to create the persistentvolumeclaim "p-scratch"'
    )
    claim = pvc("p-scratch")
    claim["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u2", "controller": True}
    ]
    decision, _ = schedule_with_volumes(snap, ephemeral_pod("u1"), state(pvcs=[claim]))
    assert "PVC default/p-scratch was not created for pod default/p (pod is not owner)" in (
        decision.summary
    )
    claim["metadata"]["ownerReferences"][0]["uid"] = "u1"
    decision, _ = schedule_with_volumes(
        snap, ephemeral_pod("u1"), state(pvs=[pv("x", host="node-0")], pvcs=[claim])
    )
    assert decision.selected == "node-0"


def test_provisioner_within_allowed_topologies_and_selected_node_annotation() -> None:
    snap = cluster(3)
    classes = [storage_class("csi", provisioner="ebs.csi.aws.com", zones=["z1"])]
    volumes = state(pvcs=[pvc("c", storage_class="csi")], classes=classes)
    decision, plan = schedule_with_volumes(snap, pod_with("c"), volumes)
    assert decision.selected == "node-1"  # the only node in z1
    assert decision.reason_counts() == {REASON_BIND_CONFLICT: 2}
    assert plan is not None
    assert not plan.static
    (patch,) = plan.patches()
    assert patch.kind == "PersistentVolumeClaim"
    assert patch.body["metadata"]["annotations"] == {SELECTED_NODE: "node-1"}
    volumes.assume(plan)
    assert volumes.pvcs[("default", "c")].selected_node == "node-1"
    # A claim already annotated for another node fits only that node.
    other = state(pvcs=[pvc("c", storage_class="csi", selected_node="node-0")], classes=classes)
    decision, _ = schedule_with_volumes(snap, pod_with("c"), other)
    assert decision.reason_counts() == {REASON_BIND_CONFLICT: 3}


def test_assumed_pv_is_not_offered_to_the_next_claim() -> None:
    snap = cluster(1)
    volumes = state(pvs=[pv("only", host="node-0")], pvcs=[pvc("a"), pvc("b")])
    _, plan = schedule_with_volumes(snap, pod_with("a"), volumes)
    assert plan is not None
    volumes.assume(plan)
    decision, _ = schedule_with_volumes(snap, pod_with("b"), volumes)
    assert decision.reason_counts() == {REASON_BIND_CONFLICT: 1}


def test_assumption_survives_a_stale_echo_and_can_be_forgotten() -> None:
    snap = cluster(1)
    body = pv("only", host="node-0")
    body["metadata"]["resourceVersion"] = "7"
    volumes = state(pvs=[body], pvcs=[pvc("a"), pvc("b")])
    _, plan = schedule_with_volumes(snap, pod_with("a"), volumes)
    assert plan is not None
    volumes.assume(plan)
    volumes.set_pv(PersistentVolume.from_api(body))  # the pre-assumption version, re-listed
    decision, _ = schedule_with_volumes(snap, pod_with("b"), volumes)
    assert decision.selected is None
    volumes.forget(plan)
    decision, _ = schedule_with_volumes(snap, pod_with("b"), volumes)
    assert decision.selected == "node-0"
    # A newer version from the API replaces the assumption.
    volumes.assume(plan)
    newer = pv("only", host="node-0", claim=("default", "a"))
    newer["metadata"]["resourceVersion"] = "8"
    volumes.set_pv(PersistentVolume.from_api(newer))
    assert volumes.pvs["only"].resource_version == "8"


def test_plan_for_a_node_that_does_not_fit_is_an_error() -> None:
    snap = cluster(2)
    volumes = state(pvs=[pv("x", host="node-1")], pvcs=[pvc("c")])
    with pytest.raises(ValueError, match="does not fit"):
        plan_volume_bindings(snap, volumes, pod_with("c"), "node-0")
    assert plan_volume_bindings(snap, volumes, make_pod("plain").build(), "node-0") is None


def _naive_feasible(nodes: int, pvs: list[tuple[int, int]], requests: list[int]) -> set[str]:
    """Brute force over kube's greedy: claims by size, each the smallest free PV on the node."""
    out: set[str] = set()
    for node in range(nodes):
        free = sorted((cap, i) for i, (cap, host) in enumerate(pvs) if host == node)
        ok = True
        for req in sorted(requests):
            pick = next((p for p in free if p[0] >= req), None)
            if pick is None:
                ok = False
                break
            free.remove(pick)
        if ok:
            out.add(f"node-{node}")
    return out


@settings(max_examples=60, deadline=None)
@given(
    nodes=st.integers(1, 4),
    pvs=st.lists(st.tuples(st.integers(1, 8), st.integers(0, 3)), max_size=8),
    requests=st.lists(st.integers(1, 8), min_size=1, max_size=3),
)
def test_local_pv_matching_agrees_with_a_brute_force_greedy(
    nodes: int, pvs: list[tuple[int, int]], requests: list[int]
) -> None:
    snap = cluster(nodes)
    bodies = [pv(f"pv-{i}", f"{cap}Gi", host=f"node-{h}") for i, (cap, h) in enumerate(pvs)]
    claims = [pvc(f"c{i}", f"{r}Gi") for i, r in enumerate(requests)]
    volumes = state(pvs=bodies, pvcs=claims)
    pod = pod_with(*(f"c{i}" for i in range(len(requests))))
    assert set(feasible(snap, pod, volumes)) == _naive_feasible(nodes, pvs, requests)
