"""DRA-backed extended resources (DRAExtendedResource): kube 1.37's mapping of names to
classes, its device requests and mappings per container, and the framework's verdicts on
device-plugin and DRA-only nodes."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from scheduler.core.dra.extended import (
    CANNOT_FIT,
    STALE,
    claim_body,
    requests_and_mappings,
    status_body,
)
from scheduler.core.dra.objects import DeviceClass, ResourceClaim, ResourceSlice
from scheduler.core.dra.state import DraState, placeholder_key
from scheduler.core.explain import Decision
from scheduler.core.framework import Code
from scheduler.core.plugins.dynamic_resources import CANNOT_ALLOCATE, stale_extended_claim
from scheduler.core.plugins.node_resources_fit import insufficient_reason
from scheduler.core.preemption import Inputs, preempt
from scheduler.core.profile import DEFAULT_PROFILE, Profile
from scheduler.core.schedule import Framework
from scheduler.model.pod import Pod
from tests.builders import PodBuilder, cluster, make_node, make_pod
from tests.core.dra.builders import claim, device, device_class, exactly, request, resource_slice

GPU = "example.com/gpu"
FRAMEWORK = Framework(DEFAULT_PROFILE)
KUBE_135 = Framework(dataclasses.replace(DEFAULT_PROFILE, kube_minor=35))


def gpu_class(name: str = "gpu", *, resource: str | None = GPU, created: str = "") -> DeviceClass:
    body = device_class(name)
    if resource is not None:
        body["spec"]["extendedResourceName"] = resource
    if created:
        body["metadata"]["creationTimestamp"] = created
    return DeviceClass.from_api(body)


def state(*, gpus_on: dict[str, int] | None = None, cls: DeviceClass | None = None) -> DraState:
    dra = DraState()
    dra.set_class(cls or gpu_class())
    for node, n in (gpus_on or {"dra": 8}).items():
        dra.set_slice(
            ResourceSlice.from_api(
                resource_slice(f"{node}-gpus", [device(f"gpu-{i}") for i in range(n)], node=node)
            )
        )
    return dra


NODES = [
    make_node("plugin", cpu="8", memory="16Gi").resource(GPU, 4),  # a device plugin's
    make_node("dra", cpu="8", memory="16Gi"),  # 8 devices in a ResourceSlice
    make_node("bare", cpu="8", memory="16Gi"),  # neither
]


def gpu_pod(name: str = "p", count: str = "2", *, resource: str = GPU) -> PodBuilder:
    return make_pod(name, cpu="100m", resources={resource: count}).uid(f"uid-{name}")


def schedule(
    pod: PodBuilder | Pod, dra: DraState | None, framework: Framework = FRAMEWORK
) -> Decision:
    built = pod.build() if isinstance(pod, PodBuilder) else pod
    return framework.schedule(cluster(NODES), built, dra=dra)


# -- which class serves a name -------------------------------------------------------


def test_a_class_serves_its_extended_resource_name_and_its_implicit_one() -> None:
    dra = state(cls=gpu_class("big"))
    assert dra.extended_class(GPU) == dra.classes["big"]
    assert dra.extended_class("deviceclass.resource.kubernetes.io/big") == dra.classes["big"]
    assert dra.extended_class("example.com/other") is None
    dra.remove_class("big")
    assert dra.extended_class(GPU) is None


def test_of_two_classes_naming_one_resource_the_newer_serves_it_then_the_lower_name() -> None:
    """DeviceClassSpec.ExtendedResourceName: the class created later is picked; of two
    created at the same time, the name sorted first (kube's extended resource cache)."""
    dra = DraState()
    dra.set_class(gpu_class("new", created="2026-01-02T00:00:00Z"))
    dra.set_class(gpu_class("old", created="2026-01-01T00:00:00Z"))
    assert dra.extended_class(GPU) == dra.classes["new"]
    dra.set_class(gpu_class("a-tie", created="2026-01-02T00:00:00Z"))
    assert dra.extended_class(GPU) == dra.classes["a-tie"]
    assert dra.extended_class("deviceclass.resource.kubernetes.io/new") == dra.classes["new"]
    dra.remove_class("a-tie")
    assert dra.extended_class(GPU) == dra.classes["new"]


# -- kube's createRequestsAndMappings ------------------------------------------------

CLASSES = {
    GPU: gpu_class("class"),
    f"{GPU}1": gpu_class("class1", resource=f"{GPU}1"),
    f"{GPU}init": gpu_class("classInit", resource=f"{GPU}init"),
    "deviceclass.resource.kubernetes.io/classInit": gpu_class("classInit", resource=None),
}


def pod_of(*containers: tuple[str, str, dict[str, str]]) -> Pod:
    """Containers as (kind, name, requests): kind "init", "sidecar" or "app"."""
    spec: dict[str, Any] = {"containers": [], "initContainers": []}
    for kind, name, requests in containers:
        body: dict[str, Any] = {"name": name, "resources": {"requests": requests}}
        if kind == "sidecar":
            body["restartPolicy"] = "Always"
        spec["containers" if kind == "app" else "initContainers"].append(body)
    return Pod.from_api({"metadata": {"name": "p", "uid": "u"}, "spec": spec})


def requests_of(pod: Pod, resources: set[str]) -> list[tuple[str, str, int]]:
    made, _ = requests_and_mappings(pod, resources, CLASSES)
    return [(r.name, r.exactly.device_class, r.exactly.count) for r in made if r.exactly]


def mappings_of(pod: Pod, resources: set[str]) -> list[tuple[str, str, str]]:
    _, mappings = requests_and_mappings(pod, resources, CLASSES)
    return sorted((m.request, m.container, m.resource) for m in mappings)


ONE = pod_of(("app", "con0", {GPU: "1", f"{GPU}1": "2"}))
TWO = pod_of(("app", "con0", {GPU: "1"}), ("app", "con1", {f"{GPU}1": "2"}))
INIT = pod_of(("init", "init-con0", {f"{GPU}init": "2"}), ("app", "con0", {GPU: "1"}))
INIT2 = pod_of(
    ("init", "init-con0", {f"{GPU}init": "1"}),
    ("init", "init-con1", {f"{GPU}init": "2"}),
    ("app", "con0", {GPU: "1"}),
)
INIT3 = pod_of(
    ("init", "init-con0", {f"{GPU}init": "1"}),
    ("sidecar", "sidecar-con1", {f"{GPU}init": "1"}),
    ("init", "init-con2", {f"{GPU}init": "2"}),
    ("app", "con0", {GPU: "1"}),
)


@pytest.mark.parametrize(
    ("pod", "resources", "want"),
    [
        pytest.param(ONE, set(), [], id="nil"),
        pytest.param(ONE, {GPU}, [("container-0-request-0", "class", 1)], id="one-match"),
        pytest.param(
            ONE,
            {GPU, f"{GPU}1"},
            [("container-0-request-0", "class", 1), ("container-0-request-1", "class1", 2)],
            id="two-resources",
        ),
        pytest.param(
            TWO,
            {GPU, f"{GPU}1"},
            [("container-0-request-0", "class", 1), ("container-1-request-0", "class1", 2)],
            id="two-containers",
        ),
        pytest.param(
            INIT,
            {GPU, f"{GPU}init"},
            [("container-0-request-0", "classInit", 2), ("container-1-request-0", "class", 1)],
            id="init-and-regular",
        ),
        pytest.param(
            INIT2,
            {GPU, f"{GPU}init"},
            [("container-1-request-0", "classInit", 2), ("container-2-request-0", "class", 1)],
            id="two-inits-the-largest-kept",
        ),
        pytest.param(
            INIT3,
            {GPU, f"{GPU}init"},
            [
                ("container-1-request-0", "classInit", 1),
                ("container-2-request-0", "classInit", 2),
                ("container-3-request-0", "class", 1),
            ],
            id="a-sidecar-serves-the-init-before-it",
        ),
    ],
)
def test_requests_as_kube_makes_them(
    pod: Pod, resources: set[str], want: list[tuple[str, str, int]]
) -> None:
    """kube's Test_createRequestsAndMappings_requests, case by case."""
    assert requests_of(pod, resources) == want


def test_mappings_as_kube_makes_them() -> None:
    """kube's Test_createRequestsAndMappings_mappings (sorted by request, container)."""
    implicit = "deviceclass.resource.kubernetes.io/classInit"
    assert mappings_of(ONE, {GPU, f"{GPU}1"}) == [
        ("container-0-request-0", "con0", GPU),
        ("container-0-request-1", "con0", f"{GPU}1"),
    ]
    assert mappings_of(TWO, {GPU, f"{GPU}1"}) == [
        ("container-0-request-0", "con0", GPU),
        ("container-1-request-0", "con1", f"{GPU}1"),
    ]
    assert mappings_of(INIT, {GPU, f"{GPU}init"}) == [
        ("container-0-request-0", "init-con0", f"{GPU}init"),
        ("container-1-request-0", "con0", GPU),
    ]
    # the smaller init request is mapped to the larger one, which is the only one made
    assert mappings_of(INIT2, {GPU, f"{GPU}init"}) == [
        ("container-1-request-0", "init-con0", f"{GPU}init"),
        ("container-1-request-0", "init-con1", f"{GPU}init"),
        ("container-2-request-0", "con0", GPU),
    ]
    assert mappings_of(INIT3, {GPU, f"{GPU}init"}) == [
        ("container-1-request-0", "init-con0", f"{GPU}init"),
        ("container-1-request-0", "sidecar-con1", f"{GPU}init"),
        ("container-2-request-0", "init-con2", f"{GPU}init"),
        ("container-3-request-0", "con0", GPU),
    ]
    both = pod_of(("init", "init-con0", {f"{GPU}init": "1", implicit: "2"}))
    assert mappings_of(both, {f"{GPU}init", implicit}) == [
        ("container-0-request-0", "init-con0", implicit),
        ("container-0-request-1", "init-con0", f"{GPU}init"),
    ]


def test_only_pods_asking_for_a_name_a_class_may_serve_keep_their_containers() -> None:
    assert make_pod("plain", cpu="1").build().container_requests == ()
    (only,) = gpu_pod(count="3").build().container_requests
    assert (only.index, only.short_lived, only.names, dict(only.counts)) == (
        0,
        False,
        ("cpu", GPU),
        {GPU: 3},
    )


# -- the framework: Fit and DynamicResources ---------------------------------------


def test_a_dra_only_node_serves_the_resource_and_a_device_plugin_node_fits_it() -> None:
    decision = schedule(gpu_pod(), state())
    assert set(decision.feasible) == {"plugin", "dra"}
    bare = decision.explanation.node("bare")
    assert (bare.plugin, bare.reasons) == ("DynamicResources", (CANNOT_ALLOCATE,))


def test_the_plan_on_a_dra_node_creates_the_claim_with_two_devices() -> None:
    pod = gpu_pod().build()
    dra = state()
    decision = FRAMEWORK.schedule(cluster([NODES[1]]), pod, dra=dra)
    assert decision.selected == "dra"
    plan = decision.claim_plan
    assert plan is not None
    (write,) = plan.writes
    assert (write.namespace, write.name) == placeholder_key("default", "uid-p")
    assert write.create is not None
    results = write.allocation["devices"]["results"]  # type: ignore[index]
    assert [(r["request"], r["device"]) for r in results] == [
        ("container-0-request-1", "gpu-0"),
        ("container-0-request-1", "gpu-1"),
    ]
    assert write.create.body == {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "generateName": "p-extended-resources-",
            "namespace": "default",
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "uid-p", "controller": True}
            ],
            "annotations": {"resource.kubernetes.io/extended-resource-claim": "true"},
        },
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "container-0-request-1",
                        "exactly": {
                            "deviceClassName": "gpu",
                            "allocationMode": "ExactCount",
                            "count": 2,
                        },
                    }
                ]
            }
        },
    }
    assert write.create.mappings == (
        {"containerName": "c0", "resourceName": GPU, "requestName": "container-0-request-1"},
    )
    assert status_body("p-extended-resources-x7k2q", write.create.mappings) == {
        "extendedResourceClaimStatus": {
            "requestMappings": [
                {"containerName": "c0", "resourceName": GPU, "requestName": "container-0-request-1"}
            ],
            "resourceClaimName": "p-extended-resources-x7k2q",
        }
    }
    assert claim_body(pod, ())["spec"] == {"devices": {"requests": []}}


def test_a_device_plugin_node_needs_no_claim() -> None:
    decision = FRAMEWORK.schedule(cluster([NODES[0]]), gpu_pod().build(), dra=state())
    assert decision.selected == "plugin"
    assert decision.claim_plan is not None
    assert decision.claim_plan.writes == ()


def test_fit_still_checks_the_device_plugin_node() -> None:
    """Mixed clusters: a node whose allocatable has the resource is NodeResourcesFit's,
    mapped or not; only nodes without it are DynamicResources'."""
    decision = schedule(gpu_pod(count="6"), state())
    plugin = decision.explanation.node("plugin")
    assert (plugin.plugin, plugin.reasons) == ("NodeResourcesFit", (insufficient_reason(GPU),))
    assert decision.selected == "dra"


def test_the_implicit_name_is_served_too() -> None:
    implicit = "deviceclass.resource.kubernetes.io/gpu"
    decision = schedule(gpu_pod(resource=implicit), state(cls=gpu_class(resource=None)))
    assert decision.selected == "dra"


def test_in_kube_135_the_feature_is_off_and_the_resource_is_insufficient() -> None:
    decision = schedule(gpu_pod(), state(), KUBE_135)
    assert decision.feasible == ("plugin",)
    for name in ("dra", "bare"):
        verdict = decision.explanation.node(name)
        assert (verdict.plugin, verdict.reasons) == (
            "NodeResourcesFit",
            (insufficient_reason(GPU),),
        )


def test_without_a_class_the_resource_is_an_ordinary_extended_resource() -> None:
    dra = state(cls=DeviceClass.from_api(device_class("gpu")))  # no extendedResourceName
    decision = schedule(gpu_pod(), dra)
    assert decision.feasible == ("plugin",)
    assert decision.explanation.node("dra").reasons == (insufficient_reason(GPU),)


def test_an_assumed_claim_takes_its_devices_from_the_next_pod() -> None:
    dra = state(gpus_on={"dra": 3})
    first = FRAMEWORK.schedule(cluster([NODES[1]]), gpu_pod("a").build(), dra=dra)
    assert first.claim_plan is not None
    dra.assume(first.claim_plan)
    second = FRAMEWORK.schedule(cluster([NODES[1]]), gpu_pod("b").build(), dra=dra)
    assert second.selected is None
    assert second.explanation.node("dra").reasons == (CANNOT_ALLOCATE,)
    dra.forget(first.claim_plan)
    assert FRAMEWORK.schedule(cluster([NODES[1]]), gpu_pod("b").build(), dra=dra).selected


def test_a_pod_with_a_claim_of_its_own_and_an_extended_resource_allocates_both() -> None:
    dra = state()
    dra.set_claim(ResourceClaim.from_api(claim("own", request("one", exactly("gpu")))))
    pod = gpu_pod()
    pod.body["spec"]["resourceClaims"] = [{"name": "own", "resourceClaimName": "own"}]
    decision = FRAMEWORK.schedule(cluster([NODES[1]]), pod.build(), dra=dra)
    assert decision.claim_plan is not None
    own, made = decision.claim_plan.writes
    assert (own.name, own.create, made.create is not None) == ("own", None, True)
    devices = [
        r["device"]
        for w in (own, made)
        for r in w.allocation["devices"]["results"]  # type: ignore[index]
    ]
    assert len(set(devices)) == 3


def stale_claim(pod: Pod, **status: Any) -> dict[str, Any]:
    body = claim("p-extended-resources-abcde", request("container-0-request-1", exactly("gpu")))
    body["metadata"]["annotations"] = {"resource.kubernetes.io/extended-resource-claim": "true"}
    body["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "Pod", "name": pod.name, "uid": pod.uid, "controller": True}
    ]
    if status:
        body["status"] = status
    return body


def test_a_claim_left_by_an_earlier_attempt_fails_every_node_until_deleted() -> None:
    pod = gpu_pod().build()
    dra = state()
    dra.set_claim(ResourceClaim.from_api(stale_claim(pod)))
    decision = schedule(pod, dra)
    assert decision.selected is None
    for name in ("plugin", "dra"):
        verdict = decision.explanation.node(name)
        assert (verdict.plugin, verdict.reasons, verdict.code) == (
            "DynamicResources",
            (STALE,),
            Code.UNSCHEDULABLE_AND_UNRESOLVABLE,
        )
    found = stale_extended_claim(pod, dra)
    assert found is not None
    assert found.name == "p-extended-resources-abcde"
    assert stale_extended_claim(pod, dra, enabled=False) is None
    other = dataclasses.replace(pod, uid="another-incarnation")
    assert stale_extended_claim(other, dra) is None
    dra.remove_claim("default", "p-extended-resources-abcde")
    assert schedule(pod, dra).selected is not None


def test_a_resource_neither_the_node_nor_a_class_provides_cannot_fit() -> None:
    """Where NodeResourcesFit ignores a resource, DynamicResources still says no."""
    fit = dataclasses.replace(
        DEFAULT_PROFILE.node_resources_fit, ignored_resources=frozenset({"example.com/nic"})
    )
    framework = Framework(Profile(name="ignores", node_resources_fit=fit))
    pod = make_pod("p", cpu="100m", resources={GPU: "1", "example.com/nic": "1"}).uid("u")
    decision = framework.schedule(cluster(NODES), pod.build(), dra=state())
    verdict = decision.explanation.node("dra")
    assert (verdict.plugin, verdict.reasons) == ("DynamicResources", (CANNOT_FIT,))


def test_without_dynamic_resources_in_the_profile_fit_checks_every_node() -> None:
    """Nothing would allocate the devices: the resource stays NodeResourcesFit's."""
    filters = tuple(f for f in DEFAULT_PROFILE.filters if f != "DynamicResources")
    decision = schedule(gpu_pod(), state(), Framework(Profile(name="no-dra", filters=filters)))
    assert decision.feasible == ("plugin",)
    assert decision.explanation.node("dra").reasons == (insufficient_reason(GPU),)


def test_a_higher_priority_pod_preempts_the_holder_of_an_extended_resource_claim() -> None:
    """The victim holds the node's devices through the claim made for its extended
    resources (no spec.resourceClaims): its eviction frees them in the dry run, and the
    node without the resource in allocatable is not screened out by its count."""
    dra = state(gpus_on={"dra": 2})
    low = gpu_pod("low").priority(1).build()
    made = stale_claim(low)
    results = [
        {
            "request": "container-0-request-1",
            "driver": "gpu.example.com",
            "pool": "dra",
            "device": d,
        }
        for d in ("gpu-0", "gpu-1")
    ]
    made["status"] = {
        "allocation": {"devices": {"results": results}},
        "reservedFor": [{"resource": "pods", "name": "low", "uid": low.uid}],
    }
    dra.set_claim(ResourceClaim.from_api(made))
    snapshot = cluster([NODES[1]], [(low, "dra")])
    high = gpu_pod("high").priority(10).build()
    decision = FRAMEWORK.schedule(snapshot, high, dra=dra)
    verdict = decision.explanation.node("dra")
    assert (verdict.reasons, verdict.code) == ((CANNOT_ALLOCATE,), Code.UNSCHEDULABLE)
    result = preempt(FRAMEWORK, snapshot, decision, Inputs(dra=dra))
    assert result is not None
    assert (result.node, [v.name for v in result.victims]) == ("dra", ["low"])
    assert len(dra.allocated_devices()) == 2  # the dry run put them back
