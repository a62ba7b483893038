"""Reclaim evicts no more than needed, checked against a brute force on small clusters.

Every drawn case (400, derandomized so the counts below are stable) is a few nodes of 4
bytes of memory, pods of 1-3 bytes in three quota namespaces (and one without a quota), and
a pending pod the quota PreFilter or NodeResourcesFit refused. For every preemption found,
independently of the evaluator:

* the victims are allowed by CapacityScheduling's rules, stated statically (own quota's
  lower-priority pods above min; other quotas' pods that borrowed, below min);
* with the victims gone the pod fits its node and the quota admission admits it;
* no single victim could have been spared (the set is inclusion-minimal);
* where every pod has size 1 and one priority, no node could have been freed with fewer
  evictions: the count equals the brute force's minimum over every subset of every node
  (each borrower taken at most down to its min, as the rules allow).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from itertools import combinations
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core.explain import PREFILTER_REJECTED, Decision, Explanation, Rejection
from scheduler.core.framework import Code
from scheduler.core.preemption import Inputs, preempt
from scheduler.core.quota import (
    Quota,
    QuotaSnapshot,
    add,
    admit,
    more_than_min_with,
    pod_request,
    subtract,
    used_over_min,
)
from scheduler.core.reclaim import Quotas, held_by
from scheduler.core.schedule import Framework
from scheduler.core.snapshot import Snapshot
from scheduler.model.pod import Pod
from tests.builders import cluster, make_node, make_pod

FRAMEWORK = Framework()
NODE_MEMORY = 4
SPACES = ("ns1", "ns2", "ns3")
OUTCOMES: Counter[str] = Counter()


Case = tuple[list[tuple[Pod, str]], Pod, QuotaSnapshot, int, bool]


@st.composite
def cases(draw: Any) -> Case:
    uniform = draw(st.booleans())
    num_nodes = draw(st.integers(1, 3))
    placed: list[tuple[Pod, str]] = []
    for n in range(num_nodes):
        room = NODE_MEMORY
        for j in range(draw(st.integers(0, 4))):
            size = 1 if uniform else draw(st.integers(1, 3))
            if size > room:
                break
            room -= size
            ns = draw(st.sampled_from((*SPACES, "free")))
            priority = 1 if uniform else draw(st.sampled_from([1, 5]))
            builder = make_pod(f"e{n}-{j}", memory=str(size), namespace=ns)
            placed.append((builder.priority(priority).uid(f"e{n}-{j}").build(), f"n{n}"))
    used: dict[str, dict[str, int]] = {}
    for pod, _ in placed:
        used[pod.namespace] = add(used.get(pod.namespace, {}), held_by(pod))
    quotas = {
        ns: Quota(ns, "q", {"memory": draw(st.integers(0, 4))}, {}, used.get(ns, {}))
        for ns in SPACES
    }
    size = 1 if uniform else draw(st.integers(1, 3))
    ns = draw(st.sampled_from((*SPACES, "free")))
    pending = make_pod("p", memory=str(size), namespace=ns).priority(draw(st.sampled_from([3, 7])))
    return placed, pending.uid("p").build(), QuotaSnapshot(quotas), num_nodes, uniform


def decision_for(snapshot: Snapshot, pod: Pod, quotas: QuotaSnapshot) -> Decision | None:
    """The failed cycle: the quota PreFilter's refusal, else the filters'; None if it fits."""
    if not admit(quotas, pod.namespace, pod_request(pod), priority=pod.priority).admitted:
        rows = np.full(snapshot.num_nodes, PREFILTER_REJECTED, dtype=np.int16)
        rejection = Rejection("CapacityScheduling", Code.UNSCHEDULABLE, "quota")
        explanation = Explanation(snapshot.node_names, rows, prefilter_rejection=rejection)
        return Decision(pod, None, explanation)
    decision = FRAMEWORK.schedule(snapshot, pod)
    return None if decision.selected is not None else decision


def memory(pod: Pod) -> int:
    return pod.resources.requests.get("memory", 0)


def freed_enough(
    placed: Sequence[tuple[Pod, str]], pod: Pod, quotas: QuotaSnapshot, node: str, gone: set[str]
) -> bool:
    """The pod fits ``node`` and its quota admits it with the pods named in ``gone`` evicted."""
    on_node = sum(memory(p) for p, n in placed if n == node and p.name not in gone)
    if on_node + memory(pod) > NODE_MEMORY:
        return False
    left = dict(quotas.quotas)
    for p, _ in placed:
        if p.name in gone and p.namespace in left:
            q = left[p.namespace]
            left[p.namespace] = q.with_used(subtract(q.used, held_by(p)))
    return admit(
        QuotaSnapshot(left), pod.namespace, pod_request(pod), priority=pod.priority
    ).admitted


def allowed(pod: Pod, victim: Pod, quotas: QuotaSnapshot) -> bool:
    """CapacityScheduling's rules, stated statically."""
    own = quotas.of(pod.namespace)
    theirs = quotas.of(victim.namespace)
    if own is None:
        return theirs is None and victim.priority < pod.priority
    if theirs is None:
        return False
    governed = quotas.named()
    if more_than_min_with(own, pod_request(pod), governed=governed):
        return victim.namespace == pod.namespace and victim.priority < pod.priority
    return victim.namespace != pod.namespace and used_over_min(theirs, governed=governed)


def brute_force_minimum(
    placed: Sequence[tuple[Pod, str]], pod: Pod, quotas: QuotaSnapshot, num_nodes: int
) -> int | None:
    """The fewest evictions that free some node, every borrower taken at most down to its
    min (size-1 pods)."""
    best: int | None = None
    for n in range(num_nodes):
        node = f"n{n}"
        pool = [p for p, at in placed if at == node and allowed(pod, p, quotas)]
        for k in range(len(pool) + 1):
            if best is not None and k >= best:
                break
            for subset in combinations(pool, k):
                per_quota = Counter(p.namespace for p in subset)
                if any(
                    ns != pod.namespace
                    and count
                    > quotas.quotas[ns].used.get("memory", 0)
                    - quotas.quotas[ns].min.get("memory", 0)
                    for ns, count in per_quota.items()
                    if ns in quotas.quotas
                ):
                    continue
                if freed_enough(placed, pod, quotas, node, {p.name for p in subset}):
                    best = k
                    break
    return best


@settings(max_examples=400, deadline=None, derandomize=True)
@given(cases())
def test_reclaim_evicts_no_more_than_needed(case: Case) -> None:
    placed, pod, quotas, num_nodes, uniform = case
    snapshot = cluster(
        [make_node(f"n{i}", cpu="4", memory=str(NODE_MEMORY), pods=32) for i in range(num_nodes)],
        placed,
    )
    decision = decision_for(snapshot, pod, quotas)
    if decision is None:
        OUTCOMES["fits"] += 1
        return
    found = preempt(FRAMEWORK, snapshot, decision, Inputs(quotas=Quotas(quotas)))
    minimum = brute_force_minimum(placed, pod, quotas, num_nodes) if uniform else None
    if found is None:
        OUTCOMES["none"] += 1
        if uniform:
            assert minimum is None, "a node could have been freed"
        return
    OUTCOMES["preempted"] += 1
    gone = {v.name for v in found.victims}
    assert all(allowed(pod, v, quotas) for v in found.victims)
    assert freed_enough(placed, pod, quotas, found.node, gone)
    for victim in gone:
        assert not freed_enough(placed, pod, quotas, found.node, gone - {victim}), victim
    if uniform:
        OUTCOMES["compared"] += 1
        assert len(gone) == minimum


def test_the_property_saw_preemptions() -> None:
    """Run after the property (same module, file order): enough of its cases preempted,
    and enough were compared with the brute force, for it to say something."""
    if not OUTCOMES:
        test_reclaim_evicts_no_more_than_needed()
    assert OUTCOMES["preempted"] >= 30, OUTCOMES
    assert OUTCOMES["compared"] >= 10, OUTCOMES
