"""NodeResourcesFit filter, ported from kube-scheduler's TestEnoughRequests/TestNotEnoughRequests
and TestStorageRequests: reasons, several reasons per node, and status codes."""

from __future__ import annotations

import pytest

from scheduler.core.framework import Code
from scheduler.core.plugins import node_resources_fit
from scheduler.core.profile import NodeResourcesFitArgs, Profile
from scheduler.core.schedule import Framework
from tests.builders import NodeBuilder, PodBuilder, make_node, make_pod
from tests.core.support import only_filter, reasons, run

FIT = node_resources_fit.NAME
EXT = "example.com/aaa"
HUGE = "hugepages-2Mi"


def node_10_20() -> NodeBuilder:
    # Allocatable cpu 10m, memory 20 bytes, 32 pods, 5 of the extended resource and hugepages.
    return (
        make_node("n", cpu="10m", memory="20", pods=32)
        .resource(EXT, "5")
        .resource(HUGE, "5")
        .resource("ephemeral-storage", "20")
    )


def used(cpu_m: int, memory: int, **extra: str) -> PodBuilder:
    return make_pod("used", cpu=f"{cpu_m}m", memory=str(memory), resources=extra or None)


def insufficient(*names: str) -> tuple[str, ...]:
    return tuple(f"Insufficient {n}" for n in names)


@pytest.mark.parametrize(
    ("pod", "existing", "expected", "code"),
    [
        pytest.param(make_pod(), used(10, 20), (), None, id="no-resources-requested-always-fits"),
        pytest.param(
            make_pod(cpu="1m", memory="1"),
            used(10, 20),
            insufficient("cpu", "memory"),
            Code.UNSCHEDULABLE,
            id="too-many-resources-both-reasons",
        ),
        pytest.param(
            make_pod(cpu="1m", memory="1").init_container("3m", "1"),
            used(8, 19),
            insufficient("cpu"),
            Code.UNSCHEDULABLE,
            id="init-container-cpu",
        ),
        pytest.param(
            make_pod(cpu="1m", memory="1").init_container("3m", "1").init_container("2m", "1"),
            used(8, 19),
            insufficient("cpu"),
            Code.UNSCHEDULABLE,
            id="highest-init-container-cpu",
        ),
        pytest.param(
            make_pod(cpu="1m", memory="1").init_container("1m", "3"),
            used(9, 19),
            insufficient("memory"),
            Code.UNSCHEDULABLE,
            id="init-container-memory",
        ),
        pytest.param(
            make_pod(cpu="1m", memory="1").init_container("1m", "1"),
            used(9, 19),
            (),
            None,
            id="init-is-max-not-sum",
        ),
        pytest.param(make_pod(cpu="1m", memory="1"), used(5, 5), (), None, id="both-fit"),
        pytest.param(
            make_pod(cpu="2m", memory="1"),
            used(9, 5),
            insufficient("cpu"),
            Code.UNSCHEDULABLE,
            id="memory-fits-cpu-not",
        ),
        pytest.param(make_pod(cpu="5m", memory="1"), used(5, 19), (), None, id="equal-edge"),
        pytest.param(
            make_pod(cpu="4m", memory="1").init_container("5m", "1"),
            used(5, 19),
            (),
            None,
            id="equal-edge-init",
        ),
        pytest.param(make_pod(resources={EXT: "1"}), used(0, 0), (), None, id="extended-fits"),
        pytest.param(
            make_pod(cpu="1m", memory="1", resources={EXT: "10"}),
            used(0, 0),
            insufficient(EXT),
            Code.UNSCHEDULABLE_AND_UNRESOLVABLE,
            id="extended-capacity-enforced",
        ),
        pytest.param(
            make_pod(cpu="1m", memory="1", resources={EXT: "1"}),
            used(0, 0, **{EXT: "5"}),
            insufficient(EXT),
            Code.UNSCHEDULABLE,
            id="extended-allocatable-enforced",
        ),
        pytest.param(
            make_pod()
            .container("1m", "1", resources={EXT: "3"})
            .container("1m", "1", resources={EXT: "3"}),
            used(0, 0, **{EXT: "2"}),
            insufficient(EXT),
            Code.UNSCHEDULABLE_AND_UNRESOLVABLE,
            id="extended-multiple-containers",
        ),
        pytest.param(
            make_pod()
            .init_container("1m", "1", resources={EXT: "3"})
            .init_container("1m", "1", resources={EXT: "3"}),
            used(0, 0, **{EXT: "2"}),
            (),
            None,
            id="extended-multiple-init-containers-admitted",
        ),
        pytest.param(
            make_pod(cpu="1m", memory="1", resources={"example.com/unknown": "1"}),
            used(0, 0),
            insufficient("example.com/unknown"),
            Code.UNSCHEDULABLE_AND_UNRESOLVABLE,
            id="resource-the-node-lacks",
        ),
        pytest.param(
            make_pod(cpu="1m", memory="1", resources={"kubernetes.io/something": "10"}),
            used(0, 0),
            insufficient("kubernetes.io/something"),
            Code.UNSCHEDULABLE_AND_UNRESOLVABLE,
            id="kubernetes-io-resource",
        ),
        pytest.param(
            make_pod(cpu="1m", memory="1", resources={HUGE: "10"}),
            used(0, 0),
            insufficient(HUGE),
            Code.UNSCHEDULABLE_AND_UNRESOLVABLE,
            id="hugepages-capacity",
        ),
        pytest.param(
            make_pod()
            .container("1m", "1", resources={HUGE: "3"})
            .container("1m", "1", resources={HUGE: "3"}),
            used(0, 0, **{HUGE: "2"}),
            insufficient(HUGE),
            Code.UNSCHEDULABLE_AND_UNRESOLVABLE,
            id="hugepages-multiple-containers",
        ),
        pytest.param(
            make_pod(cpu="1m", memory="1").overhead(cpu="3m", memory="13"),
            used(5, 5),
            (),
            None,
            id="requests-plus-overhead-fit",
        ),
        pytest.param(
            make_pod(cpu="1m", memory="1").overhead(cpu="1m", memory="15"),
            used(5, 5),
            insufficient("memory"),
            Code.UNSCHEDULABLE,
            id="requests-plus-overhead-do-not-fit",
        ),
        pytest.param(
            make_pod(cpu="1m", memory="1", resources={EXT: "0"}),
            used(0, 0),
            (),
            None,
            id="zero-quantity-not-checked",
        ),
        pytest.param(
            make_pod(resources={"ephemeral-storage": "25"}),
            used(0, 0),
            insufficient("ephemeral-storage"),
            Code.UNSCHEDULABLE_AND_UNRESOLVABLE,
            id="ephemeral-storage-exceeds-allocatable",
        ),
        pytest.param(
            make_pod(resources={"ephemeral-storage": "10"}),
            used(0, 0, **{"ephemeral-storage": "10"}),
            (),
            None,
            id="ephemeral-storage-sufficient",
        ),
        pytest.param(
            make_pod().container("1m", "1").pod_resources(cpu="11m"),
            used(0, 0),
            insufficient("cpu"),
            Code.UNSCHEDULABLE_AND_UNRESOLVABLE,
            id="pod-level-cpu-does-not-fit",
        ),
    ],
)
def test_fit(
    pod: PodBuilder, existing: PodBuilder, expected: tuple[str, ...], code: Code | None
) -> None:
    decision = run(only_filter(FIT), pod, [node_10_20()], [(existing, "n")])
    assert set(reasons(decision)["n"]) == set(expected)
    if code is not None:
        assert decision.explanation.node("n").code is code


@pytest.mark.parametrize(
    ("pod", "expected"),
    [
        pytest.param(make_pod(), ("Too many pods",), id="no-requests-but-no-room"),
        pytest.param(
            make_pod(cpu="1m", memory="1"), ("Too many pods",), id="fits-but-no-room-for-a-pod"
        ),
        pytest.param(
            make_pod(cpu="10m", memory="20").init_container("11m", "1"),
            ("Too many pods", "Insufficient cpu"),
            id="no-room-and-insufficient-cpu",
        ),
    ],
)
def test_too_many_pods(pod: PodBuilder, expected: tuple[str, ...]) -> None:
    node = make_node("n", cpu="10m", memory="20", pods=1)
    decision = run(only_filter(FIT), pod, [node], [(make_pod("existing"), "n")])
    assert reasons(decision)["n"] == expected


def test_node_without_pods_allocatable_fits_nothing() -> None:
    decision = run(only_filter(FIT), make_pod(), [make_node("n", pods=None)])
    assert reasons(decision)["n"] == ("Too many pods",)


def test_ignored_extended_resources() -> None:
    framework = Framework(
        Profile(
            name="ignore",
            filters=(FIT,),
            scores=(),
            node_resources_fit=NodeResourcesFitArgs(
                ignored_resources=frozenset({EXT}), ignored_resource_groups=frozenset({"vendor.io"})
            ),
        )
    )
    pod = make_pod(resources={EXT: "100", "vendor.io/thing": "1", "other.io/x": "1"})
    decision = run(framework, pod, [make_node("n")])
    assert reasons(decision)["n"] == ("Insufficient other.io/x",)


def test_gpu_reason_and_counting() -> None:
    nodes = [make_node(f"gpu{i}").resource("nvidia.com/gpu", "1") for i in range(2)]
    nodes += [make_node("cpu0")]
    decision = run(only_filter(FIT), make_pod(resources={"nvidia.com/gpu": "2"}), nodes)
    assert decision.reason_counts() == {"Insufficient nvidia.com/gpu": 3}
