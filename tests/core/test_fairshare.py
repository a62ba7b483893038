"""Weighted fair share: worked examples and the properties of DRF water-filling."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core.fairshare import (
    WEIGHT_ANNOTATION,
    FairShare,
    QuotaState,
    WeightError,
    below_fair_share,
    deficit,
    excess,
    fair_shares,
    parse_weight,
    queue_order,
    reclaim_order,
    total,
)

GPU = "nvidia.com/gpu"
CPU = "cpu"


def q(
    *,
    min: int = 0,
    max: int | None = None,
    used: int = 0,
    demand: int = 0,
    weight: int | Fraction = 1,
) -> QuotaState:
    """A GPU-only quota."""
    return QuotaState(
        min={GPU: min},
        max={} if max is None else {GPU: max},
        used={GPU: used},
        demand={GPU: demand},
        weight=Fraction(weight),
    )


def gpus(shares: dict[str, FairShare]) -> dict[str, Fraction]:
    return {n: s.share[GPU] for n, s in shares.items()}


# --- the weight annotation


@pytest.mark.parametrize(
    ("value", "want"),
    [("1", Fraction(1)), ("2", Fraction(2)), ("0.5", Fraction(1, 2)), (" 3 ", Fraction(3))],
)
def test_weight_parses_positive_decimals(value: str, want: Fraction) -> None:
    assert parse_weight({WEIGHT_ANNOTATION: value}) == want


def test_weight_defaults_to_one() -> None:
    assert parse_weight(None) == 1
    assert parse_weight({"other": "7"}) == 1


@pytest.mark.parametrize("value", ["0", "-1", "abc", "1e3", "2Gi", "", "1.0000001", "2000000"])
def test_weight_refuses_bad_values_naming_them(value: str) -> None:
    with pytest.raises(WeightError, match=WEIGHT_ANNOTATION):
        parse_weight({WEIGHT_ANNOTATION: value})


# --- worked examples


def test_leftover_split_in_proportion_to_weights() -> None:
    # 16 GPUs, mins of 4 each: 8 left over, split 2:1 between two teams that want it all.
    shares = fair_shares(
        {GPU: 16},
        {"a": q(min=4, demand=16, weight=2), "b": q(min=4, demand=16), "c": q(min=0)},
    )
    assert gpus(shares) == {"a": 4 + Fraction(16, 3), "b": 4 + Fraction(8, 3), "c": 0}
    assert shares["a"].guaranteed[GPU] == 4


def test_a_small_demand_leaves_the_rest_to_others() -> None:
    shares = fair_shares({GPU: 12}, {"a": q(demand=2, weight=5), "b": q(demand=100)})
    assert gpus(shares) == {"a": 2, "b": 10}


def test_max_caps_the_share() -> None:
    shares = fair_shares({GPU: 12}, {"a": q(max=3, demand=12), "b": q(demand=4)})
    assert gpus(shares) == {"a": 3, "b": 4}


def test_unused_minimum_is_lent_not_held() -> None:
    shares = fair_shares({GPU: 8}, {"a": q(min=8, demand=1), "b": q(demand=8)})
    assert gpus(shares) == {"a": 1, "b": 7}


def test_overcommitted_minimums_shrink_evenly() -> None:
    shares = fair_shares({GPU: 6}, {"a": q(min=8, demand=8), "b": q(min=4, demand=4)})
    assert gpus(shares) == {"a": 4, "b": 2}


def test_dominant_resource_decides() -> None:
    # a wants GPUs (dominant: 1/4 of the cluster per unit of want), b wants CPU.
    capacity = {GPU: 8, CPU: 64_000}
    shares = fair_shares(
        capacity,
        {
            "a": QuotaState(demand={GPU: 8, CPU: 8_000}),
            "b": QuotaState(demand={GPU: 4, CPU: 64_000}),
        },
    )
    a, b = shares["a"].share, shares["b"].share
    # Equal dominant shares until CPU runs out: b's CPU share equals a's GPU share.
    assert shares["a"].dominant == shares["b"].dominant
    assert a[GPU] / 8 == b[CPU] / 64_000
    assert a[CPU] + b[CPU] <= 64_000
    assert a[GPU] + b[GPU] <= 8


def test_resource_without_capacity_stops_its_askers() -> None:
    shares = fair_shares({GPU: 4}, {"a": QuotaState(demand={GPU: 2, "x/fpga": 1})})
    assert shares["a"].share[GPU] == 0


def test_reclaim_takes_from_furthest_above_first() -> None:
    capacity = {GPU: 12}
    quotas = {
        "a": q(min=4, used=8, demand=8),
        "b": q(min=4, used=4, demand=8),
        "c": q(min=0, used=0, demand=4),
    }
    # Fair: a 4 + 4/3... a and b and c split the 4 left; a uses 8, far above.
    shares = fair_shares(capacity, quotas)
    assert reclaim_order(capacity, quotas, shares) == ["a"]
    assert below_fair_share(quotas["c"].used, shares["c"], capacity)
    assert not below_fair_share(quotas["a"].used, shares["a"], capacity)
    assert queue_order(capacity, quotas, shares)[-1] == "a"


def test_reclaim_order_ranks_by_dominant_over_share() -> None:
    capacity = {GPU: 20}
    quotas = {
        "a": q(used=8, demand=8),
        "b": q(used=10, demand=10),
        "c": q(used=0, demand=20),
    }
    assert reclaim_order(capacity, quotas) == ["b", "a"]


# --- properties

names = st.sampled_from(["a", "b", "c", "d", "e"])
amount = st.integers(min_value=0, max_value=40)


@st.composite
def quota_states(draw: st.DrawFn) -> QuotaState:
    res = [GPU, CPU]
    mins = {r: draw(amount) for r in res}
    maxes = {r: draw(amount) + mins[r] for r in res if draw(st.booleans())}
    used = {r: draw(amount) for r in res}
    demand = {r: used[r] + draw(amount) for r in res}
    weight = Fraction(draw(st.integers(1, 6)), draw(st.integers(1, 3)))
    return QuotaState(min=mins, max=maxes, used=used, demand=demand, weight=weight)


clusters = st.fixed_dictionaries({GPU: st.integers(0, 64), CPU: st.integers(0, 64)})
quota_maps = st.dictionaries(names, quota_states(), min_size=1, max_size=5)


def _top(state: QuotaState, r: str) -> int:
    top = max(state.demand.get(r, 0), state.used.get(r, 0))
    return min(top, state.max[r]) if r in state.max else top


@settings(max_examples=300, deadline=None)
@given(capacity=clusters, quotas=quota_maps)
def test_shares_are_feasible_and_capped(
    capacity: dict[str, int], quotas: dict[str, QuotaState]
) -> None:
    shares = fair_shares(capacity, quotas)
    for r, cap in capacity.items():
        assert total(shares.values(), r) <= cap
    for n, s in shares.items():
        state = quotas[n]
        for r in capacity:
            g = s.guaranteed[r]
            assert 0 <= g <= min(state.min[r], max(state.demand[r], state.used[r]))
            cap_g: int = min(state.min[r], max(state.demand[r], state.used[r]))
            assert 0 <= g <= cap_g


@settings(max_examples=300, deadline=None)
@given(capacity=clusters, quotas=quota_maps)
def test_guarantee_is_whole_when_it_fits(
    capacity: dict[str, int], quotas: dict[str, QuotaState]
) -> None:
    shares = fair_shares(capacity, quotas)
    for r, cap in capacity.items():
        asked = {n: min(s.min[r], max(s.demand[r], s.used[r])) for n, s in quotas.items()}
        if sum(asked.values()) <= cap:
            assert all(shares[n].guaranteed[r] == a for n, a in asked.items())


@settings(max_examples=300, deadline=None)
@given(capacity=clusters, quotas=quota_maps)
def test_water_filling_is_work_conserving_and_weighted(
    capacity: dict[str, int], quotas: dict[str, QuotaState]
) -> None:
    """An unsatisfied quota is blocked by an exhausted resource it wants, and every quota
    wanting that resource got no more extra per unit of weight than it did (DRF's
    bottleneck property)."""
    shares = fair_shares(capacity, quotas)

    def extra(n: str) -> dict[str, Fraction]:
        s = shares[n]
        return {r: s.share[r] - s.guaranteed[r] for r in capacity}

    def want(n: str) -> dict[str, Fraction]:
        s = shares[n]
        return {r: max(Fraction(0), _top(quotas[n], r) - s.guaranteed[r]) for r in capacity}

    def level(n: str) -> Fraction:
        e = extra(n)
        dom = max((e[r] / capacity[r] for r in capacity if capacity[r] > 0), default=Fraction(0))
        return dom / quotas[n].weight

    for n in quotas:
        w, e = want(n), extra(n)
        if all(e[r] == w[r] for r in capacity):
            continue
        blockers = [
            r
            for r in capacity
            if w[r] > 0 and (capacity[r] == 0 or total(shares.values(), r) == capacity[r])
        ]
        assert blockers, f"{n} unsatisfied with nothing exhausted"
        assert any(all(level(m) <= level(n) for m in quotas if want(m)[r] > 0) for r in blockers)


@settings(max_examples=100, deadline=None)
@given(capacity=clusters, quotas=quota_maps, data=st.data())
def test_deterministic_in_any_order(
    capacity: dict[str, int], quotas: dict[str, QuotaState], data: st.DataObject
) -> None:
    order = data.draw(st.permutations(list(quotas)))
    shuffled = {n: quotas[n] for n in order}
    assert fair_shares(capacity, shuffled) == fair_shares(capacity, quotas)
    assert reclaim_order(capacity, shuffled) == reclaim_order(capacity, quotas)
    assert queue_order(capacity, shuffled) == queue_order(capacity, quotas)


@settings(max_examples=200, deadline=None)
@given(capacity=clusters, quotas=quota_maps)
def test_above_and_below_are_exclusive_per_resource(
    capacity: dict[str, int], quotas: dict[str, QuotaState]
) -> None:
    shares = fair_shares(capacity, quotas)
    order = reclaim_order(capacity, quotas, shares)
    for n, state in quotas.items():
        e = excess(state.used, shares[n], capacity)
        d = deficit(state.used, shares[n], capacity)
        assert (n in order) == (e > 0)
        # used == share everywhere is neither above nor below.
        if e <= 0 and d <= 0:
            assert all(
                state.used.get(r, 0) == shares[n].share[r] for r in capacity if capacity[r] > 0
            )
