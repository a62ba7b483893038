"""The cache lifecycle: every (state, event) pair, legal or not, and the capacity it moves."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.control.lifecycle import (
    TRANSITIONS,
    IllegalTransitionError,
    NodeMismatchError,
    PodEvent,
    PodLifecycle,
    PodRecord,
    PodState,
    format_table,
)
from scheduler.control.queue import PodKey

KEY = PodKey("default/web-0")
S, E = PodState, PodEvent

# Written out independently of TRANSITIONS, so a change to the table must change this too.
LEGAL: dict[tuple[PodState, PodEvent], PodState] = {
    (S.INITIAL, E.ASSUME): S.ASSUMED,
    (S.INITIAL, E.ADD): S.ADDED,
    (S.INITIAL, E.FINISH_BINDING): S.INITIAL,
    (S.ASSUMED, E.FINISH_BINDING): S.BOUND,
    (S.ASSUMED, E.FORGET): S.INITIAL,
    (S.ASSUMED, E.ADD): S.ADDED,
    (S.ASSUMED, E.REMOVE): S.INITIAL,
    (S.BOUND, E.ADD): S.ADDED,
    (S.BOUND, E.EXPIRE): S.INITIAL,
    (S.BOUND, E.REMOVE): S.INITIAL,
    (S.ADDED, E.UPDATE): S.ADDED,
    (S.ADDED, E.REMOVE): S.INITIAL,
    (S.ADDED, E.FINISH_BINDING): S.ADDED,
    (S.ADDED, E.FORGET): S.ADDED,
}

ALL_PAIRS = [(state, event) for state in PodState for event in PodEvent]


def reach(lifecycle: PodLifecycle, state: PodState, node: str = "n1") -> None:
    """Put KEY in ``state`` on ``node`` by a legal path."""
    match state:
        case PodState.ASSUMED:
            lifecycle.assume(KEY, node)
        case PodState.BOUND:
            lifecycle.assume(KEY, node)
            lifecycle.finish_binding(KEY, now=0.0)
        case PodState.ADDED:
            lifecycle.add(KEY, node)
        case PodState.INITIAL:
            pass
    assert lifecycle.state(KEY) is state


def test_table_is_exactly_the_documented_one() -> None:
    assert {pair: rule.target for pair, rule in TRANSITIONS.items()} == LEGAL
    assert all(rule.why for rule in TRANSITIONS.values()), "every legal row says why"


@pytest.mark.parametrize(
    ("state", "event"),
    [pytest.param(s, e, id=f"{s}-{e}") for s, e in ALL_PAIRS if (s, e) in LEGAL],
)
def test_legal_transition(state: PodState, event: PodEvent) -> None:
    lifecycle = PodLifecycle(assumed_ttl=30.0)
    reach(lifecycle, state)
    t = lifecycle.apply(KEY, event, node="n1", now=100.0)
    after = LEGAL[(state, event)]
    assert (t.key, t.event, t.before, t.after) == (KEY, event, state, after)
    assert lifecycle.state(KEY) is after
    record = lifecycle.record(KEY)
    if after is PodState.INITIAL:
        assert record is None, "absent pods leave no record"
        assert KEY not in lifecycle
    else:
        assert record is not None
        assert record.node == "n1"
        assert (record.deadline is not None) is (after is PodState.BOUND)


@pytest.mark.parametrize(
    ("state", "event"),
    [pytest.param(s, e, id=f"{s}-{e}") for s, e in ALL_PAIRS if (s, e) not in LEGAL],
)
def test_illegal_transition_raises_and_changes_nothing(state: PodState, event: PodEvent) -> None:
    lifecycle = PodLifecycle(assumed_ttl=30.0)
    reach(lifecycle, state)
    before = lifecycle.record(KEY)
    with pytest.raises(IllegalTransitionError) as caught:
        lifecycle.apply(KEY, event, node="n1", now=100.0)
    assert (caught.value.key, caught.value.state, caught.value.event) == (KEY, state, event)
    assert f"{event} is illegal in state {state}" in str(caught.value)
    assert lifecycle.record(KEY) == before


@pytest.mark.parametrize(
    ("state", "event", "node", "released", "claimed"),
    [
        pytest.param(S.INITIAL, E.ASSUME, "n1", None, "n1", id="assume-claims"),
        pytest.param(S.INITIAL, E.ADD, "n2", None, "n2", id="foreign-add-claims"),
        pytest.param(S.ASSUMED, E.FORGET, None, "n1", None, id="forget-releases"),
        pytest.param(S.ASSUMED, E.FINISH_BINDING, None, None, None, id="finish-keeps"),
        pytest.param(S.ASSUMED, E.ADD, "n1", None, None, id="confirm-same-node"),
        pytest.param(S.ASSUMED, E.ADD, "n2", "n1", "n2", id="confirm-other-node-moves"),
        pytest.param(S.ASSUMED, E.REMOVE, None, "n1", None, id="assumed-remove-releases"),
        pytest.param(S.BOUND, E.ADD, "n1", None, None, id="bound-confirm"),
        pytest.param(S.BOUND, E.EXPIRE, None, "n1", None, id="expire-releases"),
        pytest.param(S.BOUND, E.REMOVE, None, "n1", None, id="bound-remove-releases"),
        pytest.param(S.ADDED, E.UPDATE, "n1", None, None, id="update-keeps"),
        pytest.param(S.ADDED, E.REMOVE, None, "n1", None, id="remove-releases"),
        pytest.param(S.ADDED, E.FORGET, None, None, None, id="late-forget-keeps"),
        pytest.param(S.ADDED, E.FINISH_BINDING, None, None, None, id="late-finish-keeps"),
        pytest.param(S.INITIAL, E.FINISH_BINDING, None, None, None, id="finish-after-gone"),
    ],
)
def test_capacity_effect(
    state: PodState,
    event: PodEvent,
    node: str | None,
    released: str | None,
    claimed: str | None,
) -> None:
    lifecycle = PodLifecycle()
    reach(lifecycle, state)
    t = lifecycle.apply(KEY, event, node=node, now=0.0)
    assert (t.released, t.claimed) == (released, claimed)
    record = lifecycle.record(KEY)
    assert (record.node if record else None) == t.node_after


def test_update_to_another_node_is_a_node_mismatch() -> None:
    lifecycle = PodLifecycle()
    lifecycle.add(KEY, "n1")
    with pytest.raises(NodeMismatchError) as caught:
        lifecycle.update(KEY, "n2")
    assert (caught.value.known, caught.value.got) == ("n1", "n2")
    assert lifecycle.record(KEY) == PodRecord(PodState.ADDED, "n1")


@pytest.mark.parametrize(
    ("event", "node", "now", "match"),
    [
        pytest.param(E.ASSUME, None, 0.0, "needs the node", id="assume-without-node"),
        pytest.param(E.ADD, "", 0.0, "needs the node", id="add-empty-node"),
        pytest.param(E.UPDATE, None, 0.0, "needs the node", id="update-without-node"),
        pytest.param(E.FINISH_BINDING, "n1", None, "needs now", id="finish-without-now"),
    ],
)
def test_missing_arguments_are_caller_errors(
    event: PodEvent, node: str | None, now: float | None, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        PodLifecycle().apply(KEY, event, node=node, now=now)


def test_bound_pods_expire_after_the_ttl_only() -> None:
    lifecycle = PodLifecycle(assumed_ttl=30.0)
    bound, assumed, added = PodKey("ns/bound"), PodKey("ns/assumed"), PodKey("ns/added")
    lifecycle.assume(bound, "n1")
    lifecycle.finish_binding(bound, now=10.0)
    lifecycle.assume(assumed, "n1")  # binding in flight: never expires
    lifecycle.add(added, "n1")
    assert lifecycle.record(bound) == PodRecord(PodState.BOUND, "n1", deadline=40.0)
    assert lifecycle.expire_due(40.0) == []
    [expired] = lifecycle.expire_due(40.001)
    assert (expired.key, expired.after, expired.released) == (bound, PodState.INITIAL, "n1")
    assert lifecycle.expire_due(1e9) == []
    assert set(lifecycle) == {assumed, added}


def test_without_ttl_bound_pods_never_expire() -> None:
    lifecycle = PodLifecycle()
    lifecycle.assume(KEY, "n1")
    lifecycle.finish_binding(KEY, now=0.0)
    assert lifecycle.record(KEY) == PodRecord(PodState.BOUND, "n1", deadline=None)
    assert lifecycle.expire_due(1e12) == []


def test_negative_ttl_is_rejected() -> None:
    with pytest.raises(ValueError, match="assumed_ttl"):
        PodLifecycle(assumed_ttl=-1)


def test_counts_and_keys_by_state() -> None:
    lifecycle = PodLifecycle()
    lifecycle.assume(PodKey("a/1"), "n1")
    lifecycle.assume(PodKey("a/2"), "n1")
    lifecycle.finish_binding(PodKey("a/2"), now=0.0)
    lifecycle.add(PodKey("a/3"), "n2")
    assert lifecycle.counts() == {S.INITIAL: 0, S.ASSUMED: 1, S.BOUND: 1, S.ADDED: 1}
    assert list(lifecycle.keys_in(S.BOUND)) == [PodKey("a/2")]
    assert len(lifecycle) == 3
    assert all(state.counts_capacity for state in PodState if state is not S.INITIAL)
    assert not S.INITIAL.counts_capacity


def test_format_table_lists_every_pair() -> None:
    table = format_table().splitlines()
    assert len(table) == 2 + len(ALL_PAIRS)
    for (state, event), rule in TRANSITIONS.items():
        assert f"| {state} | {event} | {rule.target} | {rule.why} |" in table
    assert sum("(illegal)" in line for line in table) == len(ALL_PAIRS) - len(LEGAL)


# -- the ledger property ------------------------------------------------------------------

KEYS = [PodKey(f"ns/p{i}") for i in range(3)]
NODES = ["n1", "n2"]
steps = st.lists(
    st.tuples(st.sampled_from(KEYS), st.sampled_from(list(PodEvent)), st.sampled_from(NODES)),
    max_size=40,
)


@settings(max_examples=80, deadline=None, database=None)
@given(steps=steps)
def test_capacity_ledger_matches_the_records(steps: list[tuple[PodKey, PodEvent, str]]) -> None:
    """Summing every transition's released/claimed gives exactly the counted pods per node,
    whatever events arrive (illegal ones are refused and change nothing)."""
    lifecycle = PodLifecycle(assumed_ttl=5.0)
    ledger: Counter[str] = Counter()
    for now, (key, event, node) in enumerate(steps):
        try:
            t = lifecycle.apply(key, event, node=node, now=float(now))
        except IllegalTransitionError:
            continue
        if t.released is not None:
            ledger[t.released] -= 1
        if t.claimed is not None:
            ledger[t.claimed] += 1
    counted = Counter(r.node for _, r in lifecycle.items() if r.state.counts_capacity)
    assert +ledger == counted
    assert all(v >= 0 for v in ledger.values())
