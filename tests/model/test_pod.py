"""Pod parsing: effective requests (init containers, sidecars, overhead, pod-level), the
non-zero scoring views, host ports, affinity terms, spread constraints and typed errors."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.model.errors import InvalidObjectError
from scheduler.model.pod import InclusionPolicy, Pod
from scheduler.model.resources import DEFAULT_MEMORY_REQUEST
from scheduler.model.selectors import Operator
from tests.builders import expr, make_pod

MI = 1024**2
GI = 1024**3


@pytest.mark.parametrize(
    ("pod", "expected"),
    [
        pytest.param(make_pod(), {}, id="no-requests"),
        pytest.param(make_pod(cpu="500m", memory="1Gi"), {"cpu": 500, "memory": GI}, id="one"),
        pytest.param(
            make_pod(cpu="100m").container("200m", "1Mi"),
            {"cpu": 300, "memory": MI},
            id="containers-sum",
        ),
        pytest.param(
            make_pod(cpu="1").init_container("3").init_container("2"),
            {"cpu": 3000},
            id="init-max-not-sum",
        ),
        pytest.param(
            make_pod(cpu="3").init_container("1").init_container("2"),
            {"cpu": 3000},
            id="containers-dominate-init",
        ),
        pytest.param(
            make_pod(cpu="1").init_container("500m", sidecar=True).init_container("2"),
            # The sidecar runs alongside the app (1 + 0.5) and during the later init (2 + 0.5).
            {"cpu": 2500},
            id="sidecar-adds-to-later-init",
        ),
        pytest.param(
            make_pod(cpu="1").init_container("2").init_container("500m", sidecar=True),
            # An init container before the sidecar does not overlap with it.
            {"cpu": 2000},
            id="init-before-sidecar",
        ),
        pytest.param(
            make_pod(cpu="1", memory="1Gi").overhead(cpu="250m", memory="100Mi"),
            {"cpu": 1250, "memory": GI + 100 * MI},
            id="overhead",
        ),
        pytest.param(
            make_pod(cpu="1", memory="1Gi").pod_resources(cpu="3"),
            {"cpu": 3000, "memory": GI},
            id="pod-level-overrides-cpu",
        ),
        pytest.param(
            make_pod(resources={"nvidia.com/gpu": "2", "hugepages-2Mi": "4Mi"}),
            {"nvidia.com/gpu": 2, "hugepages-2Mi": 4 * MI},
            id="scalar-resources",
        ),
        pytest.param(
            make_pod(resources={"pods": "1", "foo": "3", "ephemeral-storage": "1G"}),
            {"ephemeral-storage": 10**9},
            id="untracked-dropped",
        ),
        pytest.param(
            make_pod().container("400u").container("400u").container("400u"),
            {"cpu": 2},
            id="exact-sum-then-round",
        ),
        pytest.param(
            make_pod().container(limits={"cpu": "2", "memory": "1Gi"}),
            {"cpu": 2000, "memory": GI},
            id="requests-default-to-limits",
        ),
        pytest.param(
            make_pod().container("1", limits={"cpu": "2"}),
            {"cpu": 1000},
            id="explicit-request-kept",
        ),
    ],
)
def test_effective_requests(pod: Any, expected: dict[str, int]) -> None:
    assert dict(pod.build().resources.requests) == expected


def test_non_zero_requests_default_per_container() -> None:
    pod = make_pod(cpu="100m").container().init_container(memory="1Gi").build()
    # Two containers: 100m + 100m default cpu; memory 200Mi defaults, init peaks at 1Gi.
    assert pod.resources.non_zero_cpu == 200
    assert pod.resources.non_zero_memory == GI
    assert pod.resources.score_requests["cpu"] == 200


def test_explicit_zero_request_is_not_defaulted() -> None:
    pod = make_pod(cpu="0", memory="0").build()
    assert pod.resources.non_zero_cpu == 0
    assert pod.resources.non_zero_memory == 0


def test_pod_level_requests_only_default_missing_resources() -> None:
    pod = make_pod().container().pod_resources(cpu="2").build()
    assert pod.resources.non_zero_cpu == 2000
    assert pod.resources.non_zero_memory == DEFAULT_MEMORY_REQUEST


def test_in_place_resize_status_is_accounted() -> None:
    body = make_pod("p", cpu="1").obj()
    body["status"] = {
        "containerStatuses": [
            {
                "name": "c0",
                "resources": {"requests": {"cpu": "3"}},
                "allocatedResources": {"cpu": "2"},
            }
        ]
    }
    pod = Pod.from_api(body)
    assert pod.resources.requests["cpu"] == 1000
    assert pod.resources.accounted["cpu"] == 3000
    body["status"]["conditions"] = [{"type": "PodResizePending", "reason": "Infeasible"}]
    body["status"]["containerStatuses"][0]["resources"]["requests"]["cpu"] = "500m"
    infeasible = Pod.from_api(body)
    # An infeasible resize ignores the spec: max(status, allocated) = 2.
    assert infeasible.resources.accounted["cpu"] == 2000


def test_host_ports() -> None:
    pod = (
        make_pod()
        .host_port(80)
        .host_port(53, protocol="UDP", host_ip="10.0.0.1")
        .init_container(ports=[{"containerPort": 90, "hostPort": 90}])
        .init_container(sidecar=True, ports=[{"containerPort": 91, "hostPort": 91}])
        .container(ports=[{"containerPort": 8080}])
        .build()
    )
    ports = {(p.host_ip, p.protocol, p.port) for p in pod.host_ports}
    assert ports == {("0.0.0.0", "TCP", 80), ("10.0.0.1", "UDP", 53), ("0.0.0.0", "TCP", 91)}


def test_host_network_defaults_host_ports() -> None:
    body = make_pod().container(ports=[{"containerPort": 8080}]).obj()
    body["spec"]["hostNetwork"] = True
    assert [p.port for p in Pod.from_api(body).host_ports] == [8080]


def test_affinity_terms_namespaces() -> None:
    pod = (
        make_pod(namespace="team")
        .label("app", "web")
        .pod_affinity("zone", {"app": "db"})
        .pod_affinity("zone", {"app": "db"}, namespaces=["other"])
        .pod_affinity("zone", {"app": "db"}, namespace_selector={})
        .pod_anti_affinity("kubernetes.io/hostname", {"app": "web"}, match_label_keys=["app"])
        .pod_affinity("zone", {"app": "cache"}, weight=10, mismatch_label_keys=["app"])
        .build()
    )
    own, named, selected = pod.required_affinity
    assert own.namespaces == {"team"}
    assert named.namespaces == {"other"}
    assert selected.namespaces == frozenset()
    assert selected.namespace_selector.is_empty
    anti = pod.required_anti_affinity[0]
    assert anti.selector.matches({"app": "web"})
    assert not anti.selector.matches({"app": "db"})
    preferred = pod.preferred_affinity[0]
    assert preferred.weight == 10
    # mismatchLabelKeys adds app NotIn (web), which contradicts app=cache only for web pods.
    assert any(r.operator is Operator.NOT_IN for r in preferred.term.selector.requirements)
    assert pod.has_pod_affinity


def test_spread_constraint_defaults_and_match_label_keys() -> None:
    pod = (
        make_pod()
        .label("app", "web")
        .label("rev", "7")
        .spread(1, "zone", {"app": "web"}, match_label_keys=["rev", "absent"])
        .build()
    )
    (c,) = pod.spread_constraints
    assert c.min_domains == 1
    assert c.node_affinity_policy is InclusionPolicy.HONOR
    assert c.node_taints_policy is InclusionPolicy.IGNORE
    assert c.selector.matches({"app": "web", "rev": "7"})
    assert not c.selector.matches({"app": "web", "rev": "6"})


def test_preferred_node_terms_drop_empty() -> None:
    pod = (
        make_pod()
        .preferred_node_affinity(5)
        .preferred_node_affinity(3, expr("a", "Exists"))
        .build()
    )
    assert [t.weight for t in pod.preferred_node_affinity] == [3]


def test_misc_fields() -> None:
    pod = make_pod("p").priority(7).gate("wait").node_name("n1").terminating().build()
    assert (pod.priority, pod.scheduling_gates, pod.node_name, pod.terminating) == (
        7,
        ("wait",),
        "n1",
        True,
    )
    assert pod.scheduler_name == "default-scheduler"
    assert pod.key.startswith("uid-")


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        pytest.param(
            lambda b: b["spec"]["containers"][0].update(resources={"requests": {"cpu": "1x"}}),
            "spec.containers[0].resources.requests[cpu]",
            id="bad-quantity",
        ),
        pytest.param(
            lambda b: b["spec"]["containers"][0].update(resources={"requests": {"cpu": "-1"}}),
            "spec.containers[0].resources.requests[cpu]",
            id="negative-request",
        ),
        pytest.param(
            lambda b: b["spec"].update(
                affinity={
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [{"matchExpressions": [expr("gen", "Gt", "x")]}]
                        }
                    }
                }
            ),
            "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
            ".nodeSelectorTerms[0].matchExpressions[0].values[0]",
            id="gt-not-integer",
        ),
        pytest.param(
            lambda b: b["spec"].update(
                affinity={
                    "podAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": [
                            {
                                "labelSelector": {"matchExpressions": [expr("a", "Between", "1")]},
                                "topologyKey": "zone",
                            }
                        ]
                    }
                }
            ),
            "spec.affinity.podAffinity.requiredDuringSchedulingIgnoredDuringExecution[0]"
            ".labelSelector.matchExpressions[0].operator",
            id="bad-selector-operator",
        ),
        pytest.param(
            lambda b: b["spec"].update(
                affinity={
                    "podAntiAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": [{"labelSelector": {}}]
                    }
                }
            ),
            "spec.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution[0]"
            ".topologyKey",
            id="empty-topology-key",
        ),
        pytest.param(
            lambda b: b["spec"].update(
                topologySpreadConstraints=[
                    {"maxSkew": 0, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}
                ]
            ),
            "spec.topologySpreadConstraints[0].maxSkew",
            id="zero-max-skew",
        ),
        pytest.param(
            lambda b: b["spec"].update(
                topologySpreadConstraints=[
                    {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "Maybe"}
                ]
            ),
            "spec.topologySpreadConstraints[0].whenUnsatisfiable",
            id="bad-action",
        ),
        pytest.param(
            lambda b: b["spec"].update(tolerations=[{"key": "a", "operator": "Like"}]),
            "spec.tolerations[0].operator",
            id="bad-toleration-operator",
        ),
        pytest.param(
            lambda b: b["metadata"].update(labels={"a": 1}), "metadata.labels", id="label-type"
        ),
        pytest.param(lambda b: b["metadata"].pop("name"), "metadata.name", id="no-name"),
    ],
)
def test_invalid_pods_raise_typed_errors(mutate: Any, field: str) -> None:
    body = make_pod("p", cpu="1").obj()
    mutate(body)
    with pytest.raises(InvalidObjectError) as info:
        Pod.from_api(body)
    assert info.value.field == field
