"""NodeDeclaredFeatures (ported cases from kube-scheduler v1.37.2's
``plugins/nodedeclaredfeatures/nodedeclaredfeatures_test.go``, with the real features in place
of its mock ones), per release: off at 1.35, on at 1.36 and 1.37, each release's features."""

from __future__ import annotations

import dataclasses

import pytest

from scheduler.core.framework import Code, Cycle
from scheduler.core.plugins import node_declared_features as ndf
from scheduler.core.profile import DEFAULT_PROFILE, Profile
from scheduler.core.schedule import Framework
from scheduler.model.declared_features import (
    FEATURE_BITS,
    RESTART_ALL_CONTAINERS,
    USER_NAMESPACES_HOST_NETWORK,
    VOLUME_BIND_MOUNT_OPTIONS,
)
from tests.builders import NodeBuilder, PodBuilder, as_pod, cluster, make_node, make_pod
from tests.core.support import reasons, run

RESTART = RESTART_ALL_CONTAINERS
USERNS = USER_NAMESPACES_HOST_NETWORK
BIND = VOLUME_BIND_MOUNT_OPTIONS
REASON = "node(s) didn't match Pod's required features"


def only(kube_minor: int = 37) -> Framework:
    return Framework(Profile(name="ndf", filters=(ndf.NAME,), scores=(), kube_minor=kube_minor))


def restart_all() -> PodBuilder:
    return make_pod("p", cpu="100m").restart_rule()


def userns_host_network() -> PodBuilder:
    return make_pod("p", cpu="100m").host_network().host_users(False)


def bind_options() -> PodBuilder:
    return make_pod("p", cpu="100m").volume_mount(bind_options=["rro"])


def test_the_reason_is_kubes() -> None:
    assert ndf.REASON == REASON


# -- PreFilter (TestPreFilter) -------------------------------------------------------------


@pytest.mark.parametrize(
    ("pod", "kube_minor", "bits"),
    [
        pytest.param(make_pod("p", cpu="1"), 37, None, id="no-requirements-skip"),
        pytest.param(restart_all(), 35, None, id="plugin-disabled-1.35"),
        pytest.param(restart_all(), 36, FEATURE_BITS[RESTART], id="requirement-1.36"),
        pytest.param(userns_host_network(), 36, FEATURE_BITS[USERNS], id="userns-1.36"),
        pytest.param(
            restart_all().host_network().host_users(False),
            37,
            FEATURE_BITS[RESTART] | FEATURE_BITS[USERNS],
            id="multiple-requirements",
        ),
        # VolumeBindMountOptions is in component-helpers v0.37.2, not v0.36.3.
        pytest.param(bind_options(), 36, None, id="feature-unknown-to-1.36-skip"),
        pytest.param(bind_options(), 37, FEATURE_BITS[BIND], id="bind-options-1.37"),
    ],
)
def test_pre_filter(pod: PodBuilder, kube_minor: int, bits: int | None) -> None:
    plugin = ndf.NodeDeclaredFeatures(kube_minor=kube_minor)
    cycle = Cycle(cluster([make_node("n")]), as_pod(pod))
    result = plugin.pre_filter(cycle)
    if bits is None:
        assert result.code is Code.SKIP
        assert ndf.NAME not in cycle.state
    else:
        assert result.code is Code.SUCCESS
        assert cycle.state[ndf.NAME] == bits


def test_a_release_past_max_version_no_longer_requires_the_feature() -> None:
    """kube: "Feature not required, version > MaxVersion" (no real feature sets one yet)."""
    feature = ndf.Feature("F", since=36, max_minor=36)
    assert [feature.required_at(m) for m in (35, 36, 37)] == [False, True, False]
    assert ndf.Feature("G", since=36).required_at(99)


def test_release_features() -> None:
    assert ndf.release_bits(35) == 0
    assert ndf.release_bits(36) == FEATURE_BITS[RESTART] | FEATURE_BITS[USERNS]
    assert ndf.release_bits(37) == FEATURE_BITS[RESTART] | FEATURE_BITS[USERNS] | FEATURE_BITS[BIND]


# -- Filter (TestFilter) -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pod", "node", "fits"),
    [
        pytest.param(
            restart_all(), make_node("n").declared_features(RESTART, USERNS), True, id="matches"
        ),
        pytest.param(
            restart_all(), make_node("n").declared_features(USERNS), False, id="does-not-match"
        ),
        pytest.param(
            restart_all().volume_mount(bind_options=["rro"]),
            make_node("n").declared_features(RESTART, USERNS, BIND),
            True,
            id="node-has-more-than-needed",
        ),
        pytest.param(restart_all(), make_node("n"), False, id="node-declares-nothing"),
        pytest.param(
            restart_all().volume_mount(bind_options=["rro"]),
            make_node("n").declared_features(RESTART),
            False,
            id="some-but-not-all",
        ),
        pytest.param(
            restart_all(),
            make_node("n").declared_features(RESTART, "SomeFutureFeature"),
            True,
            id="unknown-declared-names-ignored",
        ),
    ],
)
def test_filter(pod: PodBuilder, node: NodeBuilder, fits: bool) -> None:
    decision = run(only(), pod, [node])
    assert reasons(decision)["n"] == (() if fits else (REASON,))
    if not fits:
        assert decision.code is Code.UNSCHEDULABLE_AND_UNRESOLVABLE
        assert decision.explanation.node("n").plugin == ndf.NAME


def test_a_pod_needing_nothing_skips_on_any_node() -> None:
    decision = run(only(), make_pod("p", cpu="1"), [make_node("a"), make_node("b")])
    assert decision.explanation.skipped_filters == (ndf.NAME,)
    assert set(decision.feasible) == {"a", "b"}


# -- the default profile, per release -------------------------------------------------------


def nodes() -> list[NodeBuilder]:
    return [
        make_node("plain"),
        make_node("restart").declared_features(RESTART),
        make_node("all").declared_features(RESTART, USERNS, BIND),
    ]


@pytest.mark.parametrize(
    ("pod", "kube_minor", "feasible"),
    [
        pytest.param(restart_all(), 35, {"plain", "restart", "all"}, id="1.35-gate-off"),
        pytest.param(restart_all(), 36, {"restart", "all"}, id="1.36-restart"),
        pytest.param(restart_all(), 37, {"restart", "all"}, id="1.37-restart"),
        pytest.param(bind_options(), 36, {"plain", "restart", "all"}, id="1.36-bind-unknown"),
        pytest.param(bind_options(), 37, {"all"}, id="1.37-bind"),
        pytest.param(make_pod("p", cpu="1"), 37, {"plain", "restart", "all"}, id="needs-nothing"),
    ],
)
def test_default_profile(pod: PodBuilder, kube_minor: int, feasible: set[str]) -> None:
    framework = Framework(dataclasses.replace(DEFAULT_PROFILE, kube_minor=kube_minor))
    decision = run(framework, pod, nodes())
    assert set(decision.feasible) == feasible


def test_the_failed_scheduling_message_counts_nodes_like_kube() -> None:
    decision = run(Framework(DEFAULT_PROFILE), bind_options(), nodes()[:2])
    assert decision.explanation.summary == f"0/2 nodes are available: 2 {REASON}."
    assert decision.code is Code.UNSCHEDULABLE_AND_UNRESOLVABLE
    assert decision.explanation.rejecting_plugins == {ndf.NAME}


def test_an_earlier_filter_takes_the_node_first() -> None:
    """kube appends the plugin after the others: a cordoned node counts as unschedulable."""
    decision = run(Framework(DEFAULT_PROFILE), restart_all(), [make_node("n").unschedulable()])
    assert reasons(decision)["n"] == ("node(s) were unschedulable",)


# -- the snapshot column follows node changes ---------------------------------------------


def test_a_node_gaining_and_losing_features_changes_the_verdict() -> None:
    snapshot = cluster([make_node("a"), make_node("b").declared_features(RESTART)])
    framework = only()
    pod = as_pod(restart_all())
    assert framework.schedule(snapshot, pod).feasible == ("b",)
    snapshot.update_node(make_node("a").declared_features(RESTART).build())
    assert set(framework.schedule(snapshot, pod).feasible) == {"a", "b"}
    snapshot.update_node(make_node("b").build())
    assert framework.schedule(snapshot, pod).feasible == ("a",)


def test_the_column_survives_row_moves_and_growth() -> None:
    many = [
        make_node(f"n{i}").declared_features(RESTART) if i % 3 == 0 else make_node(f"n{i}")
        for i in range(40)
    ]
    snapshot = cluster(many)
    snapshot.remove_node("n0")  # the last row moves into row 0
    snapshot.remove_node("n4")
    decision = only().schedule(snapshot, as_pod(restart_all()))
    assert set(decision.feasible) == {f"n{i}" for i in range(3, 40, 3)}
