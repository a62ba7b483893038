"""ElasticQuotas in the scheduler process, without a server: admission of single pods and
gangs, usage from anyone's bound pods, requeue on quota room freed, status.used on change."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from scheduler.control.explain import explain_quota, quota_json, render_quota
from scheduler.control.kubeio import KubeWriter
from scheduler.control.queue import QueueName, pod_key
from scheduler.control.scheduler import Scheduler
from scheduler.control.settings import parse_spec
from scheduler.model.pod import Pod
from scheduler.obs.metrics import Metrics
from tests.builders import make_node, make_pod, quota_body
from tests.control.test_gangs import NOW, Clock, FakeWriter, podgroup, run_one

GPU = "nvidia.com/gpu"
LABEL = "scheduling.x-k8s.io/pod-group"


class QuotaWriter(FakeWriter):
    def __init__(self) -> None:
        super().__init__()
        self.quota_statuses: list[tuple[str, str, dict[str, Any]]] = []

    async def elasticquota_status(
        self, namespace: str, name: str, status: Mapping[str, Any]
    ) -> None:
        self.quota_statuses.append((namespace, name, dict(status)))


def scheduler(nodes: int = 2, gpus: int = 8) -> tuple[Scheduler, QuotaWriter]:
    writer = QuotaWriter()
    sched = Scheduler(
        parse_spec({}, "lattice"),
        writer=cast(KubeWriter, writer),
        metrics=Metrics.create(),
        clock=Clock(),
        wall_clock=lambda: NOW,
    )
    for i in range(nodes):
        node = make_node(f"n{i}", cpu="64", memory="256Gi").resource(GPU, gpus)
        sched.node_upserted(node.obj())
    return sched, writer


def gpu_pod(
    name: str, gpus: int, *, ns: str = "team-a", node: str = "", scheduler_name: str = "lattice"
) -> dict[str, Any]:
    body = make_pod(name, "1", namespace=ns, resources={GPU: str(gpus)}).obj()
    body["spec"]["schedulerName"] = scheduler_name
    if node:
        body["spec"]["nodeName"] = node
        body["status"] = {"phase": "Running"}
    return body


def failures(writer: FakeWriter, pod: str) -> list[str]:
    """FailedScheduling messages of ``pod``, each cut to what the PreFilter said (kube's
    frame: "0/N nodes are available: <reason>. preemption: ...")."""
    prefix = "nodes are available: "
    return [
        e[3].split(prefix, 1)[1].split(". preemption:", 1)[0]
        for e in writer.events
        if e[1] == pod and e[2] == "FailedScheduling"
    ]


async def test_max_refuses_with_the_rule_and_amounts_kube_bound_pods_counted() -> None:
    sched, writer = scheduler()
    sched.quota_upserted(quota_body("team-a", "q", min={GPU: 16}, max={GPU: 16}))
    # 14 GPUs placed by kube-scheduler in the namespace count as used.
    sched.pod_upserted(gpu_pod("k1", 8, node="n0", scheduler_name="default-scheduler"))
    k2 = gpu_pod("k2", 6, node="n1", scheduler_name="default-scheduler")
    sched.pod_upserted(k2)
    sched.pod_upserted(gpu_pod("p", 4))
    await run_one(sched)
    assert writer.binds == []
    assert failures(writer, "p") == ["quota team-a/q: 14 of max 16 nvidia.com/gpu used, pod asks 4"]
    assert sched.queue.where(pod_key("team-a", "p")) is QueueName.UNSCHEDULABLE
    # Room freed in the quota (a bound pod of the namespace deleted): the pod is retried.
    sched.pod_deleted(k2)
    assert sched.queue.where(pod_key("team-a", "p")) in (QueueName.ACTIVE, QueueName.BACKOFF)


async def test_pods_without_a_quota_are_untouched() -> None:
    sched, writer = scheduler()
    sched.quota_upserted(quota_body("team-a", "q", max={GPU: 0}))
    sched.pod_upserted(gpu_pod("free", 4, ns="elsewhere"))
    await run_one(sched)
    assert [n for n, _ in writer.binds] == ["free"]


async def test_min_rule_and_a_quota_change_requeues_its_pods() -> None:
    sched, writer = scheduler()
    sched.quota_upserted(quota_body("team-a", "q", min={GPU: 2}, max={GPU: 16}))
    sched.quota_upserted(quota_body("team-b", "q", min={GPU: 2}, max={GPU: 16}))
    sched.pod_upserted(gpu_pod("big", 6))
    await run_one(sched)
    assert failures(sched_writer := writer, "big") == [
        "quota team-a/q: all quotas use 0 of the 4 nvidia.com/gpu their mins sum to, pod asks 6"
    ]
    sched.quota_upserted(quota_body("team-b", "q", min={GPU: 8}, max={GPU: 16}))
    assert sched.queue.where(pod_key("team-a", "big")) in (QueueName.ACTIVE, QueueName.BACKOFF)
    sched.queue.flush(now=1e9)
    await run_one(sched)
    assert [n for n, _ in sched_writer.binds] == ["big"]  # borrows team-b's idle min


async def test_assumed_pods_count_at_once() -> None:
    sched, writer = scheduler()
    sched.quota_upserted(quota_body("team-a", "q", min={GPU: 6}, max={GPU: 6}))
    for name in ("a", "b"):
        sched.pod_upserted(gpu_pod(name, 4))
    info = sched.queue.try_pop()
    assert info is not None
    sched.schedule_one(info)  # assumed; its binding not even sent yet
    info = sched.queue.try_pop()
    assert info is not None
    sched.schedule_one(info)
    await sched.drain(5)
    assert len(writer.binds) == 1
    refused = failures(writer, "b") or failures(writer, "a")
    assert refused == ["quota team-a/q: 4 of max 6 nvidia.com/gpu used, pod asks 4"]


async def test_invalid_quota_refuses_its_namespace_with_the_reason() -> None:
    sched, writer = scheduler()
    sched.quota_upserted(quota_body("team-a", "q", max={GPU: "lots"}))
    sched.pod_upserted(gpu_pod("p", 1))
    await run_one(sched)
    assert writer.binds == []
    (message,) = failures(writer, "p")
    assert message.startswith("quota team-a/q is invalid: invalid spec.max[nvidia.com/gpu] 'lots'")
    sched.quota_upserted(quota_body("team-a", "q", min={GPU: 2}, max={GPU: 2}))
    sched.queue.flush(now=1e9)
    await run_one(sched)
    assert [n for n, _ in writer.binds] == ["p"]


async def test_status_used_written_on_change_only_and_resources_removed() -> None:
    sched, writer = scheduler()
    sched.quota_upserted(quota_body("team-a", "q", min={GPU: 8}, max={GPU: 8}))
    await sched.write_quota_statuses()
    assert writer.quota_statuses == []  # nothing used, nothing shown: no write
    bound = gpu_pod("k", 2, node="n0", scheduler_name="default-scheduler")
    sched.pod_upserted(bound)
    await sched.write_quota_statuses()
    await sched.write_quota_statuses()
    assert writer.quota_statuses == [("team-a", "q", {"used": {"cpu": "1", GPU: "2"}})]
    sched.pod_deleted(bound)
    await sched.write_quota_statuses()
    assert writer.quota_statuses[-1] == ("team-a", "q", {"used": {"cpu": None, GPU: None}})
    # The status the object already shows (a restart, another leader's write) is not rewritten.
    shown = quota_body("team-b", "q", max={GPU: 8})
    shown["status"] = {"used": {"cpu": "1", GPU: "1"}}
    sched.quota_upserted(shown)
    sched.pod_upserted(gpu_pod("kb", 1, ns="team-b", node="n1", scheduler_name="x"))
    count = len(writer.quota_statuses)
    await sched.write_quota_statuses()
    assert len(writer.quota_statuses) == count


async def test_metrics_per_quota() -> None:
    sched, _ = scheduler()
    sched.quota_upserted(quota_body("team-a", "q", min={GPU: 4, "cpu": "2"}, max={GPU: 8}))
    sched.pod_upserted(gpu_pod("k", 3, node="n0", scheduler_name="x"))
    sched.set_quota_gauges()
    reg = sched.metrics.registry
    name = "lattice_quota_resource_units"
    labels = {"namespace": "team-a", "quota": "q"}
    assert reg.get_sample_value(name, {**labels, "resource": GPU, "bound": "used"}) == 3
    assert reg.get_sample_value(name, {**labels, "resource": GPU, "bound": "max"}) == 8
    assert reg.get_sample_value(name, {**labels, "resource": "cpu", "bound": "min"}) == 2
    assert reg.get_sample_value(name, {**labels, "resource": "cpu", "bound": "used"}) == 1
    sched.quota_deleted(quota_body("team-a", "q"))
    sched.set_quota_gauges()
    assert reg.get_sample_value(name, {**labels, "resource": GPU, "bound": "used"}) is None


def gang_member(name: str, group: str, gpus: int) -> dict[str, Any]:
    body = gpu_pod(name, gpus)
    body["metadata"]["labels"] = {LABEL: group}
    return body


def team_podgroup(name: str, min_member: int) -> dict[str, Any]:
    body = podgroup(name, min_member)
    body["metadata"]["namespace"] = "team-a"
    return body


async def test_gang_admitted_as_one_unit_or_not_at_all() -> None:
    sched, writer = scheduler()
    sched.quota_upserted(quota_body("team-a", "q", min={GPU: 16}, max={GPU: 5}))
    sched.podgroup_upserted(team_podgroup("g", 3))
    for name in ("a", "b", "c"):
        sched.pod_upserted(gang_member(name, "g", 2))
    await run_one(sched)
    assert writer.binds == []  # two members would fit the quota: none is placed
    failed = {e[1]: e[3] for e in writer.events if e[2] == "FailedScheduling"}
    assert failed["a"] == (
        "gang team-a/g: quota team-a/q: 0 of max 5 nvidia.com/gpu used, gang of 3 asks 6"
    )
    assert sched.cache.snapshot.pod_counts.sum() == 0
    sched.quota_upserted(quota_body("team-a", "q", min={GPU: 16}, max={GPU: 6}))
    sched.queue.flush(now=1e9)
    await run_one(sched)
    assert sorted(n for n, _ in writer.binds) == ["a", "b", "c"]


async def test_gang_members_beyond_the_quorum_only_as_far_as_the_quota_goes() -> None:
    sched, writer = scheduler()
    sched.quota_upserted(quota_body("team-a", "q", min={GPU: 16}, max={GPU: 6}))
    sched.podgroup_upserted(team_podgroup("g", 2))
    for name in ("a", "b", "c", "d"):
        sched.pod_upserted(gang_member(name, "g", 2))
    await run_one(sched)
    assert len(writer.binds) == 3  # the quorum of 2 and one more: 6 GPUs, the max
    assert sum(v for v in sched.quota_snapshot().quotas["team-a"].used.values() if v) >= 6
    assert sched.quota_snapshot().quotas["team-a"].used[GPU] == 6


def borrowed(sched: Scheduler, priority: int = 1000) -> list[dict[str, Any]]:
    """team-a (min 8 GPUs) idle; team-b (min 8) borrows: 6 pods of 2 GPUs, 4 on n0 and 2
    on n1, of a priority above anything team-a runs. n1 has 4 GPUs free."""
    sched.quota_upserted(quota_body("team-a", "q", min={GPU: 8}, max={GPU: 16}))
    sched.quota_upserted(quota_body("team-b", "q", min={GPU: 8}, max={GPU: 16}))
    out = []
    for i in range(6):
        body = gpu_pod(f"b{i}", 2, ns="team-b", node="n0" if i < 4 else "n1")
        body["metadata"]["uid"] = f"uid-b{i}"
        body["spec"]["priority"] = priority
        body["status"]["startTime"] = f"2026-01-01T00:00:0{i}Z"
        sched.pod_upserted(body)
        out.append(body)
    return out


async def test_a_gang_within_its_min_reclaims_from_the_borrower_whole_then_binds() -> None:
    """The sum of mins (16) refuses team-a's gang of 4 x 2 GPUs (12 + 8 > 16) though n1 has
    room for two members: two of team-b's pods go (not more: team-b keeps its min), whatever
    their priority, each with the reclaim event naming the PodGroup; the gang binds whole
    once they are gone."""
    sched, writer = scheduler()
    theirs = borrowed(sched)
    sched.podgroup_upserted(team_podgroup("g", 4))
    for name in ("a", "b", "c", "d"):
        sched.pod_upserted(gang_member(name, "g", 2))
    await run_one(sched)
    assert writer.binds == []
    assert len(writer.deletes) == 2
    assert all(v.startswith("b") for v in writer.deletes)
    events = sorted(e[3] for e in writer.events if e[2] == "Preempted")
    assert len(events) == 2
    for message in events:
        assert message.startswith("Reclaimed by ElasticQuota team-a/q for PodGroup team-a/g on ")
        assert message.endswith("quota team-b/q used more than its min")
    (pg,) = [e[3] for e in writer.events if e[0] == "PodGroup" and e[2] == "Preempting"]
    assert "reclaiming 2 pods of quotas above their min" in pg
    registry = sched.metrics.registry
    sample = registry.get_sample_value(
        "lattice_quota_reclaim_evictions_total", {"namespace": "team-b", "quota": "q"}
    )
    assert sample == 2.0

    for body in theirs:
        if body["metadata"]["name"] in writer.deletes:
            sched.pod_deleted(body)
    # The borrower's controller makes a pod again first: the gang's nominated members hold
    # their room in the sum of mins (team-a does not borrow), so it does not take it back.
    again = gpu_pod("b9", 2, ns="team-b")
    again["spec"]["priority"] = 1000
    sched.pod_upserted(again)
    sched.queue.flush(now=1e9)
    info = sched.queue.try_pop()
    assert info is not None
    assert info.pod.name == "b9"  # the higher priority goes first
    sched.schedule_one(info)
    await sched.drain(10)
    assert writer.binds == []
    assert (
        "all quotas use 8 of the 16 nvidia.com/gpu their mins sum to" in failures(writer, "b9")[-1]
    )
    await run_one(sched)
    assert sorted(n for n, _ in writer.binds) == ["a", "b", "c", "d"]
    assert sched.quota_snapshot().quotas["team-a"].used[GPU] == 8
    assert sched.quota_snapshot().quotas["team-b"].used[GPU] == 8


async def test_a_gang_reclaims_borrowed_quota_off_the_nodes_it_goes_to() -> None:
    """With an empty third node the gang fits as it is: only the sum of mins refuses it.
    Reclaim then evicts two of the borrower's pods wherever they run (the quota rule is
    cluster-wide), not none, and not pods on the nodes the gang will use."""
    sched, writer = scheduler(nodes=3)
    borrowed(sched)
    sched.podgroup_upserted(team_podgroup("g", 4))
    for name in ("a", "b", "c", "d"):
        sched.pod_upserted(gang_member(name, "g", 2))
    await run_one(sched)
    assert len(writer.deletes) == 2
    assert all(v.startswith("b") for v in writer.deletes)
    nominated = {p.name: node for p, node in sched.preemptor.nominations.values()}
    assert set(nominated) == {"a", "b", "c", "d"}


async def test_a_gang_that_would_pass_its_min_does_not_reclaim() -> None:
    """A gang of 5 x 2 GPUs takes team-a past its min (10 > 8): reclaim may not serve it,
    it waits with the quota's refusal and nothing is evicted."""
    sched, writer = scheduler()
    borrowed(sched)
    sched.podgroup_upserted(team_podgroup("g", 5))
    for name in ("a", "b", "c", "d", "e"):
        sched.pod_upserted(gang_member(name, "g", 2))
    await run_one(sched)
    assert writer.binds == []
    assert writer.deletes == []
    failed = {e[1]: e[3] for e in writer.events if e[2] == "FailedScheduling"}
    assert failed["a"].startswith("gang team-a/g: ")
    assert "their mins sum to" in failed["a"]
    # and why it may not reclaim (no fair shares computed yet: CapacityScheduling's rules)
    assert failed["a"].endswith(
        "gang of 5 asks 10. Reclaim: quota team-a/q goes above its min with the gang: only "
        "its own quota's lower-priority pods may be preempted."
    ), failed["a"]


def test_explain_shows_the_quota_view() -> None:
    sched, _ = scheduler()
    sched.quota_upserted(quota_body("team-a", "q", min={GPU: 16}, max={GPU: 16}))
    sched.pod_upserted(gpu_pod("k", 8, node="n0", scheduler_name="x"))
    sched.pod_upserted(gpu_pod("k2", 6, node="n1", scheduler_name="x"))
    pod = Pod.from_api(gpu_pod("p", 4))
    view = explain_quota(sched.quota_snapshot(), pod, None)
    assert view is not None
    lines = render_quota(view).splitlines()
    assert lines[0] == (
        "Quota team-a/q: refused (max rule): "
        "quota team-a/q: 14 of max 16 nvidia.com/gpu used, pod asks 4"
    )
    assert lines[1].split() == [
        "RESOURCE",
        "USED",
        "MIN",
        "MAX",
        "POD",
        "ASKS",
        "ALL",
        "USED",
        "SUM",
        "OF",
        "MINS",
    ]
    assert lines[2].split() == ["cpu", "2", "0", "-", "1", "2", "0"]
    assert lines[3].split() == [GPU, "14", "16", "16", "4", "14", "16"]
    data = quota_json(view)
    assert (data["rule"], data["admitted"], data["used"]) == ("max", False, {"cpu": "2", GPU: "14"})
    assert (
        explain_quota(sched.quota_snapshot(), Pod.from_api(gpu_pod("o", 1, ns="x")), None) is None
    )
