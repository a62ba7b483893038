"""The volume differential's independent plan check rejects what it must (pure)."""

from __future__ import annotations

from scheduler.core.volumes import StaticBinding, VolumePlan
from tests.e2e.differential.gen import Body
from tests.e2e.differential.volumes_check import KubeVolumes, plan_problems, satisfies
from tests.e2e.differential.volumes_objects import pv, pvc

NODE: Body = {"metadata": {"name": "n1", "labels": {"kubernetes.io/hostname": "n1"}}}
CLAIM = pvc("c", "2Gi", namespace="ns", storage_class="wffc")
PVS = {
    "small": pv("small", "2Gi", storage_class="wffc", host="n1"),
    "big": pv("big", "10Gi", storage_class="wffc", host="n1"),
    "elsewhere": pv("elsewhere", "2Gi", storage_class="wffc", host="n2"),
    "tiny": pv("tiny", "1Gi", storage_class="wffc", host="n1"),
    "other-class": pv("other-class", "2Gi", storage_class="x", host="n1"),
    "rwx": pv("rwx", "2Gi", storage_class="wffc", host="n1", modes=("ReadWriteMany",)),
}


def binding(volume: str, claim: str = "c") -> StaticBinding:
    return StaticBinding(volume, "ns", claim, "uid", "1", "1", True)


def problems(plan: VolumePlan | None, kube: KubeVolumes, pvs: dict[str, Body] = PVS) -> list[str]:
    return plan_problems(plan, kube, namespace="ns", node=NODE, unbound={"c": CLAIM}, pvs=pvs)


def test_the_check_accepts_and_rejects_pvs_by_the_api_rules() -> None:
    fits = {name for name, body in PVS.items() if satisfies(body, CLAIM, NODE)}
    assert fits == {"small", "big"}


def test_a_valid_plan_passes_and_each_kind_of_mistake_is_named() -> None:
    kube = KubeVolumes({"c": "small"}, frozenset())
    assert problems(VolumePlan("n1", (binding("small"),)), kube) == []
    assert any("not as small" in p for p in problems(VolumePlan("n1", (binding("big"),)), kube))
    assert any("does not fit" in p for p in problems(VolumePlan("n1", (binding("tiny"),)), kube))
    assert any("kube bound" in p for p in problems(None, kube))
    assert any(
        "not kube's node" in p for p in problems(VolumePlan("n2", (binding("small"),)), kube)
    )
    only = {k: v for k, v in PVS.items() if k != "big"}
    wrong = problems(VolumePlan("n1", (binding("elsewhere"),)), kube, only)
    assert any("only 'small' fits" in p for p in wrong)
