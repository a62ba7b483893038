"""GPUPlacement and the GPU request mix: big jobs stay placeable, CPU-only pods keep
kube-scheduler's choice unless they would strand GPUs."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core.framework import Cycle
from scheduler.core.gpus import (
    PRIOR_SIZES,
    Free,
    GpuDemand,
    SizeClass,
    figures,
    fragmentation,
    stranded,
)
from scheduler.core.plugins.gpu_placement import GpuPlacement
from scheduler.core.profile import (
    DEFAULT_PROFILE,
    GPU_PLACEMENT,
    NODE_AFFINITY,
    TAINT_TOLERATION,
    GpuPlacementArgs,
    GpuPolicy,
    kube_profile,
)
from scheduler.core.schedule import Framework
from scheduler.core.topology.state import TopologyState
from scheduler.model.pod import Pod
from tests.builders import NodeBuilder, cluster, expr, make_node, make_pod

GPU = "nvidia.com/gpu"


def gpu_node(name: str, gpus: int, cpu: str = "96", memory: str = "512Gi") -> NodeBuilder:
    return make_node(name, cpu=cpu, memory=memory).allocatable(**{GPU: gpus})


def gpu_pod(name: str, gpus: int, cpu: str = "4", memory: str = "16Gi") -> Pod:
    return make_pod(name, cpu=cpu, memory=memory, resources={GPU: str(gpus)}).build()


def replay(framework: Framework, nodes: list[NodeBuilder], pods: list[Pod]) -> list[str | None]:
    """Place ``pods`` one after another as the controller would (arrival observed first)."""
    snapshot, state = cluster(nodes), TopologyState()
    out: list[str | None] = []
    for i, pod in enumerate(pods):
        state.gpu_demand.set_pending(pod.name, pod)
        decision = framework.schedule(snapshot, pod, seed=i, topology=state)
        state.gpu_demand.set_pending(pod.name, None)
        out.append(decision.selected)
        if decision.selected is not None:
            snapshot.add_pod(pod, decision.selected)
    return out


def test_one_gpu_pods_fill_partly_used_nodes_and_the_8_gpu_job_fits() -> None:
    """kube's LeastAllocated spreads the 1-GPU pods over both 8-GPU nodes, so the 8-GPU job
    finds no whole node; Lattice keeps one whole (and uses the 2-GPU node first)."""
    nodes = [gpu_node("big0", 8), gpu_node("big1", 8), gpu_node("small", 2, cpu="32")]
    pods = [gpu_pod(f"p{i}", 1) for i in range(4)] + [gpu_pod("job", 8), gpu_pod("two", 2)]
    lattice = replay(Framework(DEFAULT_PROFILE), nodes, pods)
    kube = replay(Framework(kube_profile()), nodes, pods)
    assert lattice[:2] == ["small", "small"]
    assert len(set(lattice[2:4])) == 1  # the next two share one big node
    assert lattice[4] is not None
    assert lattice[4] != lattice[2]
    assert None not in lattice
    assert kube[4] is None  # the peer strands the job: this is the defect being fixed


def test_best_fit_by_count_prefers_the_node_the_pod_fills() -> None:
    nodes = [gpu_node("whole", 8), gpu_node("three-left", 8)]
    placed = [(gpu_pod(f"u{i}", 1), "three-left") for i in range(5)]
    snapshot = cluster(nodes, placed)
    decision = Framework(DEFAULT_PROFILE).schedule(snapshot, gpu_pod("p", 2))
    assert decision.selected == "three-left"
    explanation = decision.explanation
    assert explanation.node("three-left").scores[GPU_PLACEMENT] == 100
    assert explanation.node("whole").scores[GPU_PLACEMENT] == 50  # the next rank: half


def test_cpu_only_pod_does_not_strand_free_gpus() -> None:
    """The GPU node has the most free cpu (LeastAllocated picks it), but taking 60 of its
    cores would leave its 8 GPUs without the cpu that GPU pods bring."""
    nodes = [gpu_node("gpu", 8, cpu="96"), make_node("cpu", cpu="64", memory="512Gi")]
    state = TopologyState()
    for i in range(20):
        state.gpu_demand.observe(gpu_pod(f"seen{i}", 8, cpu="64"))
    pod = make_pod("batch", cpu="60", memory="8Gi").build()
    lattice = Framework(DEFAULT_PROFILE).schedule(cluster(nodes), pod, topology=state)
    kube = Framework(kube_profile()).schedule(cluster(nodes), pod, topology=state)
    assert kube.selected == "gpu"
    assert lattice.selected == "cpu"


def test_cpu_only_pods_keep_kube_scoring_where_no_gpu_is_at_stake() -> None:
    """No free GPU on any feasible node: the plugin skips, the choice is kube's."""
    plain = [make_node(f"n{i}", cpu=str(2 + i), memory="8Gi") for i in range(4)]
    full = gpu_node("g", 1, cpu="512", memory="4Ti")
    taken = [(gpu_pod("holder", 1, cpu="1"), "g")]
    pod = make_pod("web", cpu="1", memory="1Gi").build()
    for nodes, placed in ((plain, []), ([*plain, full], taken)):
        lattice = Framework(DEFAULT_PROFILE).schedule(cluster(nodes, placed), pod, seed=3)
        kube = Framework(kube_profile()).schedule(cluster(nodes, placed), pod, seed=3)
        assert GPU_PLACEMENT in lattice.explanation.skipped_scores
        assert lattice.selected == kube.selected
        assert np.array_equal(lattice.explanation.totals, kube.explanation.totals)


def test_cpu_only_pods_stay_off_free_gpus_and_spread_as_kube_among_the_rest() -> None:
    """A roomy GPU node with free GPUs is kube's favourite (most free cpu); Lattice keeps
    the pod off it, and among the nodes without free GPUs picks what kube would."""
    plain = [make_node(f"n{i}", cpu=str(2 + i), memory="8Gi") for i in range(4)]
    roomy = gpu_node("g", 8, cpu="512", memory="4Ti")
    pod = make_pod("web", cpu="1", memory="1Gi").build()
    kube = Framework(kube_profile())
    lattice = Framework(DEFAULT_PROFILE).schedule(cluster([*plain, roomy]), pod, seed=3)
    assert kube.schedule(cluster([*plain, roomy]), pod, seed=3).selected == "g"
    assert lattice.selected == kube.schedule(cluster(plain), pod, seed=3).selected
    assert lattice.explanation.node("g").scores[GPU_PLACEMENT] == 50


def _with_gpu_weight(weight: int) -> Framework:
    scores = tuple((n, weight if n == GPU_PLACEMENT else w) for n, w in DEFAULT_PROFILE.scores)
    return Framework(dataclasses.replace(DEFAULT_PROFILE, scores=scores))


def test_a_preferred_node_affinity_alone_does_not_outvote_the_best_gpu_node() -> None:
    """What weight 5 on a halving rank does: the best GPU node leads the next by 250
    points, a preferred node affinity at its full weight gives 200, so the pod goes where
    GPUPlacement ranks first (here with LeastAllocated's 17 points on the preferred side
    too). At weight 3 the lead is 150 and the preference wins; a PreferNoSchedule taint
    (weight 3: 300) outvotes the lead at weight 5."""
    nodes = [gpu_node("whole", 8), gpu_node("three-left", 8)]
    placed = [(gpu_pod(f"u{i}", 1), "three-left") for i in range(5)]
    prefers_whole = (
        make_pod("p", cpu="4", memory="16Gi", resources={GPU: "2"})
        .preferred_node_affinity(100, expr("kubernetes.io/hostname", "In", "whole"))
        .build()
    )
    decision = Framework(DEFAULT_PROFILE).schedule(cluster(nodes, placed), prefers_whole)
    best, preferred = decision.explanation.node("three-left"), decision.explanation.node("whole")
    assert (best.scores[GPU_PLACEMENT], preferred.scores[GPU_PLACEMENT]) == (100, 50)
    assert (best.scores[NODE_AFFINITY], preferred.scores[NODE_AFFINITY]) == (0, 100)
    assert decision.selected == "three-left"
    weights = dict(DEFAULT_PROFILE.scores)
    assert 50 * weights[GPU_PLACEMENT] > 100 * weights[NODE_AFFINITY]

    assert _with_gpu_weight(3).schedule(cluster(nodes, placed), prefers_whole).selected == ("whole")

    tainted = [gpu_node("whole", 8), gpu_node("three-left", 8).taint("x", "", "PreferNoSchedule")]
    plain = gpu_pod("p", 2)
    by_taint = Framework(DEFAULT_PROFILE).schedule(cluster(tainted, placed), plain)
    assert by_taint.explanation.node("three-left").scores[GPU_PLACEMENT] == 100
    assert by_taint.explanation.node("three-left").scores[TAINT_TOLERATION] == 0
    assert by_taint.selected == "whole"


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        (GpuPolicy.MOST_ALLOCATED, "three-left"),
        (GpuPolicy.LEAST_ALLOCATED, "whole"),
        (GpuPolicy.FRAGMENTATION, "three-left"),
    ],
)
def test_policies(policy: GpuPolicy, expected: str) -> None:
    profile = dataclasses.replace(DEFAULT_PROFILE, gpu_placement=GpuPlacementArgs(policy=policy))
    nodes = [gpu_node("whole", 8), gpu_node("three-left", 8)]
    placed = [(gpu_pod(f"u{i}", 1), "three-left") for i in range(5)]
    decision = Framework(profile).schedule(cluster(nodes, placed), gpu_pod("p", 1))
    assert decision.selected == expected


def test_listed_resources_are_the_gpus() -> None:
    """amd.com/gpu by default; another resource only when the profile lists it."""
    nodes = [
        make_node("whole", cpu="96", memory="512Gi").allocatable(**{"example.com/xpu": 4}),
        make_node("one-left", cpu="96", memory="512Gi").allocatable(**{"example.com/xpu": 4}),
    ]
    placed = [
        (make_pod(f"u{i}", cpu="1", resources={"example.com/xpu": "1"}).build(), "one-left")
        for i in range(3)
    ]
    pod = make_pod("p", cpu="1", resources={"example.com/xpu": "1"}).build()
    unlisted = Framework(DEFAULT_PROFILE).schedule(cluster(nodes, placed), pod)
    assert GPU_PLACEMENT in unlisted.explanation.skipped_scores
    args = GpuPlacementArgs(resources=("example.com/xpu",))
    listed_profile = dataclasses.replace(DEFAULT_PROFILE, gpu_placement=args)
    state = TopologyState()
    state.gpu_demand.set_resources(args.resources)
    listed = Framework(listed_profile).schedule(cluster(nodes, placed), pod, topology=state)
    assert listed.selected == "one-left"


def test_demand_learns_the_mix_from_arrivals_and_pending_pods() -> None:
    demand = GpuDemand()
    assert {c.gpus for c in demand.classes()} == set(PRIOR_SIZES)
    for i in range(500):
        demand.observe(gpu_pod(f"a{i}", 1, cpu="6"))
    mix = {c.gpus: c for c in demand.classes()}
    assert mix[1].share > 0.95
    assert mix[1].cpu_milli == 6000
    assert sum(c.share for c in mix.values()) == pytest.approx(1.0)
    demand.observe(make_pod("cpu-only", cpu="1").build())
    assert demand.arrivals == 500  # pods without GPUs are not GPU demand
    demand.set_pending("ns/job", gpu_pod("job", 8, cpu="64"))
    pending = {c.gpus: c for c in demand.classes()}
    assert pending[8].share >= 0.5
    assert pending[8].cpu_milli == 64000
    assert demand.arrivals == 501  # a new pending key is an arrival
    demand.set_pending("ns/job", gpu_pod("job", 8, cpu="64"))
    assert demand.arrivals == 501  # the same pending pod again is not
    demand.set_pending("ns/job", None)
    assert {c.gpus: c for c in demand.classes()}[8].share < 0.1


def test_observe_placed_learns_bound_pods_in_creation_order() -> None:
    """The rebuilt mix does not depend on the order the list gave the pods: the cpu a size
    typically asks moves towards the later pods (EWMA), so order matters."""
    early, late = gpu_pod("early", 1, cpu="1"), gpu_pod("late", 1, cpu="9")
    in_order = GpuDemand()
    in_order.observe(early)
    in_order.observe(late)
    rebuilt = GpuDemand()
    count = rebuilt.observe_placed(
        [
            ("2026-01-02T00:00:00Z", late),
            ("2026-01-01T00:00:00Z", early),
            ("2026-01-01T00:00:00Z", make_pod("cpu-only", cpu="1").build()),
        ]
    )
    assert count == 2  # GPU pods only
    assert rebuilt.classes() == in_order.classes()
    typical = [c for c in rebuilt.classes() if c.gpus == 1 and c.cpu_milli < 9000]
    assert [c.cpu_milli for c in typical] == [1400]  # 1 + 0.05 * (9 - 1) cores


def test_the_pod_being_placed_is_left_out_under_the_controllers_key() -> None:
    """The controller keys pending pods by namespace/name, the cache (and the simulator) by
    uid: the plugin finds the pod under either, so live too it is not its own competition
    (looked up by uid only, a live 8-GPU pod counted itself as half the mix)."""
    pod = make_pod("job", cpu="64", memory="16Gi", resources={GPU: "8"}).uid("u-job").build()
    assert pod.key == "u-job"
    snapshot = cluster([gpu_node("a", 8), gpu_node("b", 8)])
    args = GpuPlacementArgs()

    def eights(classes: tuple[SizeClass, ...]) -> float:
        return sum(c.share for c in classes if c.gpus == 8)

    for key in ("default/job", "u-job"):
        state = TopologyState()
        for i in range(50):
            state.gpu_demand.observe(gpu_pod(f"s{i}", 1))
        state.gpu_demand.set_pending(key, pod)
        with_itself, without = state.gpu_demand.classes(), state.gpu_demand.classes(pod)
        assert eights(with_itself) >= 0.5  # the pending half of the mix is this pod
        assert eights(without) < 0.2
        fig = GpuPlacement(args).figures(Cycle(snapshot, pod, topology=state))
        assert fig.classes == figures(snapshot, pod, args.resources, without).classes
        assert fig.classes != figures(snapshot, pod, args.resources, with_itself).classes


def test_fragmentation_and_stranded_by_hand() -> None:
    free = Free(
        gpus=np.array([8, 3, 1, 4]),
        cpu=np.array([96_000, 96_000, 96_000, 1_000]),
        memory=np.array([1 << 40] * 4),
        capacity=np.array([8, 8, 8, 8]),
    )
    mix = (SizeClass(1, 0.5, 2000, 0), SizeClass(4, 0.25, 8000, 0), SizeClass(8, 0.25, 0, 0))
    frag = fragmentation(free, mix)
    # 8 free: nothing lost; 3 free: useless to 4s and 8s; 1: same; 4 free without cpu: all.
    assert frag.tolist() == pytest.approx([0.0, 1.5, 0.5, 4.0])
    assert stranded(free, mix).tolist() == [0, 0, 0, 4]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.sampled_from([0, 1, 2, 4, 8]), min_size=1, max_size=30),
    st.integers(0, 2**16),
)
def test_lattice_never_places_fewer_gpu_pods_than_it_can_fit(sizes: list[int], seed: int) -> None:
    """Whatever the arrivals, every pod Lattice places fits (the plugin only scores) and a
    pod that some feasible node holds is never refused."""
    nodes = [gpu_node("a", 8), gpu_node("b", 4, cpu="48"), make_node("c", cpu="16")]
    pods = [
        gpu_pod(f"p{i}", g) if g else make_pod(f"p{i}", cpu="2").build()
        for i, g in enumerate(sizes)
    ]
    lattice = Framework(DEFAULT_PROFILE)
    kube_filters_only = Framework(
        dataclasses.replace(kube_profile(), scores=()),
    )
    snapshot, state = cluster(nodes), TopologyState()
    for i, pod in enumerate(pods):
        state.gpu_demand.observe(pod)
        decision = lattice.schedule(snapshot, pod, seed=seed + i, topology=state)
        check = kube_filters_only.schedule(snapshot, pod, seed=seed + i)
        assert (decision.selected is None) == (check.selected is None)
        if decision.selected is not None:
            assert decision.selected in check.feasible
            snapshot.add_pod(pod, decision.selected)


def test_no_gpu_node_costs_no_figures(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a cluster without feasible GPU nodes the plugin stays out before computing the
    figures (most of a plain pod's cycle otherwise), and still scores GPU nodes."""
    import scheduler.core.plugins.gpu_placement as plugin

    def refuse(*args: object) -> None:
        raise AssertionError("figures computed without a feasible GPU node")

    framework = Framework(DEFAULT_PROFILE)
    monkeypatch.setattr(plugin, "figures", refuse)
    plain = make_pod("p", cpu="1", memory="1Gi").build()
    nodes = [make_node("a", cpu="8", memory="32Gi"), make_node("b", cpu="8", memory="32Gi")]
    assert framework.schedule(cluster(nodes), plain).selected in {"a", "b"}
    with pytest.raises(AssertionError, match="figures computed"):
        framework.schedule(cluster([*nodes, gpu_node("g", 8)]), plain)
