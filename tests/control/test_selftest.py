"""`lattice selftest`'s probe pod and its flags (the real run is in tests/devcluster)."""

from __future__ import annotations

from scheduler.cli import build_parser
from scheduler.control.selftest import PROBE_PREFIX, probe_pod


def test_the_probe_meets_pod_security_restricted_and_asks_for_our_scheduler() -> None:
    pod = probe_pod("lattice-gpu", "img:1", "Never")
    spec = pod["spec"]
    assert pod["metadata"]["generateName"] == PROBE_PREFIX
    assert spec["schedulerName"] == "lattice-gpu"
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = spec["containers"]
    assert container["image"] == "img:1"
    assert container["imagePullPolicy"] == "Never"
    ctx = container["securityContext"]
    assert ctx["allowPrivilegeEscalation"] is False
    assert ctx["capabilities"] == {"drop": ["ALL"]}
    assert spec["automountServiceAccountToken"] is False


def test_the_command_takes_the_charts_arguments() -> None:
    args = build_parser().parse_args(
        ["selftest", "--namespace=ns", "--service=svc", "--port=1", "--image=i", "--timeout=5"]
    )
    assert (args.command, args.namespace, args.service, args.port, args.timeout) == (
        "selftest",
        "ns",
        "svc",
        1,
        5.0,
    )
