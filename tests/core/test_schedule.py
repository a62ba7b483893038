"""The scheduling cycle end to end with the default profile: FailedScheduling summaries,
reason counting, filter order, PreFilter rejections, selection, ties and the plugin registry."""

from __future__ import annotations

import json
from functools import partial

import pytest

from scheduler.core.explain import Decision
from scheduler.core.framework import Code, Cycle, FilterResult, PreFilterResult
from scheduler.core.profile import (
    DEFAULT_KUBE_MINOR,
    DEFAULT_PROFILE,
    NEWEST_KUBE_MINOR,
    Profile,
    kube_profile,
    nearest_kube_minor,
)
from scheduler.core.registry import (
    DuplicatePluginError,
    Registry,
    UnknownPluginError,
    default_registry,
)
from scheduler.core.schedule import Framework, schedule
from scheduler.core.snapshot import BoolArray
from tests.builders import NodeBuilder, PodBuilder, as_pod, cluster, make_node, make_pod


def decide(
    pod: PodBuilder,
    nodes: list[NodeBuilder],
    pods: list[tuple[PodBuilder, str]] | None = None,
    seed: int = 0,
) -> Decision:
    return schedule(cluster(nodes, pods or []), as_pod(pod), DEFAULT_PROFILE, seed)


def test_failed_scheduling_message_matches_kube_scheduler() -> None:
    nodes = [make_node(f"small{i}", cpu="1", zone="a") for i in range(3)]
    nodes += [make_node(f"other{i}", cpu="8", zone="b") for i in range(9)]
    pod = make_pod("p", cpu="2").node_selector({"zone": "a"})
    decision = decide(pod, nodes)
    assert decision.selected is None
    assert decision.feasible == ()
    assert decision.summary == (
        "0/12 nodes are available: 3 Insufficient cpu, "
        "9 node(s) didn't match Pod's node affinity/selector."
    )
    assert decision.reason_counts() == {
        "Insufficient cpu": 3,
        "node(s) didn't match Pod's node affinity/selector": 9,
    }


def test_one_node_can_count_for_several_reasons_of_one_plugin() -> None:
    nodes = [make_node("n1", cpu="1", memory="1Gi"), make_node("n2", cpu="1", memory="8Gi")]
    decision = decide(make_pod("p", cpu="2", memory="2Gi"), nodes)
    assert decision.summary == "0/2 nodes are available: 1 Insufficient memory, 2 Insufficient cpu."


def test_reasons_sorted_as_strings_like_go() -> None:
    nodes = [make_node(f"t{i}").taint("k", "v") for i in range(10)]
    nodes += [make_node(f"c{i}").unschedulable() for i in range(2)]
    decision = decide(make_pod("p"), nodes)
    assert decision.summary == (
        "0/12 nodes are available: 10 node(s) had untolerated taint(s), "
        "2 node(s) were unschedulable."
    )


def test_first_failing_filter_wins() -> None:
    # Tainted and too small: only TaintToleration (earlier in the profile) is reported.
    nodes = [make_node("n", cpu="1").taint("k", "v"), make_node("m", cpu="1").unschedulable()]
    decision = decide(make_pod("p", cpu="2").node_selector({"x": "y"}), nodes)
    assert decision.reason_counts() == {
        "node(s) had untolerated taint(s)": 1,
        "node(s) were unschedulable": 1,
    }
    verdict = decision.explanation.node("n")
    assert verdict.plugin == "TaintToleration"
    assert verdict.message == "node(s) had untolerated taint(s)"


def test_codes_for_the_queue() -> None:
    too_small = decide(make_pod("p", cpu="2"), [make_node("n", cpu="1")])
    assert too_small.code is Code.UNSCHEDULABLE_AND_UNRESOLVABLE
    full = decide(
        make_pod("p", cpu="2"), [make_node("n", cpu="3")], [(make_pod("q", cpu="2"), "n")]
    )
    assert full.code is Code.UNSCHEDULABLE
    assert full.explanation.rejecting_plugins == {"NodeResourcesFit"}
    ok = decide(make_pod("p"), [make_node("n")])
    assert ok.code is Code.SUCCESS
    assert ok.selected == "n"


def test_selects_the_least_allocated_node() -> None:
    nodes = [make_node(f"n{i}", cpu="4", memory="8Gi") for i in range(3)]
    pods = [
        (make_pod("a", cpu="3", memory="6Gi"), "n0"),
        (make_pod("b", cpu="1", memory="1Gi"), "n2"),
    ]
    decision = decide(make_pod("p", cpu="1", memory="1Gi"), nodes, pods)
    assert decision.selected == "n1"
    totals = {n: decision.explanation.node(n).total for n in decision.feasible}
    assert max(totals, key=lambda n: totals[n] or 0) == "n1"


def test_ties_broken_by_seed_deterministically() -> None:
    nodes = [make_node(f"n{i}") for i in range(8)]
    picks = {decide(make_pod("p", cpu="1"), nodes, seed=s).selected for s in range(40)}
    assert len(picks) > 1
    for s in range(5):
        assert (
            decide(make_pod("p", cpu="1"), nodes, seed=s).selected
            == decide(make_pod("p", cpu="1"), nodes, seed=s).selected
        )


def test_gated_pods_are_not_scheduled() -> None:
    decision = decide(make_pod("p").gate("a").gate("b"), [make_node("n")])
    assert decision.selected is None
    assert decision.summary == "waiting for scheduling gates: [a b]"
    assert decision.reason_counts() == {}
    assert decision.code is Code.UNSCHEDULABLE_AND_UNRESOLVABLE


def test_no_nodes() -> None:
    decision = decide(make_pod("p"), [])
    assert decision.summary == "no nodes available to schedule pods"
    assert decision.selected is None


def test_success_summary_and_json() -> None:
    nodes = [make_node("a", cpu="1"), make_node("b", cpu="4"), make_node("c").taint("k")]
    decision = decide(make_pod("p", cpu="2"), nodes)
    assert decision.summary == (
        "1/3 nodes are available: 1 Insufficient cpu, 1 node(s) had untolerated taint(s)."
    )
    body = decision.to_json()
    json.dumps(body)
    assert body["selected"] == "b"
    assert body["feasible"] == ["b"]
    assert body["nodes"]["a"]["filter"] == "Insufficient cpu"
    assert body["nodes"]["a"]["code"] == "UNSCHEDULABLE_AND_UNRESOLVABLE"
    assert body["nodes"]["b"]["filter"] is None
    assert set(body["nodes"]["b"]["scores"]) == {
        "TaintToleration",
        "NodeResourcesFit",
        "NodeResourcesBalancedAllocation",
    }
    b = body["nodes"]["b"]
    assert b["total"] == sum(b["weighted_scores"].values())
    assert b["weighted_scores"]["TaintToleration"] == 3 * b["scores"]["TaintToleration"]
    assert "NodeAffinity" in body["skipped"]["scores"]


def test_snapshot_changes_are_seen_by_the_next_cycle() -> None:
    snapshot = cluster([make_node("a", cpu="2"), make_node("b", cpu="2")])
    framework = Framework()
    first = make_pod("first", cpu="2").build()
    decision = framework.schedule(snapshot, first)
    assert decision.selected is not None
    snapshot.add_pod(first, decision.selected)
    second = framework.schedule(snapshot, make_pod("second", cpu="2").build())
    assert second.feasible == tuple(n for n in ("a", "b") if n != decision.selected)
    third = framework.schedule(snapshot, make_pod("third", cpu="1").build())
    assert third.selected == second.selected
    snapshot.remove_pod(first)
    assert len(framework.schedule(snapshot, make_pod("again", cpu="2").build()).feasible) == 2


class RejectEverything:
    name = "RejectEverything"

    def filter(self, cycle: Cycle, candidates: BoolArray) -> FilterResult | None:
        return FilterResult.from_mask(candidates.copy(), "nope", Code.UNSCHEDULABLE)


def test_registry_refuses_duplicates_and_unknown_plugins() -> None:
    registry = default_registry()
    with pytest.raises(DuplicatePluginError):
        registry.register("NodeResourcesFit", lambda profile: RejectEverything())
    with pytest.raises(UnknownPluginError):
        registry.build(Profile(name="x", filters=("Nope",), scores=()))
    with pytest.raises(UnknownPluginError):
        registry.build(Profile(name="x", filters=("NodeResourcesBalancedAllocation",), scores=()))
    with pytest.raises(UnknownPluginError):
        registry.build(Profile(name="x", filters=(), scores=(("NodeName", 1),)))


def test_custom_plugin_through_registry() -> None:
    registry = Registry()
    registry.register(RejectEverything.name, lambda profile: RejectEverything())
    framework = Framework(
        Profile(name="custom", filters=("RejectEverything",), scores=()), registry
    )
    decision = framework.schedule(cluster([make_node("a"), make_node("b")]), make_pod("p").build())
    assert decision.summary == "0/2 nodes are available: 2 nope."
    assert decision.code is Code.UNSCHEDULABLE


@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param({"filters": ("NodeName", "NodeName")}, id="duplicate-filter"),
        pytest.param({"scores": (("NodeAffinity", 1), ("NodeAffinity", 2))}, id="duplicate-score"),
        pytest.param({"scores": (("NodeAffinity", 0),)}, id="zero-weight"),
        pytest.param({"kube_minor": 34}, id="release-below-the-window"),
        pytest.param({"kube_minor": 38}, id="release-above-the-window"),
        pytest.param({"kube_minor": True}, id="release-not-an-int"),
    ],
)
def test_profile_validation(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - the message names the profile
        Profile(name="bad", **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("minor", "nearest"), [(0, 35), (34, 35), (35, 35), (36, 36), (37, 37), (38, 37), (99, 37)]
)
def test_nearest_kube_minor(minor: int, nearest: int) -> None:
    assert nearest_kube_minor(minor) == nearest


def test_profiles_mirror_the_newest_release_by_default() -> None:
    assert DEFAULT_PROFILE.kube_minor == DEFAULT_KUBE_MINOR == NEWEST_KUBE_MINOR == 37
    assert kube_profile().kube_minor == 37
    assert kube_profile(kube_minor=35).kube_minor == 35


def test_default_profile_order_matches_kube_scheduler() -> None:
    """kube-scheduler's plugins in its order (DynamicResources after InterPodAffinity, where
    kube's defaults put it, scoring with weight 2 since 1.35; NodeDeclaredFeatures after it,
    appended when its gate is on, a no-op at 1.35 where it is off); Lattice's Unsupported
    (refuses pods with volumes or DRA claims it cannot place yet; a no-op for the others)
    comes first, then scheduler-plugins' CapacityScheduling (a PreFilter only, a no-op
    without ElasticQuotas), Topology (a no-op for pods without devices or pinned CPUs) and
    LoadAware (a no-op without load reports) come last; GPUPlacement only scores."""
    assert DEFAULT_PROFILE.filters[-2:] == ("Topology", "LoadAware")
    assert dict(DEFAULT_PROFILE.scores)["Topology"] == 5
    assert dict(DEFAULT_PROFILE.scores)["LoadAware"] == 3
    assert dict(DEFAULT_PROFILE.scores)["GPUPlacement"] == 5
    assert DEFAULT_PROFILE.filters[:-2] == (
        "Unsupported",
        "CapacityScheduling",
        "NodeUnschedulable",
        "NodeName",
        "TaintToleration",
        "NodeAffinity",
        "NodePorts",
        "NodeResourcesFit",
        "VolumeRestrictions",
        "NodeVolumeLimits",
        "VolumeBinding",
        "VolumeZone",
        "PodTopologySpread",
        "InterPodAffinity",
        "DynamicResources",
        "NodeDeclaredFeatures",
    )
    ours = ("Topology", "LoadAware", "GPUPlacement")
    assert {k: w for k, w in DEFAULT_PROFILE.scores if k not in ours} == {
        "TaintToleration": 3,
        "NodeAffinity": 2,
        "NodeResourcesFit": 1,
        "VolumeBinding": 1,  # no weight in default_plugins.go: kube takes 1
        "PodTopologySpread": 2,
        "InterPodAffinity": 2,
        "DynamicResources": 2,
        "NodeResourcesBalancedAllocation": 1,
    }


class Narrow:
    """A test PreFilter plugin that restricts candidates to fixed node names."""

    def __init__(self, name: str, nodes: frozenset[str], code: Code = Code.SUCCESS) -> None:
        self.name = name
        self.nodes = nodes
        self.code = code

    def pre_filter(self, cycle: Cycle) -> PreFilterResult:
        if self.code is not Code.SUCCESS:
            return PreFilterResult(self.code, f"{self.name} says no")
        return PreFilterResult(node_names=self.nodes)

    def filter(self, cycle: Cycle, candidates: BoolArray) -> FilterResult | None:
        return None


def _same(plugin: Narrow, profile: Profile) -> Narrow:
    return plugin


def narrowing_framework(*plugins: Narrow) -> Framework:
    registry = Registry()
    for plugin in plugins:
        registry.register(plugin.name, partial(_same, plugin))
    profile = Profile(name="narrow", filters=tuple(p.name for p in plugins), scores=())
    return Framework(profile, registry)


NODES = [make_node("a"), make_node("b"), make_node("c")]


def test_prefilter_node_sets_intersect() -> None:
    framework = narrowing_framework(Narrow("P1", frozenset("ab")), Narrow("P2", frozenset("bc")))
    decision = framework.schedule(cluster(NODES), make_pod("p").build())
    assert decision.feasible == ("b",)
    assert decision.reason_counts() == {"node(s) didn't satisfy plugin(s) [P1 P2]": 2}


@pytest.mark.parametrize(
    ("plugins", "message"),
    [
        pytest.param(
            (Narrow("P1", frozenset("a")), Narrow("P2", frozenset("b"))),
            "node(s) didn't satisfy plugin(s) [P1 P2] simultaneously",
            id="disjoint",
        ),
        pytest.param((Narrow("P1", frozenset()),), "node(s) didn't satisfy plugin P1", id="empty"),
        pytest.param(
            (Narrow("P1", frozenset(), Code.UNSCHEDULABLE), Narrow("P2", frozenset("a"))),
            "P1 says no",
            id="unschedulable-prefilter",
        ),
        pytest.param(
            (
                Narrow("P1", frozenset(), Code.UNSCHEDULABLE_AND_UNRESOLVABLE),
                Narrow("P2", frozenset(), Code.UNSCHEDULABLE),
            ),
            "P1 says no",
            id="unresolvable-stops-prefilter",
        ),
    ],
)
def test_prefilter_rejections(plugins: tuple[Narrow, ...], message: str) -> None:
    decision = narrowing_framework(*plugins).schedule(cluster(NODES), make_pod("p").build())
    assert decision.summary == f"0/3 nodes are available: {message}."
    assert decision.reason_counts() == {message: 3}
    assert decision.explanation.node("a").reasons == (message,)
