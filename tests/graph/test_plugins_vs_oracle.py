"""The graph-backed InterPodAffinity and PodTopologySpread against the naive oracle plugins.

Clusters come from random event sequences through the snapshot (so removals, moves,
relabels and node churn shape the graph), and every verdict must be identical: per-node
reasons and codes, reason counts, summaries, scores, skips and the selected node, for each
plugin alone and for both together behind the node filters that feed the spread policies.
The PreFilter/PreScore states are compared directly too, since filters only show their sign.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lattice_dev.core.oracle import inter_pod_affinity as ipa_oracle
from lattice_dev.graph.naive import NaiveInterPodAffinity, NaivePodTopologySpread, naive_registry
from scheduler.core.framework import (
    Code,
    Cycle,
    FilterPlugin,
    FilterResult,
    PreFilterPlugin,
    ScorePlugin,
)
from scheduler.core.plugins import inter_pod_affinity as ipa
from scheduler.core.plugins.inter_pod_affinity import InterPodAffinity
from scheduler.core.plugins.pod_topology_spread import PodTopologySpread
from scheduler.core.profile import (
    INTER_POD_AFFINITY,
    NODE_AFFINITY,
    NODE_UNSCHEDULABLE,
    POD_TOPOLOGY_SPREAD,
    TAINT_TOLERATION,
    InterPodAffinityArgs,
    Profile,
)
from scheduler.core.schedule import Framework
from scheduler.core.snapshot import IntArray, Snapshot
from scheduler.model.pod import Pod
from tests.builders import make_node, make_pod
from tests.graph.strategies import dense_clusters, event_lists, feed_snapshot, pods

FILTERS = (NODE_UNSCHEDULABLE, TAINT_TOLERATION, NODE_AFFINITY, POD_TOPOLOGY_SPREAD)


def profiles(args: InterPodAffinityArgs) -> list[Profile]:
    both = ((POD_TOPOLOGY_SPREAD, 2), (INTER_POD_AFFINITY, 3))
    return [
        Profile("both", (*FILTERS, INTER_POD_AFFINITY), both, inter_pod_affinity=args),
        Profile("ipa-filter", (INTER_POD_AFFINITY,), (), inter_pod_affinity=args),
        Profile("pts-filter", (POD_TOPOLOGY_SPREAD,), ()),
        Profile("ipa-score", (), ((INTER_POD_AFFINITY, 1),), inter_pod_affinity=args),
        Profile("pts-score", (NODE_AFFINITY,), ((POD_TOPOLOGY_SPREAD, 1),)),
    ]


def assert_same_decisions(snapshot: Snapshot, pod: Pod, args: InterPodAffinityArgs) -> None:
    for profile in profiles(args):
        fast = Framework(profile).schedule(snapshot, pod, seed=7)
        naive = Framework(profile, naive_registry()).schedule(snapshot, pod, seed=7)
        assert fast.explanation.to_json() == naive.explanation.to_json(), profile.name
        assert fast.selected == naive.selected, profile.name


args_strategy = st.builds(
    InterPodAffinityArgs,
    hard_pod_affinity_weight=st.sampled_from([0, 1, 7]),
    ignore_preferred_terms_of_existing_pods=st.booleans(),
)


@settings(max_examples=200, deadline=None)
@given(
    st.one_of(event_lists(), dense_clusters()), pods(uid="incoming", name="incoming"), args_strategy
)
def test_graph_plugins_decide_exactly_like_the_oracle(
    events: list[tuple[Any, ...]], pod: Pod, args: InterPodAffinityArgs
) -> None:
    snapshot = Snapshot()
    for event in events:
        feed_snapshot(snapshot, event)
    graph = snapshot.affinity_graph
    assert ipa.required_state(graph, pod) == ipa_oracle.required_state(snapshot, pod)
    for weight in (0, 1, 7):
        for ignore in (False, True):
            assert ipa.topology_scores(
                graph,
                pod,
                hard_pod_affinity_weight=weight,
                ignore_preferred_terms_of_existing_pods=ignore,
            ) == ipa_oracle.preferred_topology_scores(
                snapshot,
                pod,
                hard_pod_affinity_weight=weight,
                ignore_preferred_terms_of_existing_pods=ignore,
            )
    assert_same_decisions(snapshot, pod, args)


@settings(max_examples=60, deadline=None)
@given(event_lists())
def test_placed_pods_rescheduled_agree_too(events: list[tuple[Any, ...]]) -> None:
    """Each placed pod, asked again: its own siblings now fill the domains it counts."""
    snapshot = Snapshot()
    for event in events:
        feed_snapshot(snapshot, event)
    for i in range(snapshot.num_nodes):
        for placed in list(snapshot.pods_on(i))[:2]:
            assert_same_decisions(snapshot, placed, InterPodAffinityArgs())


@pytest.mark.parametrize(
    "pod",
    [
        pytest.param(
            make_pod("p").label("app", "web").pod_anti_affinity("zone", {"app": "web"}),
            id="required-anti-affinity",
        ),
        pytest.param(
            make_pod("p")
            .label("app", "web")
            .pod_affinity("zone", {"app": "web"})
            .pod_affinity("rack", {"tier": "a"}),
            id="two-required-affinity-terms",
        ),
        pytest.param(make_pod("p").pod_affinity("zone", {"app": "web"}, weight=30), id="preferred"),
        pytest.param(
            make_pod("p").label("app", "web").spread(1, "zone", {"app": "web"}, min_domains=4),
            id="spread-min-domains",
        ),
        pytest.param(
            make_pod("p")
            .label("app", "web")
            .node_affinity_in("zone", "z1", "z2")
            .spread(1, "zone", {"app": "web"})
            .spread(1, "kubernetes.io/hostname", {"app": "web"}, hard=False),
            id="spread-policies-and-hostname-score",
        ),
        pytest.param(
            make_pod("p")
            .label("app", "web")
            .node_affinity_in("zone", "z1")
            .spread(1, "zone", {"app": "web"}),
            id="spread-counts-only-nodes-passing-node-affinity",
        ),
        pytest.param(
            make_pod("p")
            .label("app", "web")
            .spread(1, "zone", {"app": "web"}, node_taints_policy="Honor")
            .spread(1, "rack", {"app": "web"}, hard=False, node_taints_policy="Honor"),
            id="spread-honours-taints",
        ),
        pytest.param(
            make_pod("p")
            .pod_affinity("zone", {"app": "web"}, weight=2)
            .pod_anti_affinity("rack", {"tier": "a"}, weight=1),
            id="preferred-scores-round-down",
        ),
    ],
)
def test_hand_written_cluster(pod: Any) -> None:
    nodes = [make_node(f"n{i}", zone=f"z{i % 3 + 1}", rack=f"r{i % 2}").build() for i in range(5)]
    nodes.append(make_node("n5", zone="z3", rack="r1").taint("dedicated", "x").build())
    placed = [
        (make_pod(f"e{j}").labels({"app": "web", "tier": "ab"[j % 3 % 2]}).build(), f"n{j % 6}")
        for j in range(11)
    ]
    snapshot = Snapshot(nodes, placed)
    assert_same_decisions(snapshot, pod.build(), InterPodAffinityArgs())


class _Plugin(PreFilterPlugin, FilterPlugin, ScorePlugin, Protocol):
    """What both inter-pod plugins implement."""


def _same_filter(fast: FilterResult | None, naive: FilterResult | None, n: int) -> None:
    def as_dict(result: FilterResult | None) -> dict[str, list[bool]]:
        if result is None:
            return {}
        return {reason: mask.tolist() for reason, mask in result.reasons}

    assert as_dict(fast) == as_dict(naive)
    codes = [np.zeros(n, dtype=np.int8) if r is None else r.codes for r in (fast, naive)]
    assert codes[0].tolist() == codes[1].tolist()


def _same_scores(fast: IntArray | None, naive: IntArray | None) -> None:
    assert (fast is None) == (naive is None)
    if fast is not None and naive is not None:
        assert fast.tolist() == naive.tolist()


@settings(max_examples=200, deadline=None)
@given(dense_clusters(), pods(uid="incoming", name="incoming"), st.data())
def test_plugins_agree_for_any_policy_vectors_candidates_and_feasible_rows(
    events: list[tuple[Any, ...]], pod: Pod, data: st.DataObject
) -> None:
    """Arbitrary node-affinity and taint vectors, candidate and feasible rows: the spread
    policies' exclusions and the score normalisations are exercised far more often than
    real node filters would."""
    snapshot = Snapshot()
    for event in events:
        feed_snapshot(snapshot, event)
    n = snapshot.num_nodes
    masks = st.lists(st.booleans(), min_size=n, max_size=n).map(lambda v: np.array(v, bool))
    affinity_ok, taints_ok, candidates, feasible = (data.draw(masks) for _ in range(4))

    def cycle() -> Cycle:
        c = Cycle(snapshot, pod)
        c.memo("required_node_affinity", lambda: affinity_ok)
        c.memo("untolerated_taints", lambda: ~taints_ok)
        return c

    pairs: list[tuple[_Plugin, _Plugin]] = [
        (PodTopologySpread(), NaivePodTopologySpread()),
        (InterPodAffinity(InterPodAffinityArgs()), NaiveInterPodAffinity(InterPodAffinityArgs())),
    ]
    for fast_plugin, naive_plugin in pairs:
        fast_cycle, naive_cycle = cycle(), cycle()
        pre = fast_plugin.pre_filter(fast_cycle)
        assert pre == naive_plugin.pre_filter(naive_cycle)
        if pre.code is Code.SUCCESS:
            _same_filter(
                fast_plugin.filter(fast_cycle, candidates),
                naive_plugin.filter(naive_cycle, candidates),
                n,
            )
        _same_scores(
            fast_plugin.score(fast_cycle, feasible), naive_plugin.score(naive_cycle, feasible)
        )
