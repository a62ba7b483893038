"""spec.quota.policy and the tenant ranks the queue reads under Fair."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest

from scheduler.control.fairness import TenantRanks, weights_of
from scheduler.control.queue import QueueName
from scheduler.control.scheduler import Scheduler
from scheduler.control.settings import QuotaPolicy, SettingsError, default_spec, parse_spec
from scheduler.core.fairshare import WEIGHT_ANNOTATION
from scheduler.core.quota import Quota, QuotaSnapshot
from scheduler.obs.metrics import Metrics
from tests.builders import make_pod, quota_body
from tests.control.test_quotas import gpu_pod, scheduler

GPU = "nvidia.com/gpu"


def _quota_body(ns: str, weight: str | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"namespace": ns, "name": "q"}
    if weight is not None:
        meta["annotations"] = {WEIGHT_ANNOTATION: weight}
    return {"metadata": meta, "spec": {"min": {GPU: "4"}}}


def test_policy_defaults_to_fair_and_round_trips() -> None:
    assert parse_spec({}, "lattice").quota.policy is QuotaPolicy.FAIR
    default = default_spec("lattice")
    assert default["quota"] == {"policy": "Fair"}
    assert parse_spec(default, "lattice").quota.policy is QuotaPolicy.FAIR
    spec = {"quota": {"policy": "Capacity"}}
    assert parse_spec(spec, "lattice").quota.policy is QuotaPolicy.CAPACITY


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"policy": "fair"}, "'fair' is not Fair or Capacity"),
        ({"policy": "DRF"}, "is not Fair or Capacity"),
        ({"weights": {}}, "unknown key 'weights'"),
        ("Fair", "spec.quota must be an object"),
    ],
)
def test_bad_policies_say_why(raw: object, message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        parse_spec({"quota": raw}, "lattice")


def test_weights_are_read_and_bad_ones_reported() -> None:
    weights, errors = weights_of(
        [_quota_body("a", "2"), _quota_body("b", None), _quota_body("c", "heavy")]
    )
    assert weights == {"a": 2, "b": 1, "c": 1}
    assert list(errors) == ["c"]
    assert "'heavy'" in errors["c"]
    assert "quota c/q" in errors["c"]


def test_ranks_put_the_tenant_furthest_below_first() -> None:
    quotas = QuotaSnapshot(
        {
            "a": Quota("a", "q", {GPU: 4}, {}, {GPU: 6}),
            "b": Quota("b", "q", {GPU: 12}, {}, {GPU: 2}),
        }
    )
    ranks = TenantRanks()
    assert ranks.rank("a") == 0
    ranks.refresh(quotas, {"a": Fraction(1), "b": Fraction(1)}, {GPU: 16}, {"b": {GPU: 8}})
    # Guaranteed 4 and 10 (b's demand), the 2 left to a (b wants no more): fair 6 and 10.
    # a uses its share, b 2 (8/16 below).
    assert ranks.snapshot() == {"a": Fraction(0), "b": Fraction(-8, 16)}
    assert ranks.rank("elsewhere") == 0


def test_shares_divide_only_what_the_mins_let_the_quotas_use() -> None:
    """Admission keeps all use within the sum of the mins (8 of the 16 GPUs here): shares
    of the 8 nobody may use would put both quotas below their share at once."""
    quotas = QuotaSnapshot(
        {
            "a": Quota("a", "q", {GPU: 4}, {}, {GPU: 6}),
            "b": Quota("b", "q", {GPU: 4}, {}, {GPU: 2}),
        }
    )
    ranks = TenantRanks()
    ranks.refresh(
        quotas, {"a": Fraction(1), "b": Fraction(1)}, {GPU: 16, "cpu": 64000}, {"b": {GPU: 8}}
    )
    got = ranks.shares()
    assert got is not None
    shares, capacity = got
    assert capacity == {GPU: 8}  # cpu: no quota names it
    assert {ns: s.share[GPU] for ns, s in shares.items()} == {"a": 4, "b": 4}
    # a borrows b's min (2 above its share of 8), b is owed 2.
    assert ranks.snapshot() == {"a": Fraction(2, 8), "b": Fraction(-2, 8)}


def test_the_policy_switches_the_queue_order_live() -> None:
    sched = Scheduler(parse_spec({}, "lattice"), writer=None, metrics=Metrics.create())
    first = make_pod("first", namespace="rich").build()
    second = make_pod("second", namespace="poor").build()
    sched.queue.add(first)
    sched.queue.add(second)
    quotas = QuotaSnapshot(
        {
            "rich": Quota("rich", "q", {GPU: 1}, {}, {GPU: 7}),
            "poor": Quota("poor", "q", {GPU: 1}, {}, {GPU: 0}),
        }
    )
    sched.tenant_ranks.refresh(quotas, {}, {GPU: 8}, {"poor": {GPU: 4}, "rich": {GPU: 4}})
    assert [p.name for p in sched.queue.pods(QueueName.ACTIVE)] == ["second", "first"]
    sched.apply_settings(parse_spec({"quota": {"policy": "Capacity"}}, "lattice"))
    assert [p.name for p in sched.queue.pods(QueueName.ACTIVE)] == ["first", "second"]


def _weighted(ns: str, min_gpus: int, weight: str | None = None) -> dict[str, Any]:
    body = quota_body(ns, "q", min={GPU: min_gpus})
    if weight is not None:
        body["metadata"]["annotations"] = {WEIGHT_ANNOTATION: weight}
    return body


def test_the_scheduler_ranks_quota_namespaces_from_use_and_pending_pods() -> None:
    """a and b both borrow beyond their min of 2 on 16 GPUs; b (weight 3) asks much more.
    Fair shares: a 5, b 11 (the 12 left split 1:3, a capped by its demand). Both use 5: b is
    6/16 below its share, a at it, so b's pod goes first though a's came first."""
    sched, _ = scheduler(nodes=2, gpus=8)
    sched.quota_upserted(_weighted("team-a", 2))
    sched.quota_upserted(_weighted("team-b", 2, "3"))
    sched.quota_upserted(_weighted("team-d", 12, "oops"))  # weighs 1, logged
    sched.pod_upserted(gpu_pod("a-run", 5, ns="team-a", node="n0"))
    sched.pod_upserted(gpu_pod("b-run", 5, ns="team-b", node="n1"))
    sched.pod_upserted(gpu_pod("a-wait", 1, ns="team-a"))
    for i in range(5):
        sched.pod_upserted(gpu_pod(f"b-wait-{i}", 2, ns="team-b"))
    sched.refresh_tenant_ranks()
    assert sched.tenant_ranks.snapshot() == {
        "team-a": Fraction(0),
        "team-b": Fraction(-6, 16),
        "team-d": Fraction(0),
    }
    order = [p.name for p in sched.queue.pods(QueueName.ACTIVE)]
    assert order[0] == "b-wait-0"
    assert order.index("a-wait") == len(order) - 1
    sched.apply_settings(parse_spec({"quota": {"policy": "Capacity"}}, "lattice"))
    assert sched.queue.pods(QueueName.ACTIVE)[0].name == "a-wait"
