"""Gang streams (`scheduler.sim.gangs`): grouping, all-or-nothing replay, patience, seeds."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Sequence

import pytest

from scheduler.model.gang import GangSpec
from scheduler.sim.gangs import (
    CPSAT,
    GREEDY,
    ArmResult,
    Item,
    compare,
    every_kth_node,
    gang_stream,
    group_gangs,
    replay_arm,
)
from scheduler.sim.trace import GPU_RESOURCE, NAMESPACE, Task, Trace
from tests.sim.traces import gpu_node, task

# 1-GPU, CPU-only and multi-GPU tasks interleaved, as in the trace (sizes 2, 4 and 8).
_SIZES = [1, 8, 2, 0, 8, 4, 1, 8, 2, 4, 8, 1, 2, 8, 0, 4, 4, 8, 2, 1, 8, 8, 2, 4, 1, 8]


def _tasks(sizes: Sequence[int] = _SIZES, repeat: int = 1) -> list[Task]:
    names = itertools.count()
    return [task(f"t{next(names)}", g) for g in list(sizes) * repeat]


def _cluster(tasks: list[Task]) -> Trace:
    """Four 8-GPU nodes and two 4-GPU nodes (40 GPUs)."""
    nodes = [gpu_node(f"big-{i}", 8) for i in range(4)] + [
        gpu_node(f"small-{i}", 4) for i in (0, 1)
    ]
    return Trace(nodes, [], tasks, 0, name="toy")


_DURATIONS = [float(d) for d in range(50, 1050, 50)]


def _flat(order: list[tuple[Task, ...]]) -> list[Task]:
    return [t for entry in order for t in entry]


# ------------------------------------------------------------------------ grouping
@pytest.mark.parametrize("mixed_share", [0.0, 1.0, 0.5])
def test_every_task_once_gangs_of_multi_gpu_tasks_in_bounds(mixed_share: float) -> None:
    tasks = _tasks(repeat=3)
    order = group_gangs(tasks, seed=3, min_members=2, max_members=5, mixed_share=mixed_share)
    assert sorted(t.pod.name for t in _flat(order)) == sorted(t.pod.name for t in tasks)
    gangs = [g for g in order if len(g) > 1]
    assert len(gangs) >= 5
    for gang in gangs:
        assert 2 <= len(gang) <= 5
        assert all(t.gpus > 1 for t in gang)
    same = [g for g in gangs if len({t.gpus for t in g}) == 1]
    if mixed_share == 0.0:
        assert same == gangs
    if mixed_share == 1.0:
        # Mixed gangs take the next multi-GPU tasks as they come, whatever their sizes.
        assert len(same) < len(gangs)


def test_same_size_gangs_take_the_next_free_tasks_of_the_first_members_count() -> None:
    tasks = _tasks(repeat=3)
    order = group_gangs(tasks, seed=1, min_members=3, max_members=3, mixed_share=0.0)
    index = {t.pod.name: i for i, t in enumerate(tasks)}
    gangs = [g for g in order if len(g) > 1]
    assert {g[0].gpus for g in gangs} == {2, 4, 8}
    taken: set[str] = set()
    for gang in gangs:
        first = gang[0]
        expect = [
            t.pod.name
            for t in tasks[index[first.pod.name] :]
            if t.gpus == first.gpus and t.pod.name not in taken
        ][:3]
        assert [t.pod.name for t in gang] == expect
        taken.update(expect)


def test_mixed_gangs_are_consecutive_multi_gpu_tasks() -> None:
    tasks = _tasks()
    multi = [t for t in tasks if t.gpus > 1]
    order = group_gangs(tasks, seed=0, min_members=3, max_members=3, mixed_share=1.0)
    gangs = [g for g in order if len(g) > 1]
    assert [list(g) for g in gangs] == [multi[i : i + 3] for i in range(0, len(multi) - 2, 3)]
    assert any(len({t.gpus for t in g}) > 1 for g in gangs)


def test_gang_stands_at_its_first_members_place_and_singles_keep_their_order() -> None:
    tasks = _tasks(repeat=2)
    order = group_gangs(tasks, seed=5, min_members=2, max_members=4, mixed_share=0.5)
    index = {t.pod.name: i for i, t in enumerate(tasks)}
    firsts = [index[entry[0].pod.name] for entry in order]
    assert firsts == sorted(firsts)
    singles = [entry[0] for entry in order if len(entry) == 1]
    assert any(t.gpus <= 1 for t in singles)
    assert [index[t.pod.name] for t in singles] == sorted(index[t.pod.name] for t in singles)


def test_too_few_partners_leave_the_task_single_and_grouping_goes_on() -> None:
    # One 2-GPU task among 8-GPU ones: a same-size gang of 2-GPU tasks cannot form.
    tasks = _tasks([2, 8, 8, 8, 8, 1])
    order = group_gangs(tasks, seed=0, min_members=2, max_members=2, mixed_share=0.0)
    assert [[t.gpus for t in entry] for entry in order] == [[2], [8, 8], [8, 8], [1]]


def test_gangs_limit_ends_the_stream_at_that_gang() -> None:
    tasks = _tasks(repeat=3)
    order = group_gangs(tasks, seed=2, mixed_share=0.5, max_members=4, gangs=3)
    assert sum(1 for g in order if len(g) > 1) == 3
    assert len(order[-1]) > 1


def test_bad_member_range_is_refused() -> None:
    with pytest.raises(ValueError, match="gang sizes"):
        group_gangs(_tasks(), seed=0, min_members=1, max_members=4)
    with pytest.raises(ValueError, match="gang sizes"):
        group_gangs(_tasks(), seed=0, min_members=5, max_members=4)


def test_stream_times_and_specs() -> None:
    trace = _cluster(_tasks(repeat=3))
    items = gang_stream(trace, _DURATIONS, load=1.5, seed=4, max_members=4)
    created = [i.created for i in items]
    assert created == sorted(created)
    assert created[0] > 0
    assert all(_DURATIONS[0] <= i.run <= max(_DURATIONS) for i in items)
    gangs = [i for i in items if i.gang is not None]
    assert gangs
    assert all(len(i.members) == 1 for i in items if i.gang is None)
    assert len({g.gang.name for g in gangs if g.gang}) == len(gangs)
    for item in gangs:
        assert item.gang is not None
        assert item.gang.min_member == len(item.members)
        assert item.gang.namespace == NAMESPACE
    # Offered load: GPU-seconds asked over GPU-seconds the arrival span offers.
    asked = sum(i.gpus * i.run for i in items)
    assert asked / (trace.gpus * created[-1]) == pytest.approx(1.5, rel=0.5)


def test_stream_is_deterministic_for_a_seed() -> None:
    trace = _cluster(_tasks(repeat=3))

    def key(seed: int) -> list[tuple[tuple[str, ...], float, float]]:
        items = gang_stream(trace, _DURATIONS, load=1.2, seed=seed, max_members=5)
        return [(tuple(t.pod.name for t in i.members), i.created, i.run) for i in items]

    assert key(7) == key(7)
    assert key(7) != key(8)


def test_shuffle_permutes_the_same_entries_deterministically() -> None:
    # The multi-GPU tasks at the end, as in the multigpu40 list: in file order the gangs
    # are the last entries; shuffled, they spread over the stream.
    tasks = _tasks([1, 0, 1, 1] * 10 + [8, 2, 4, 8, 4, 2] * 4)
    trace = _cluster(tasks)

    def stream(shuffle: bool, seed: int = 3) -> list[Item]:
        return gang_stream(trace, _DURATIONS, load=1.2, seed=seed, max_members=3, shuffle=shuffle)

    def entries(items: list[Item]) -> list[tuple[str, ...]]:
        return [tuple(t.pod.name for t in i.members) for i in items]

    plain, mixed = stream(False), stream(True)
    assert sorted(entries(plain)) == sorted(entries(mixed))
    assert entries(plain) != entries(mixed)
    assert entries(stream(True)) == entries(mixed)
    assert entries(stream(True, seed=4)) != entries(mixed)
    half = len(plain) // 2
    assert not any(i.gang for i in plain[:half])
    assert any(i.gang for i in mixed[:half])
    assert [i.created for i in mixed] == sorted(i.created for i in mixed)


def test_every_kth_node_keeps_file_order() -> None:
    trace = Trace([gpu_node(f"n{i}") for i in range(10)], [], _tasks(), 0, name="t")
    kept = every_kth_node(trace, 3)
    assert [n.name for n in kept.nodes] == ["n0", "n3", "n6", "n9"]
    assert kept.tasks == trace.tasks
    assert kept.name == "t-every3"
    with pytest.raises(ValueError, match="k must be"):
        every_kth_node(trace, 0)


# -------------------------------------------------------------------------- replay
def _check_events(trace: Trace, items: Sequence[Item], result: ArmResult) -> Counter[str]:
    """Walk the recorded events on a GPU ledger of our own: every placement is a whole item
    on existing nodes, no node ever holds more GPUs than it has, an item is placed at most
    once and deleted only after it was placed, a given-up item never starts."""
    capacity = {n.name: n.allocatable.get(GPU_RESOURCE, 0) for n in trace.nodes}
    gpus = {t.pod.name: t.gpus for item in items for t in item.members}
    used = dict.fromkeys(capacity, 0)
    where: dict[str, str] = {}
    placed: set[int] = set()
    gone: set[int] = set()
    last = 0.0
    kinds: Counter[str] = Counter()
    for event in result.events:
        assert event.at >= last
        last = event.at
        item = items[event.item]
        kinds[event.kind] += 1
        if event.kind == "place":
            assert event.item not in placed
            assert event.item not in gone
            assert sorted(p for p, _ in event.pods) == sorted(t.pod.name for t in item.members)
            assert event.at >= item.created
            for pod, node in event.pods:
                used[node] += gpus[pod]
                assert used[node] <= capacity[node], f"{node} over-allocated by {pod}"
                where[pod] = node
            placed.add(event.item)
            kinds["gang_place" if item.gang is not None else "single_place"] += 1
        elif event.kind == "delete":
            assert event.item in placed
            assert event.item not in gone
            assert event.at == pytest.approx(
                next(e.at for e in result.events if e.kind == "place" and e.item == event.item)
                + item.run
            )
            for pod, _ in event.pods:
                used[where.pop(pod)] -= gpus[pod]
            gone.add(event.item)
        else:
            assert event.kind == "give_up"
            assert event.item not in placed
            assert event.item not in gone
            assert event.at >= item.created
            gone.add(event.item)
            kinds["gang_give_up" if item.gang is not None else "single_give_up"] += 1
    return kinds


@pytest.mark.parametrize("use_solver", [True, False], ids=[CPSAT, GREEDY])
def test_gangs_are_placed_whole_and_no_node_is_over_allocated(use_solver: bool) -> None:
    trace = _cluster(_tasks(repeat=4))
    items = gang_stream(trace, _DURATIONS, load=1.5, seed=2, max_members=5)
    result = replay_arm(trace, items, use_solver=use_solver, patience=300, seed=2, record=True)
    kinds = _check_events(trace, items, result)
    gangs = [i for i in items if i.gang is not None]
    # Not vacuous: gangs were placed, some mixed, and some were given up.
    assert kinds["gang_place"] == result.admitted >= 3
    assert kinds["gang_give_up"] == result.given_up >= 1
    assert result.admitted + result.given_up == result.gangs == len(gangs)
    assert result.mixed_admitted >= 1
    assert result.admitted_gpus == sum(
        i.gpus for i in gangs if i.gang and i.gang.name in set(result.admitted_names)
    )
    assert len(result.waits) == result.admitted
    assert all(w >= 0 for w in result.waits)
    assert result.singles_placed == kinds["single_place"]
    if not use_solver:
        assert result.rescued == 0


def _item(n: int, gpus: Sequence[int], created: float, run: float, gang: bool) -> Item:
    members = tuple(task(f"i{n}-m{k}", g) for k, g in enumerate(gpus))
    spec = GangSpec(namespace=NAMESPACE, name=f"gang-{n}", min_member=len(gpus)) if gang else None
    return Item(members, created, run, spec)


def _two_nodes() -> Trace:
    return Trace([gpu_node("n1"), gpu_node("n2")], [], [], 0, name="two")


@pytest.mark.parametrize(
    ("patience", "given_up_at", "wait"),
    [
        (50.0, 100.0, None),  # its patience ran out before the first deletion
        (200.0, 1001.0, None),  # one node frees at t=100: not enough
        (500.0, 1001.0, None),  # both free at t=1001, but it was given up at t=502
        (2000.0, None, 999.0),  # both free at t=1001: it starts then
    ],
)
@pytest.mark.parametrize("use_solver", [True, False], ids=[CPSAT, GREEDY])
def test_a_waiting_gang_starts_when_room_frees_or_is_given_up(
    patience: float, given_up_at: float | None, wait: float | None, use_solver: bool
) -> None:
    items = [
        _item(0, [8], 0.0, 100.0, gang=False),
        _item(1, [8], 1.0, 1000.0, gang=False),
        _item(2, [8, 8], 2.0, 10.0, gang=True),
        _item(3, [1], 3000.0, 10.0, gang=False),  # keeps the replay going past t=1001
    ]
    trace = _two_nodes()
    result = replay_arm(trace, items, use_solver=use_solver, patience=patience, record=True)
    _check_events(trace, items, result)
    admitted = given_up_at is None
    assert (result.admitted, result.given_up) == ((1, 0) if admitted else (0, 1))
    assert result.waits == ([] if wait is None else [wait])
    assert result.singles_placed == 3
    gang_events = [(e.kind, e.at) for e in result.events if e.item == 2]
    if admitted:
        assert gang_events == [("place", 1001.0), ("delete", 1011.0)]
    else:
        assert gang_events == [("give_up", given_up_at)]


@pytest.mark.parametrize("use_solver", [True, False], ids=[CPSAT, GREEDY])
def test_a_gang_that_can_never_fit_is_given_up_not_left_waiting(use_solver: bool) -> None:
    # Three 8-GPU members on two 8-GPU nodes: never. The single after it still runs.
    items = [_item(0, [8, 8, 8], 5.0, 10.0, gang=True), _item(1, [4], 6.0, 10.0, gang=False)]
    trace = _two_nodes()
    result = replay_arm(trace, items, use_solver=use_solver, patience=30.0, record=True)
    assert (result.gangs, result.admitted, result.given_up) == (1, 0, 1)
    assert result.singles_placed == 1
    give_ups = [e for e in result.events if e.kind == "give_up"]
    assert [(e.item, e.at >= 35.0) for e in give_ups] == [(0, True)]


@pytest.mark.parametrize("use_solver", [True, False], ids=[CPSAT, GREEDY])
def test_a_mixed_gang_that_fits_one_way_only_is_placed_that_way(use_solver: bool) -> None:
    # 8 + 2 free GPUs and a 2/8 gang: the 2-GPU member must take the small node.
    trace = Trace([gpu_node("n1", 8), gpu_node("n2", 2)], [], [], 0, name="split")
    items = [_item(0, [2, 8], 0.0, 10.0, gang=True)]
    result = replay_arm(trace, items, use_solver=use_solver, patience=5.0, record=True)
    _check_events(trace, items, result)
    assert result.admitted == 1
    (place,) = [e for e in result.events if e.kind == "place"]
    assert dict(place.pods) == {"i0-m0": "n2", "i0-m1": "n1"}


def _summary(result: ArmResult) -> tuple[object, ...]:
    return (
        result.admitted,
        result.given_up,
        tuple(result.admitted_names),
        tuple(result.waits),
        result.singles_placed,
        result.allocated_pct_time,
        result.frag_pct,
        result.stranded_pct,
        result.not_whole_pct,
        result.solves,
        tuple(result.events),
    )


def test_replay_and_compare_are_deterministic_for_a_seed() -> None:
    trace = _cluster(_tasks(repeat=3))
    items = gang_stream(trace, _DURATIONS, load=1.5, seed=9, max_members=4)
    for use_solver in (True, False):
        first, again = (
            replay_arm(trace, items, use_solver=use_solver, patience=300, seed=9, record=True)
            for _ in range(2)
        )
        assert _summary(first) == _summary(again)
    runs = [
        compare(trace, _DURATIONS, seeds=[1, 2], load=1.5, gangs=None, max_members=4)
        for _ in range(2)
    ]
    assert [[_summary(r) for r in s.results] for s in runs[0]] == [
        [_summary(r) for r in s.results] for s in runs[1]
    ]
    assert [s.seed for s in runs[0]] == [1, 2]
    assert [r.arm for r in runs[0][0].results] == [CPSAT, GREEDY]
