"""Single GPU pods keep whole racks whole where an equal choice exists (#37): among nodes
tied for the best total, those that break no whole domain win; scores never change."""

from __future__ import annotations

import dataclasses

import numpy as np

from scheduler.control.scheduler import Scheduler
from scheduler.control.settings import parse_spec
from scheduler.core.profile import DEFAULT_PROFILE
from scheduler.core.schedule import Framework
from scheduler.core.snapshot import Snapshot
from scheduler.core.whole_domains import keep_whole, whole_domains_broken
from scheduler.model.pod import Pod
from scheduler.model.topology import GPU_RESOURCE
from scheduler.obs.metrics import Metrics
from tests.builders import NodeBuilder, cluster, make_node, make_pod

BLOCK, RACK = "example.com/block", "example.com/rack"
LEVELS: tuple[str, ...] = (BLOCK, RACK, "kubernetes.io/hostname")
WITH_LEVELS = Framework(dataclasses.replace(DEFAULT_PROFILE, domain_levels=LEVELS))
WITHOUT = Framework(DEFAULT_PROFILE)


def gpu_node(name: str, rack: str, block: str = "b0") -> NodeBuilder:
    return (
        make_node(name, cpu="64", memory="256Gi")
        .resource(GPU_RESOURCE, 8)
        .label(RACK, rack)
        .label(BLOCK, block)
        .label("kubernetes.io/hostname", name)
    )


def racks() -> Snapshot:
    """Rack r0: n0 full (8 GPUs used), n1 free; rack r1: n2 and n3 free. Block b0 holds
    both racks; block b1 (rack r2: n4) is free."""
    nodes = [
        gpu_node("n0", "r0"),
        gpu_node("n1", "r0"),
        gpu_node("n2", "r1"),
        gpu_node("n3", "r1"),
        gpu_node("n4", "r2", "b1"),
    ]
    full = make_pod("full", cpu="1", resources={GPU_RESOURCE: "8"})
    return cluster(nodes, [(full, "n0")])


def one_gpu(name: str = "p") -> Pod:
    return make_pod(name, cpu="1", resources={GPU_RESOURCE: "1"}).uid(f"u-{name}").build()


def test_the_domains_a_node_would_break() -> None:
    snapshot = racks()
    rows = np.arange(snapshot.num_nodes)
    broken = whole_domains_broken(snapshot, LEVELS, [GPU_RESOURCE], rows)
    # n1: r0 in use, b0 in use -> 0; n2, n3: r1 whole, b0 not -> 1; n4: r2 and b1 whole -> 2
    assert broken.tolist() == [0, 0, 1, 1, 2]
    assert whole_domains_broken(snapshot, (), [GPU_RESOURCE], rows).tolist() == [0] * 5
    assert keep_whole(snapshot, LEVELS, [GPU_RESOURCE], np.array([1, 2, 4])).tolist() == [1]
    assert keep_whole(snapshot, LEVELS, [GPU_RESOURCE], np.array([2, 3])).tolist() == [2, 3]


def test_a_gpu_pod_takes_the_rack_in_use_of_equal_choices_for_every_seed() -> None:
    """n1, n2, n3 and n4 are free, identical nodes: equal totals. With levels, every seed
    takes n1 (its rack is in use); without, kube's seeded tie-break spreads the pods."""
    snapshot = racks()
    pod = one_gpu()
    picked = {WITH_LEVELS.schedule(snapshot, pod, seed=s).selected for s in range(12)}
    assert picked == {"n1"}
    blind = {WITHOUT.schedule(snapshot, pod, seed=s).selected for s in range(12)}
    assert len(blind) > 1
    decision = WITH_LEVELS.schedule(snapshot, pod, seed=3)
    totals = decision.explanation.totals
    assert np.array_equal(totals, WITHOUT.schedule(snapshot, pod, seed=3).explanation.totals)


def test_a_better_score_is_never_passed_over_and_cpu_pods_are_untouched() -> None:
    """A node that scores better wins whatever it breaks: n1, tainted PreferNoSchedule,
    scores lower, so a whole rack's node is taken. A pod asking for no GPU ties as before."""
    nodes = [
        gpu_node("n0", "r0"),
        gpu_node("n1", "r0").taint("dedicated", "x", "PreferNoSchedule"),
        gpu_node("n2", "r1"),
        gpu_node("n3", "r1"),
    ]
    full = make_pod("full", cpu="1", resources={GPU_RESOURCE: "8"})
    snapshot = cluster(nodes, [(full, "n0")])
    pod = one_gpu()
    decision = WITH_LEVELS.schedule(snapshot, pod, seed=0)
    totals = decision.explanation.totals
    assert decision.selected in ("n2", "n3")
    assert totals[snapshot.index_of("n1")] < totals[snapshot.index_of(decision.selected)]
    cpu_only = make_pod("c", cpu="1").uid("u-c").build()
    plain = racks()
    assert {WITH_LEVELS.schedule(plain, cpu_only, seed=s).selected for s in range(12)} == {
        WITHOUT.schedule(plain, cpu_only, seed=s).selected for s in range(12)
    }


def test_the_scheduler_runs_its_framework_with_the_levels_in_force() -> None:
    """``spec.topology.levels`` reach the framework, and a change of them alone (the
    profile unchanged) rebuilds it."""
    spec = {"topology": {"levels": list(LEVELS)}}
    sched = Scheduler(parse_spec(spec, "lattice"), writer=None, metrics=Metrics.create())
    assert sched.framework.profile.domain_levels == LEVELS
    sched.apply_settings(parse_spec({"topology": {"levels": [RACK]}}, "lattice"))
    assert list(sched.framework.profile.domain_levels) == [RACK]
    sched.apply_settings(parse_spec({}, "lattice"))
    assert not sched.framework.profile.domain_levels
