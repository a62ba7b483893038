"""NodeUnschedulable, NodeName, TaintToleration and NodePorts filters (ported cases from
kube-scheduler's node_unschedulable_test, node_name_test, taint_toleration_test and
node_ports_test)."""

from __future__ import annotations

import pytest

from scheduler.core.framework import Code
from scheduler.core.plugins import node_name, node_ports, node_unschedulable, taint_toleration
from tests.builders import NodeBuilder, PodBuilder, make_node, make_pod
from tests.core.support import only_filter, reasons, run

UNSCHEDULABLE = node_unschedulable.REASON
TAINTED = taint_toleration.REASON
PORTS = node_ports.REASON


@pytest.mark.parametrize(
    ("pod", "node", "rejected"),
    [
        pytest.param(make_pod(), make_node("n"), False, id="schedulable-node"),
        pytest.param(make_pod(), make_node("n").unschedulable(), True, id="cordoned"),
        pytest.param(
            make_pod().toleration("node.kubernetes.io/unschedulable", effect="NoSchedule"),
            make_node("n").unschedulable(),
            False,
            id="tolerates-unschedulable-taint",
        ),
        pytest.param(
            make_pod().toleration(operator="Exists"),
            make_node("n").unschedulable(),
            False,
            id="tolerates-everything",
        ),
        pytest.param(
            make_pod().toleration("node.kubernetes.io/unschedulable", effect="NoExecute"),
            make_node("n").unschedulable(),
            True,
            id="wrong-effect",
        ),
    ],
)
def test_node_unschedulable(pod: PodBuilder, node: NodeBuilder, rejected: bool) -> None:
    decision = run(only_filter(node_unschedulable.NAME), pod, [node])
    assert reasons(decision)["n"] == ((UNSCHEDULABLE,) if rejected else ())
    if rejected:
        assert decision.code is Code.UNSCHEDULABLE_AND_UNRESOLVABLE


@pytest.mark.parametrize(
    ("pod", "feasible"),
    [
        pytest.param(make_pod(), ("a", "b"), id="no-node-name"),
        pytest.param(make_pod().node_name("a"), ("a",), id="names-a"),
        pytest.param(make_pod().node_name("zzz"), (), id="names-unknown"),
    ],
)
def test_node_name(pod: PodBuilder, feasible: tuple[str, ...]) -> None:
    decision = run(only_filter(node_name.NAME), pod, [make_node("a"), make_node("b")])
    assert decision.feasible == feasible
    for name, why in reasons(decision).items():
        assert why == (() if name in feasible else (node_name.REASON,))


@pytest.mark.parametrize(
    ("pod", "node", "rejected"),
    [
        pytest.param(make_pod(), make_node("n"), False, id="no-taints"),
        pytest.param(
            make_pod(), make_node("n").taint("dedicated", "user1"), True, id="untolerated"
        ),
        pytest.param(
            make_pod().toleration("dedicated", "user1", "NoSchedule"),
            make_node("n").taint("dedicated", "user1"),
            False,
            id="tolerated-equal",
        ),
        pytest.param(
            make_pod().toleration("dedicated", "user2", "NoSchedule"),
            make_node("n").taint("dedicated", "user1"),
            True,
            id="different-value",
        ),
        pytest.param(
            make_pod().toleration("dedicated", effect="NoSchedule", operator="Exists"),
            make_node("n").taint("dedicated", "user1"),
            False,
            id="exists-operator",
        ),
        pytest.param(
            make_pod().toleration("dedicated", "user1"),
            make_node("n").taint("dedicated", "user1", "NoExecute"),
            False,
            id="empty-effect-matches-all-effects",
        ),
        pytest.param(
            make_pod().toleration("dedicated", "user1", "NoSchedule"),
            make_node("n").taint("dedicated", "user1", "NoExecute"),
            True,
            id="noexecute-needs-its-own-toleration",
        ),
        pytest.param(
            make_pod(),
            make_node("n").taint("dedicated", "user1", "PreferNoSchedule"),
            False,
            id="prefer-no-schedule-does-not-filter",
        ),
        pytest.param(
            make_pod().toleration("foo", "bar", "NoSchedule"),
            make_node("n").taint("foo", "bar").taint("baz", "qux"),
            True,
            id="one-of-two-taints-untolerated",
        ),
        pytest.param(
            make_pod().toleration(operator="Exists"),
            make_node("n").taint("foo", "bar").taint("baz", "qux", "NoExecute"),
            False,
            id="empty-key-exists-tolerates-all",
        ),
    ],
)
def test_taint_toleration_filter(pod: PodBuilder, node: NodeBuilder, rejected: bool) -> None:
    decision = run(only_filter(taint_toleration.NAME), pod, [node])
    assert reasons(decision)["n"] == ((TAINTED,) if rejected else ())


def _port(spec: str) -> tuple[int, str, str]:
    protocol, ip, port = spec.split("/")
    return int(port), protocol, ip


def _with_ports(builder: PodBuilder, *specs: str) -> PodBuilder:
    for spec in specs:
        port, protocol, ip = _port(spec)
        builder.host_port(port, protocol, ip)
    return builder


@pytest.mark.parametrize(
    ("wanted", "used", "rejected"),
    [
        pytest.param((), (), False, id="nothing"),
        pytest.param(("UDP/127.0.0.1/8080",), ("UDP/127.0.0.1/9090",), False, id="other-port"),
        pytest.param(("UDP/127.0.0.1/8080",), ("UDP/127.0.0.1/8080",), True, id="same-udp-port"),
        pytest.param(("TCP/127.0.0.1/8080",), ("TCP/127.0.0.1/8080",), True, id="same-tcp-port"),
        pytest.param(("TCP/127.0.0.1/8080",), ("TCP/127.0.0.2/8080",), False, id="other-host-ip"),
        pytest.param(("UDP/127.0.0.1/8080",), ("TCP/127.0.0.1/8080",), False, id="other-protocol"),
        pytest.param(
            ("UDP/127.0.0.1/8000", "UDP/127.0.0.1/8080"),
            ("UDP/127.0.0.1/8080",),
            True,
            id="second-udp-port-conflict",
        ),
        pytest.param(
            ("TCP/127.0.0.1/8001", "UDP/127.0.0.1/8080"),
            ("TCP/127.0.0.1/8001", "UDP/127.0.0.1/8081"),
            True,
            id="first-tcp-port-conflict",
        ),
        pytest.param(
            ("TCP/0.0.0.0/8001",), ("TCP/127.0.0.1/8001",), True, id="wanted-bind-all-conflicts"
        ),
        pytest.param(
            ("TCP/10.0.10.10/8001", "TCP/0.0.0.0/8001"),
            ("TCP/127.0.0.1/8001",),
            True,
            id="one-wanted-bind-all-conflicts",
        ),
        pytest.param(
            ("TCP/127.0.0.1/8001",), ("TCP/0.0.0.0/8001",), True, id="used-bind-all-conflicts"
        ),
        pytest.param(
            ("UDP/127.0.0.1/8001",), ("TCP/0.0.0.0/8001",), False, id="bind-all-other-protocol"
        ),
        pytest.param(
            ("UDP/127.0.0.1/8001",),
            ("TCP/0.0.0.0/8001", "UDP/0.0.0.0/8001"),
            True,
            id="udp-bind-all-conflict",
        ),
    ],
)
def test_node_ports(wanted: tuple[str, ...], used: tuple[str, ...], rejected: bool) -> None:
    existing = _with_ports(make_pod("existing"), *used)
    decision = run(
        only_filter(node_ports.NAME),
        _with_ports(make_pod("p"), *wanted),
        [make_node("n")],
        [(existing, "n")],
    )
    assert reasons(decision)["n"] == ((PORTS,) if rejected else ())
    if rejected:
        assert decision.code is Code.UNSCHEDULABLE


def test_node_ports_skip_and_sidecars() -> None:
    existing = _with_ports(make_pod("existing"), "TCP/0.0.0.0/8001")
    plain_init = make_pod("p").init_container(
        ports=[{"containerPort": 8001, "hostPort": 8001, "protocol": "TCP"}]
    )
    decision = run(only_filter(node_ports.NAME), plain_init, [make_node("n")], [(existing, "n")])
    assert decision.feasible == ("n",)
    assert node_ports.NAME in decision.explanation.skipped_filters
    sidecar = make_pod("p").init_container(
        sidecar=True, ports=[{"containerPort": 8001, "hostPort": 8001, "protocol": "TCP"}]
    )
    decision = run(only_filter(node_ports.NAME), sidecar, [make_node("n")], [(existing, "n")])
    assert reasons(decision)["n"] == (PORTS,)


def test_node_ports_freed_when_pod_removed() -> None:
    from tests.builders import cluster

    existing = _with_ports(make_pod("existing"), "TCP/0.0.0.0/80").build()
    snapshot = cluster([make_node("n")], [(existing, "n")])
    pod = _with_ports(make_pod("p"), "TCP/0.0.0.0/80").build()
    framework = only_filter(node_ports.NAME)
    assert framework.schedule(snapshot, pod).feasible == ()
    snapshot.remove_pod(existing)
    assert framework.schedule(snapshot, pod).feasible == ("n",)
