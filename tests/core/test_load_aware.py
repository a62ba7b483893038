"""LoadAware: filter by predicted utilisation and pressure, score by load, stay out of the
way when nothing is measured."""

from __future__ import annotations

import dataclasses

import pytest

from scheduler.core.load import LoadView
from scheduler.core.profile import (
    DEFAULT_PROFILE,
    LOAD_AWARE,
    NODE_RESOURCES_FIT,
    LoadAwareArgs,
    LoadScoreMode,
    Profile,
)
from scheduler.core.schedule import Framework
from scheduler.predict import LoadPredictor, PredictConfig, PredictionBatch, PsiSample
from tests.builders import NodeBuilder, cluster, make_node, make_pod
from tests.core.support import reasons, scores

GIB = 1024**3
NOW = 1000.0
CAP_CPU = 4000
CAP_MEM = 16 * GIB


def framework(
    *,
    filters: tuple[str, ...] = (LOAD_AWARE,),
    scores_: tuple[tuple[str, int], ...] = ((LOAD_AWARE, 1),),
    mode: LoadScoreMode = LoadScoreMode.LEAST_LOADED,
    **config: object,
) -> tuple[Framework, LoadPredictor]:
    predict = PredictConfig(**config)  # type: ignore[arg-type]
    profile = Profile(
        name="load",
        filters=filters,
        scores=scores_,
        load_aware=LoadAwareArgs(mode=mode, predict=predict),
    )
    return Framework(profile), LoadPredictor(predict)


def nodes(count: int = 3) -> list[NodeBuilder]:
    return [make_node(f"n{i}", cpu="4", memory="16Gi") for i in range(count)]


def report(
    p: LoadPredictor, node: str, cpu_fraction: float, *, age: float = 5.0, **psi: float
) -> None:
    outcome = p.observe(
        node,
        NOW - age,
        cpu_fraction * CAP_CPU,
        0.25 * CAP_MEM,
        CAP_CPU,
        CAP_MEM,
        psi=PsiSample(**psi),
    )
    assert outcome.name == "ACCEPTED"


def test_scores_prefer_the_measured_cooler_node() -> None:
    fw, p = framework()
    for name, load in (("n0", 0.9), ("n1", 0.2), ("n2", 0.5)):
        report(p, name, load)
    snap = cluster(nodes())
    decision = fw.schedule(snap, make_pod("p", cpu="500m").build(), load=LoadView(p, NOW))
    got = scores(decision, LOAD_AWARE)
    assert got["n1"] > got["n2"] > got["n0"]
    assert decision.selected == "n1"


def test_placements_count_until_reports_show_them() -> None:
    """Two equally idle nodes: after a big pod is noted on n0, the next pod goes to n1."""
    fw, p = framework(settle_delay_s=30.0)
    report(p, "n0", 0.1)
    report(p, "n1", 0.1)
    snap = cluster(nodes(2))
    p.note_placement("n0", "default/big", 2000, 0, now=NOW)
    decision = fw.schedule(snap, make_pod("p", cpu="100m").build(), load=LoadView(p, NOW))
    assert decision.selected == "n1"
    got = scores(decision, LOAD_AWARE)
    assert got["n1"] - got["n0"] >= 20


def test_no_fresh_report_skips_the_score() -> None:
    """Only stale or unknown nodes: the plugin does not second-guess requests."""
    fw, p = framework(stale_after_s=45.0)
    report(p, "n0", 0.9, age=100.0)  # stale
    decision = fw.schedule(cluster(nodes(2)), make_pod("p").build(), load=LoadView(p, NOW))
    assert LOAD_AWARE in decision.explanation.skipped_scores


def test_cluster_without_agents_never_computes_a_batch() -> None:
    """No report at all (or none within staleness): score and preference are skipped
    without predicting every node, the cost a cluster without agents paid per cycle."""

    class Counting(LoadPredictor):
        calls = 0

        def predict(self, *args: object, **kwargs: object) -> PredictionBatch:
            Counting.calls += 1
            return super().predict(*args, **kwargs)  # type: ignore[arg-type]

    predict = PredictConfig(stale_after_s=45.0)
    fw = Framework(dataclasses.replace(DEFAULT_PROFILE, load_aware=LoadAwareArgs(predict=predict)))
    p = Counting(predict)
    p.note_placement("n0", "default/q", 500, 0, now=NOW)
    decision = fw.schedule(cluster(nodes(2)), make_pod("p").build(), load=LoadView(p, NOW))
    assert decision.selected is not None
    assert LOAD_AWARE in decision.explanation.skipped_scores
    assert Counting.calls == 0
    report(p, "n1", 0.9, age=100.0)  # stale: still nothing to measure
    fw.schedule(cluster(nodes(2)), make_pod("p").build(), load=LoadView(p, NOW))
    assert Counting.calls == 0
    report(p, "n1", 0.9)  # fresh: now the batch is needed
    decision = fw.schedule(cluster(nodes(2)), make_pod("p").build(), load=LoadView(p, NOW))
    assert Counting.calls == 1
    assert decision.selected == "n0"


def test_no_load_view_is_a_no_op() -> None:
    fw, _ = framework(cpu_threshold=0.5)
    decision = fw.schedule(cluster(nodes(2)), make_pod("p").build())
    assert LOAD_AWARE in decision.explanation.skipped_scores
    assert LOAD_AWARE in decision.explanation.skipped_filters


def test_stale_node_falls_back_to_requests_not_idle() -> None:
    """A silent node counts its requests: 3.5 of 4 CPUs requested exceeds an 80% threshold."""
    fw, p = framework(cpu_threshold=0.8, stale_after_s=45.0)
    report(p, "n0", 0.05, age=600.0)
    report(p, "n1", 0.3)
    busy = make_pod("busy", cpu="3500m")
    snap = cluster(nodes(2), pods=[(busy, "n0")])
    decision = fw.schedule(snap, make_pod("p", cpu="100m").build(), load=LoadView(p, NOW))
    assert decision.selected == "n1"
    assert reasons(decision)["n0"] == ("node(s) would exceed the CPU load threshold (80%)",)


@pytest.mark.parametrize(
    ("config", "psi", "reason"),
    [
        pytest.param(
            {"cpu_threshold": 0.8},
            {},
            "node(s) would exceed the CPU load threshold (80%)",
            id="cpu",
        ),
        pytest.param(
            {"cpu_pressure_threshold": 20.0},
            {"cpu_some": 35.0},
            "node(s) had CPU pressure",
            id="cpu-psi",
        ),
        pytest.param(
            {"memory_pressure_threshold": 10.0},
            {"memory_some": 12.0},
            "node(s) had memory pressure",
            id="memory-psi",
        ),
    ],
)
def test_filter_rejects_hot_nodes_with_a_reason(
    config: dict[str, float], psi: dict[str, float], reason: str
) -> None:
    fw, p = framework(**config)  # type: ignore[arg-type]
    report(p, "n0", 0.79, **psi)  # + the pod's 100m: 0.815 > 0.8
    report(p, "n1", 0.2)
    decision = fw.schedule(
        cluster(nodes(2)), make_pod("p", cpu="100m").build(), load=LoadView(p, NOW)
    )
    assert decision.selected == "n1"
    assert reasons(decision) == {"n0": (reason,), "n1": ()}


def test_every_node_hot_leaves_the_pod_unschedulable() -> None:
    fw, p = framework(cpu_threshold=0.8)
    report(p, "n0", 0.95)
    report(p, "n1", 0.85)
    decision = fw.schedule(cluster(nodes(2)), make_pod("p").build(), load=LoadView(p, NOW))
    assert decision.selected is None
    assert "2 node(s) would exceed the CPU load threshold (80%)" in decision.summary


def test_thresholds_off_by_default() -> None:
    assert DEFAULT_PROFILE.load_aware.predict.cpu_threshold is None
    fw, p = framework()
    report(p, "n0", 0.99)
    decision = fw.schedule(cluster(nodes(1)), make_pod("p").build(), load=LoadView(p, NOW))
    assert decision.selected == "n0"
    assert LOAD_AWARE in decision.explanation.skipped_filters


def test_target_packing_fills_towards_the_target() -> None:
    fw, p = framework(mode=LoadScoreMode.TARGET_PACKING, cpu_target=0.5, memory_weight=0)
    for name, load in (("n0", 0.1), ("n1", 0.4), ("n2", 0.8)):
        report(p, name, load)
    decision = fw.schedule(
        cluster(nodes()), make_pod("p", cpu="100m").build(), load=LoadView(p, NOW)
    )
    got = scores(decision, LOAD_AWARE)
    assert got["n1"] > got["n0"] > got["n2"]
    assert decision.selected == "n1"


def test_load_outweighs_requests_in_the_default_profile() -> None:
    """The trap of diluted scores: n0 has fewer requests but runs hot from foreign load."""
    profile = dataclasses.replace(DEFAULT_PROFILE, name="default-load")
    fw = Framework(profile)
    p = LoadPredictor(profile.load_aware.predict)
    report(p, "n0", 0.85)
    report(p, "n1", 0.4)
    snap = cluster(nodes(2), pods=[(make_pod("mine", cpu="1500m"), "n1")])
    decision = fw.schedule(snap, make_pod("p", cpu="200m").build(), load=LoadView(p, NOW))
    assert decision.selected == "n1"
    assert scores(decision, NODE_RESOURCES_FIT)["n0"] > scores(decision, NODE_RESOURCES_FIT)["n1"]


def test_hot_node_is_passed_over_whatever_the_other_scores_say() -> None:
    """The trap of diluted scores when the cool nodes fill up: by requests n0 looks empty and
    NodeResourcesFit + BalancedAllocation outvote LoadAware's weight. The preference ranks
    n0 (88 % + the pod > 80 %) after n1 (70 % + the pod)."""
    plain = dataclasses.replace(
        DEFAULT_PROFILE,
        name="no-preference",
        load_aware=LoadAwareArgs(
            predict=PredictConfig(cpu_prefer_below=None, memory_prefer_below=None)
        ),
    )
    results = {}
    for profile in (plain, DEFAULT_PROFILE):
        p = LoadPredictor(profile.load_aware.predict)
        report(p, "n0", 0.88)
        report(p, "n1", 0.70)
        # n0: hot from foreign load, empty by requests; n1: warm with 3 CPUs of our requests
        snap = cluster(nodes(2), pods=[(make_pod("mine", cpu="3000m"), "n1")])
        pod = make_pod("p", cpu="200m").build()
        results[profile.name] = Framework(profile).schedule(snap, pod, load=LoadView(p, NOW))
    without, with_ = results["no-preference"], results[DEFAULT_PROFILE.name]
    assert without.selected == "n0"  # the scores alone pick the hot node
    totals = {n: without.explanation.node(n).total or 0 for n in ("n0", "n1")}
    assert totals["n0"] > totals["n1"]
    assert with_.selected == "n1"
    assert with_.explanation.node("n0").total == without.explanation.node("n0").total
    assert with_.explanation.node("n0").passed_over == (
        f"{LOAD_AWARE}: predicted CPU above 80% while cooler nodes fit",
    )
    body = with_.to_json()
    assert body["preferences"] == [{"plugin": LOAD_AWARE, "applied": True, "passed_over": ["n0"]}]
    assert body["nodes"]["n1"]["passed_over"] == []


def test_preference_never_leaves_a_pod_without_a_node() -> None:
    """Every feasible node above the preferred level: the scores decide, nothing is rejected."""
    fw, p = framework(cpu_prefer_below=0.8)
    report(p, "n0", 0.95)
    report(p, "n1", 0.85)
    decision = fw.schedule(cluster(nodes(2)), make_pod("p").build(), load=LoadView(p, NOW))
    assert decision.selected == "n1"
    (record,) = decision.explanation.preferences
    assert not record.applied
    assert decision.explanation.node("n0").passed_over == ()


def test_preference_for_memory_and_off_switch() -> None:
    fw, p = framework(cpu_prefer_below=None, memory_prefer_below=0.5, memory_weight=0)
    for name, cpu in (("n0", 0.1), ("n1", 0.6)):
        report(p, name, cpu)
    p.note_placement("n0", "default/fat", 0, 8 * GIB, now=NOW)  # n0: 25 % + 50 % in flight
    decision = fw.schedule(cluster(nodes(2)), make_pod("p").build(), load=LoadView(p, NOW))
    assert decision.selected == "n1"
    assert decision.explanation.node("n0").passed_over == (
        f"{LOAD_AWARE}: predicted memory above 50% while cooler nodes fit",
    )
    fw, p = framework(cpu_prefer_below=None, memory_prefer_below=None)
    report(p, "n0", 0.99)
    report(p, "n1", 0.98)
    decision = fw.schedule(cluster(nodes(2)), make_pod("p").build(), load=LoadView(p, NOW))
    assert decision.explanation.preferences == ()


def test_preference_waits_for_a_fresh_report() -> None:
    """Without measurements the preference would judge by requests what NodeResourcesFit
    already scores: like the score, it stays out of the way."""
    fw, p = framework(cpu_prefer_below=0.5, stale_after_s=45.0)
    report(p, "n0", 0.05, age=600.0)
    snap = cluster(nodes(2), pods=[(make_pod("busy", cpu="3500m"), "n0")])
    decision = fw.schedule(snap, make_pod("p").build(), load=LoadView(p, NOW))
    assert decision.explanation.preferences == ()
