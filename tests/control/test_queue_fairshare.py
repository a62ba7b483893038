"""The active queue's tenant order (fair-share policy): priority first, then the tenant
rank, then arrival; without a rank, kube's order exactly."""

from __future__ import annotations

import dataclasses
from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.control.queue import QueueName
from tests.control.builders import FakePod, make_pod, make_queue, pop


def _pod(ns: str, name: str, priority: int = 0) -> FakePod:
    return dataclasses.replace(make_pod(name, priority=priority), namespace=ns)


def test_equal_priority_goes_to_the_tenant_ranked_first() -> None:
    queue, clock = make_queue()
    for ns, name in [("a", "a1"), ("a", "a2"), ("b", "b1"), ("c", "c1")]:
        queue.add(_pod(ns, name))
        clock.t += 1
    ranks = {"a": Fraction(1, 10), "b": Fraction(-1, 2), "c": Fraction(-1, 4)}
    queue.set_tenant_rank(lambda ns: ranks.get(ns, Fraction(0)))
    assert [p.name for p in queue.pods(QueueName.ACTIVE)] == ["b1", "c1", "a1", "a2"]
    assert [pop(queue).pod.name for _ in range(2)] == ["b1", "c1"]
    # Ranks move as usage does: the queue reads them at every pop.
    ranks["a"] = Fraction(-1)
    assert pop(queue).pod.name == "a1"


def test_priority_still_comes_first() -> None:
    queue, _ = make_queue()
    queue.add(_pod("rich", "urgent", priority=10))
    queue.add(_pod("poor", "normal", priority=0))
    queue.set_tenant_rank(lambda ns: Fraction(-1) if ns == "poor" else Fraction(1))
    assert [pop(queue).pod.name for _ in range(2)] == ["urgent", "normal"]


def test_no_rank_is_kubes_order_and_removal_works() -> None:
    queue, clock = make_queue()
    pods = [_pod("b", "x"), _pod("a", "y"), _pod("b", "z")]
    for pod in pods:
        queue.add(pod)
        clock.t += 1
    queue.set_tenant_rank(lambda ns: Fraction(-1) if ns == "a" else Fraction(0))
    queue.set_tenant_rank(None)
    queue.delete(pods[2])
    assert queue.count(QueueName.ACTIVE) == 2
    assert [pop(queue).pod.name for _ in range(2)] == ["x", "y"]
    assert queue.try_pop() is None


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from("abc"), st.integers(0, 2), st.integers(0, 3)),
        min_size=1,
        max_size=20,
    ),
    st.dictionaries(st.sampled_from("abc"), st.integers(-3, 3)),
)
def test_pop_order_is_priority_rank_arrival(
    arrivals: list[tuple[str, int, int]], ranks: dict[str, int]
) -> None:
    queue, clock = make_queue()
    start = clock.now()
    pods = []
    for i, (ns, priority, at) in enumerate(arrivals):
        clock.t = start + at
        pod = _pod(ns, f"p{i}", priority)
        queue.add(pod)
        pods.append((pod, start + at, i))
    queue.set_tenant_rank(lambda ns: Fraction(ranks.get(ns, 0)))
    want = sorted(pods, key=lambda p: (-p[0].priority, ranks.get(p[0].namespace, 0), p[1], p[2]))
    assert [pop(queue).pod.name for _ in pods] == [p[0].name for p in want]
