"""Property tests: the evaluator equals the naive oracle, on its integer path (pods that only
resources constrain) and on its simulation path alike, and the snapshot it simulates on
comes back unchanged. The examples that end in a preemption are counted: a share of them
must, or the property says little about preemption."""

from __future__ import annotations

from collections import Counter
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from lattice_dev.core.oracle import preemption as oracle
from scheduler.core.preemption import Inputs, Preemption, preempt
from scheduler.core.schedule import Framework
from scheduler.core.snapshot import Snapshot
from scheduler.model.pdb import PodDisruptionBudget
from scheduler.model.pod import Pod
from scheduler.model.pod_facts import PodFacts
from tests.builders import cluster, make_namespace, make_node, make_pod
from tests.core.test_snapshot import view

FRAMEWORK = Framework()
APPS = ("web", "db", "batch")
HOST = "kubernetes.io/hostname"
ZONE = "zone"


@st.composite
def scenarios(draw: Any) -> tuple[Snapshot, Pod, Inputs]:
    num_nodes = draw(st.integers(1, 4))
    nodes = []
    for i in range(num_nodes):
        node_builder = make_node(
            f"n{i}",
            cpu=str(draw(st.integers(1, 4))),
            memory=f"{draw(st.integers(1, 4))}Gi",
            pods=draw(st.integers(1, 5)),
        ).label(ZONE, draw(st.sampled_from(["a", "b"])))
        if draw(st.integers(0, 5)) == 0:
            node_builder.taint("k", "v")
        nodes.append(node_builder)
    placed: list[tuple[Pod, str]] = []
    facts: dict[str, PodFacts] = {}
    for j in range(draw(st.integers(2, 14))):
        builder = (
            make_pod(
                f"e{j}",
                cpu=f"{draw(st.sampled_from([100, 250, 500, 1000, 2000]))}m",
                memory=f"{draw(st.sampled_from([0, 256, 1024]))}Mi",
                namespace=draw(st.sampled_from(["default", "default", "other"])),
            )
            .uid(f"e{j}")
            .priority(draw(st.integers(-3, 9)))
            .label("app", draw(st.sampled_from(APPS)))
        )
        if draw(st.integers(0, 5)) == 0:
            builder.pod_anti_affinity(draw(st.sampled_from([HOST, ZONE])), {"app": "web"})
        if draw(st.integers(0, 6)) == 0:
            builder.host_port(8080)
        pod = builder.build()
        placed.append((pod, f"n{draw(st.integers(0, num_nodes - 1))}"))
        if draw(st.booleans()):
            facts[pod.key] = PodFacts(start_time=float(draw(st.integers(0, 5))))
    incoming = (
        make_pod(
            "p",
            cpu=f"{draw(st.sampled_from([500, 1000, 2000, 3000]))}m",
            memory=f"{draw(st.sampled_from([0, 512, 2048]))}Mi",
        )
        .uid("p")
        .priority(draw(st.integers(4, 10)))
        .label("app", draw(st.sampled_from(APPS)))
    )
    roll = draw(st.integers(0, 9))
    if roll in (0, 4):
        incoming.pod_anti_affinity(draw(st.sampled_from([HOST, ZONE])), {"app": "db"})
    elif roll == 1:
        incoming.pod_affinity(ZONE, {"app": "batch"})
    elif roll == 2:
        incoming.spread(1, draw(st.sampled_from([HOST, ZONE])), {"app": "web"})
    elif roll == 3:
        incoming.host_port(8080)
    pdbs = [
        PodDisruptionBudget.from_api(
            {
                "metadata": {
                    "name": f"b{k}",
                    "namespace": draw(st.sampled_from(["default", "other"])),
                },
                "spec": {"selector": {"matchLabels": {"app": draw(st.sampled_from(APPS))}}},
                "status": {"disruptionsAllowed": draw(st.integers(0, 2))},
            }
        )
        for k in range(draw(st.integers(0, 3)))
    ]
    nominated = []
    for k in range(draw(st.integers(0, 2))):
        nominated.append(
            (
                make_pod(f"nom{k}", cpu=f"{draw(st.sampled_from([500, 1000]))}m")
                .uid(f"nom{k}")
                .priority(draw(st.integers(0, 12)))
                .build(),
                f"n{draw(st.integers(0, num_nodes - 1))}",
            )
        )
    namespaces = [make_namespace("default"), make_namespace("other")]
    snapshot = cluster(nodes, placed, namespaces)
    inputs = Inputs(pdbs=pdbs, nominated=nominated, facts=facts, seed=draw(st.integers(0, 3)))
    return snapshot, incoming.build(), inputs


def outcome(p: Preemption | None) -> tuple[str, frozenset[str], int, frozenset[str]] | None:
    if p is None:
        return None
    return (p.node, frozenset(v.key for v in p.victims), p.pdb_violations, frozenset(p.tied))


EXAMPLES = 500
MIN_PREEMPTING = EXAMPLES // 5
"""Examples that must end in a preemption (about 28 % do), so the property is about
preemptions found, not mostly about pods that fit or find nothing."""


def test_evaluator_equals_oracle() -> None:
    """The property over :data:`EXAMPLES` scenarios, counting how they end."""
    outcomes: Counter[str] = Counter()

    @settings(max_examples=EXAMPLES, deadline=None)
    @given(scenarios())
    def check(scenario: tuple[Snapshot, Pod, Inputs]) -> None:
        outcomes[evaluator_equals_oracle(scenario)] += 1

    check()
    assert outcomes["preempted"] >= MIN_PREEMPTING, outcomes


def evaluator_equals_oracle(scenario: tuple[Snapshot, Pod, Inputs]) -> str:
    """Check one scenario; how it ended: "fits" (no preemption needed), "preempted" or
    "none" (no node can be freed)."""
    snapshot, pod, inputs = scenario
    decision = FRAMEWORK.schedule(snapshot, pod)
    if decision.selected is not None:
        return "fits"
    before = view(snapshot)
    order = [[p.key for p in snapshot.pods_on(i)] for i in range(snapshot.num_nodes)]
    probe = (
        make_pod("probe", cpu="100m")
        .label("app", "db")
        .pod_anti_affinity(ZONE, {"app": "web"})
        .spread(1, HOST, {"app": "web"})
        .build()
    )
    probe_before = FRAMEWORK.schedule(snapshot, probe).explanation.to_json()
    fast = preempt(FRAMEWORK, snapshot, decision, inputs)
    assert view(snapshot) == before
    assert [[p.key for p in snapshot.pods_on(i)] for i in range(snapshot.num_nodes)] == order
    assert FRAMEWORK.schedule(snapshot, probe).explanation.to_json() == probe_before
    simulated = preempt(FRAMEWORK, snapshot, decision, inputs, force_simulation=True)
    assert view(snapshot) == before
    slow = oracle.preempt(FRAMEWORK, snapshot, decision, inputs)
    assert outcome(fast) == outcome(slow)
    assert outcome(simulated) == outcome(slow)
    if fast is not None:
        assert slow is not None
        assert [v.key for v in fast.victims] == [v.key for v in slow.victims]
        assert all(v.priority < pod.priority for v in fast.victims)
        # Evicting the victims really makes room.
        for victim in fast.victims:
            snapshot.remove_pod(victim)
        assert FRAMEWORK.schedule(snapshot, pod, restrict_to=frozenset({fast.node})).selected
        return "preempted"
    return "none"
