"""Gangs in a network topology (`scheduler.sim.topology`): the generated cluster, the
stream, the reference rules of kube-scheduler's and Kueue's TAS on hand-checked cases,
and replays checked from the node labels alone."""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict

import numpy as np
import pytest

from scheduler.sim.topology import (
    BLOCK,
    GREEDY,
    HOSTNAME,
    KINDS,
    KUBE_TAS,
    KUEUE,
    LATTICE,
    POLICIES,
    PREFERRED_BLOCK,
    PREFERRED_RACK,
    RACK,
    REQUIRED_RACK,
    SLICES,
    Gang,
    Layout,
    Shape,
    _best_fit_pick,
    fewest_domains,
    kube_tas,
    kueue_best_fit,
    make_gang,
    may_fit,
    replay_policy,
    topology_cluster,
    topology_stream,
)
from scheduler.sim.trace import GPU_RESOURCE


def _layout(shape: Shape) -> Layout:
    return Layout.of(topology_cluster(shape))


def _racks(layout: Layout, plan: list[int]) -> Counter[str]:
    rack = layout.values[1]
    return Counter(rack[int(layout.levels[1][i])] for i in plan)


def test_cluster_shape_and_labels() -> None:
    shape = Shape.parse("2x3x4x8")
    nodes = topology_cluster(shape)
    assert len(nodes) == 2 * 3 * 4
    assert shape.total_gpus == 192
    assert shape.rack_gpus == 32
    assert all(n.allocatable[GPU_RESOURCE] == 8 for n in nodes)
    racks = Counter(n.labels[RACK] for n in nodes)
    assert len(racks) == 6
    assert set(racks.values()) == {4}
    blocks: defaultdict[str, set[str]] = defaultdict(set)
    for n in nodes:
        blocks[n.labels[BLOCK]].add(n.labels[RACK])
        assert n.labels[HOSTNAME] == n.name
    assert {b: len(r) for b, r in blocks.items()} == {"b0": 3, "b1": 3}
    with pytest.raises(ValueError, match="BLOCKSxRACKSxNODESxGPUS"):
        Shape.parse("2x3x4")
    with pytest.raises(ValueError, match=">= 1"):
        Shape.parse("0x1x1x1")


def test_stream_shapes_and_determinism() -> None:
    shape = Shape(4, 8, 4, 8)
    stream = topology_stream(shape, gangs=150, load=1.2, seed=3)
    again = topology_stream(shape, gangs=150, load=1.2, seed=3)
    assert [(g.kind, g.members, g.gpus, g.created, g.run) for g in stream] == [
        (g.kind, g.members, g.gpus, g.created, g.run) for g in again
    ]
    other = topology_stream(shape, gangs=150, load=1.2, seed=4)
    assert [g.members for g in stream] != [g.members for g in other]
    assert set(Counter(g.kind for g in stream)) == set(KINDS)
    assert all(b.created >= a.created for a, b in itertools.pairwise(stream))
    for g in stream:
        assert len(g.pods) == g.members == g.spec.min_member
        assert g.members >= 2
        if g.kind == REQUIRED_RACK:
            assert g.spec.topology_key == RACK
            assert g.total_gpus <= shape.rack_gpus
        if g.kind == SLICES:
            size = g.spec.slice_size
            assert size is not None
            assert g.members % size == 0
            assert g.spec.slice_key == RACK
            assert size * g.gpus <= shape.rack_gpus
            assert g.members // size >= 2
    # Some need a whole rack, some several.
    assert any(g.total_gpus == shape.rack_gpus for g in stream)
    assert any(g.total_gpus >= 2 * shape.rack_gpus for g in stream)
    only = topology_stream(shape, gangs=50, load=1.0, seed=1, mix={PREFERRED_RACK: 1})
    assert {g.kind for g in only} == {PREFERRED_RACK}
    with pytest.raises(ValueError, match="mix"):
        topology_stream(shape, gangs=5, load=1.0, seed=1, mix={"bogus": 1})


def test_kueue_best_fit_last_domain() -> None:
    # KEP-2724's example: domains holding 3, 3, 2, 1 pods, 7 pods -> 3 + 3 + 1.
    assert _best_fit_pick({0: 3, 1: 3, 2: 2, 3: 1}, 7) == {0: 3, 1: 3, 3: 1}
    assert _best_fit_pick({0: 5, 1: 2, 2: 3}, 3) == {2: 3}  # one holds it: the tightest
    assert _best_fit_pick({0: 1, 1: 1}, 3) == {}


# 1 block, 2 racks of 2 nodes: b0-r0-n0, b0-r0-n1, b0-r1-n0, b0-r1-n1.
SMALL = Shape(1, 2, 2, 8)


def test_required_rack_both_rules_take_the_tightest_rack() -> None:
    layout = _layout(SMALL)
    free = np.array([8, 8, 4, 4])
    gang = make_gang("g", REQUIRED_RACK, 2, 4)
    for rule in (kube_tas, kueue_best_fit):
        plan = rule(layout, free, gang)
        assert plan is not None
        assert _racks(layout, plan) == Counter({"b0-r1": 2})
    big = make_gang("big", REQUIRED_RACK, 3, 4)  # 12 GPUs: only rack 0
    for rule in (kube_tas, kueue_best_fit):
        plan = rule(layout, free, big)
        assert plan is not None
        assert _racks(layout, plan) == Counter({"b0-r0": 3})
    assert kube_tas(layout, np.array([8, 0, 4, 4]), make_gang("x", REQUIRED_RACK, 3, 4)) is None
    assert (
        kueue_best_fit(layout, np.array([8, 0, 4, 4]), make_gang("x", REQUIRED_RACK, 3, 4)) is None
    )


def test_kube_tas_ignores_the_preference_kueue_keeps_it() -> None:
    # Rack 0 holds both members; MostAllocated member by member over the whole cluster puts
    # the first on the fullest node that fits (rack 1's 4-GPU node), the second in rack 0.
    layout = _layout(SMALL)
    free = np.array([8, 8, 4, 2])
    gang = make_gang("g", PREFERRED_RACK, 2, 4)
    plan = kube_tas(layout, free, gang)
    assert plan == [2, 0]
    assert fewest_domains(layout, free, gang) == 1
    kueue = kueue_best_fit(layout, free, gang)
    assert kueue is not None
    assert _racks(layout, kueue) == Counter({"b0-r0": 2})


def test_kueue_goes_up_a_level_then_best_fit_below() -> None:
    # Two blocks of two racks (one node each). Block 0's racks hold 3 and 2 members, block
    # 1's 4 and 4. Five members fit no rack; block 0 is the tightest block that holds them.
    layout = _layout(Shape(2, 2, 1, 8))
    free = np.array([6, 4, 8, 8])
    gang = make_gang("g", PREFERRED_RACK, 5, 2)
    plan = kueue_best_fit(layout, free, gang)
    assert plan is not None
    assert sorted(Counter(plan).items()) == [(0, 3), (1, 2)]
    assert fewest_domains(layout, free, gang) == 2
    # Nine fit no block: block 1 whole (most room) then the best fit of block 0's racks.
    nine = make_gang("nine", PREFERRED_BLOCK, 9, 2)
    plan = kueue_best_fit(layout, free, nine)
    assert plan is not None
    assert sorted(Counter(plan).items()) == [(1, 1), (2, 4), (3, 4)]


def test_slices_each_in_one_rack() -> None:
    # Racks (one node each) hold 3, 1, 2 members of 2 GPUs; slices of 2: rack 0 and rack 2
    # hold one slice each, rack 1 none.
    layout = _layout(Shape(1, 3, 1, 8))
    free = np.array([6, 2, 4])
    gang = make_gang("s", SLICES, 4, 2, 2)
    assert may_fit(layout, free, gang)
    assert fewest_domains(layout, free, gang) == 1  # one block
    plan = kueue_best_fit(layout, free, gang)
    assert plan is not None
    assert Counter(plan) == Counter({0: 2, 2: 2})
    # Three slices do not fit though six members would.
    three = make_gang("s3", SLICES, 6, 2, 2)
    assert not may_fit(layout, free, three)
    assert kueue_best_fit(layout, free, three) is None
    # The kube rule keeps every slice in a rack only by asking one rack for the gang.
    assert kube_tas(layout, free, gang) is None
    assert kube_tas(layout, np.array([8, 2, 4]), gang) == [0, 0, 0, 0]


def _check_replay(shape: Shape, stream: list[Gang], policy: str) -> int:
    """From the node labels alone: every admission keeps its required rack and slices, and
    no node holds more GPUs than it has at any admission. Returns admissions."""
    nodes = topology_cluster(shape)
    labels = {n.name: n.labels for n in nodes}
    result = replay_policy(nodes, stream, policy, patience=3000.0, seed=5, record=True)
    assert result.recheck_failed == 0
    assert len(result.placements) == result.admitted > 0
    running: list[tuple[float, Gang, tuple[str, ...]]] = []
    for n, at, where in result.placements:
        gang = stream[n]
        assert len(where) == gang.members
        racks = Counter(labels[w][RACK] for w in where)
        if gang.kind == REQUIRED_RACK:
            assert len(racks) == 1
        if gang.spec.slice_size is not None:
            assert all(c % gang.spec.slice_size == 0 for c in racks.values())
        running = [r for r in running if r[0] + r[1].run > at]
        running.append((at, gang, where))
        used: Counter[str] = Counter()
        for _, g, ws in running:
            for w in ws:
                used[w] += g.gpus
        assert max(used.values()) <= shape.gpus
    assert result.admitted + result.given_up == result.gangs == len(stream)
    return result.admitted


@pytest.mark.parametrize("policy", POLICIES)
def test_replay_keeps_required_constraints(policy: str) -> None:
    shape = Shape(2, 3, 2, 8)
    stream = topology_stream(shape, gangs=30, load=1.5, seed=11, mean_run=1000.0)
    _check_replay(shape, stream, policy)


@pytest.mark.parametrize("policy", [GREEDY, KUBE_TAS, KUEUE])
def test_replay_is_deterministic_for_a_seed(policy: str) -> None:
    shape = Shape(2, 3, 2, 8)
    stream = topology_stream(shape, gangs=25, load=1.5, seed=2, mean_run=1000.0)
    nodes = topology_cluster(shape)

    def run() -> dict[str, object]:
        doc = replay_policy(nodes, stream, policy, patience=2000.0, seed=2).to_json()
        del doc["seconds"]
        return doc

    assert run() == run()


def test_spans_never_below_the_fewest_possible() -> None:
    shape = Shape(2, 3, 2, 8)
    stream = topology_stream(
        shape, gangs=30, load=1.3, seed=4, mean_run=1000.0, mix={PREFERRED_RACK: 1, SLICES: 1}
    )
    nodes = topology_cluster(shape)
    for policy in (LATTICE, KUBE_TAS, KUEUE):
        result = replay_policy(nodes, stream, policy, patience=2000.0, seed=4)
        assert result.spans
        assert all(s >= m >= 1 for s, m in result.spans)
        assert result.excess is not None
        assert result.excess >= 0
