"""`lattice run` and `lattice agent` that cannot start say why in one line and exit non-zero,
never with a traceback: the real commands, as processes, against a real API server.

CRDs are cluster-wide and other tests install ours on the suite's control plane, so the
missing-CRD cases run on a small control plane of their own that never gets them.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from lattice_dev.devcluster.cluster import ClusterConfig, DevCluster
from lattice_dev.devcluster.process import free_port

pytestmark = pytest.mark.cluster


@dataclass
class Outcome:
    code: int
    stdout: str
    stderr: str
    seconds: float

    def refused(self, code: int = 1) -> str:
        """Assert a clean refusal and return its one line (beside JSON log lines such as
        the release read at start, which a refusal may follow)."""
        assert "Traceback" not in self.stdout + self.stderr, self.stderr
        lines = [ln for ln in self.stderr.strip().splitlines() if not ln.startswith("{")]
        assert len(lines) == 1, self.stderr
        assert self.code == code, (self.code, self.stderr)
        assert lines[0].startswith("lattice"), lines[0]
        return lines[0]


def lattice(*args: str, env: dict[str, str] | None = None, timeout: float = 90) -> Outcome:
    started = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "scheduler.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        stdin=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
    )
    return Outcome(out.returncode, out.stdout, out.stderr, time.monotonic() - started)


def run_flags(kubeconfig: Path, *extra: str) -> list[str]:
    return [
        "run",
        "--kubeconfig",
        str(kubeconfig),
        "--metrics-host",
        "127.0.0.1",
        "--metrics-port",
        "0",
        "--lease-namespace",
        "kube-system",
        "--scheduler-name",
        "lattice-refusal-test",
        *extra,
    ]


def kubeconfig_to(path: Path, server: str, token: str) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {"name": "c", "cluster": {"server": server, "insecure-skip-tls-verify": True}}
                ],
                "users": [{"name": "u", "user": {"token": token}}],
                "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "ctx",
            }
        )
    )
    return path


@pytest.fixture(scope="module")
def bare_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    """A control plane without Lattice's CRDs (and without nodes: none are needed)."""
    cluster = DevCluster(tmp_path_factory.mktemp("bareplane") / "state")
    cluster.up(ClusterConfig(nodes=0))
    try:
        yield cluster
    finally:
        cluster.down()


def test_run_without_crds_says_what_to_apply(bare_plane: DevCluster) -> None:
    line = lattice(*run_flags(bare_plane.kubeconfig)).refused()
    assert "latticeschedulers.lattice.dev" in line
    assert "kubectl apply -f crds/" in line


def test_agent_without_crds_says_what_to_apply(bare_plane: DevCluster) -> None:
    outcome = lattice("agent", "--node-name", "n1", env={"KUBECONFIG": str(bare_plane.kubeconfig)})
    line = outcome.refused()
    assert "nodetopologies.lattice.dev" in line
    assert "kubectl apply -f crds/" in line


def test_run_on_a_busy_metrics_port_names_the_flag(tmp_path: Path) -> None:
    """Checked before any API call: against an API server nobody serves, the refusal is
    the port's, not the start-up retries' "cannot reach the API server" (no timing
    assertion: on a loaded machine the interpreter's start alone can take seconds)."""
    dead = f"https://127.0.0.1:{free_port()}"  # nothing listens there
    kubeconfig = kubeconfig_to(tmp_path / "dead.kubeconfig", dead, "t")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        outcome = lattice(*run_flags(kubeconfig, "--metrics-port", str(port)))
    line = outcome.refused()
    assert f"127.0.0.1:{port} is already in use" in line
    assert "--metrics-port" in line
    assert "cannot reach the API server" not in outcome.stderr


async def test_a_port_taken_after_the_check_is_still_named() -> None:
    """Another process may take the port between the early check and the bind: the server
    names the flag too."""
    from prometheus_client import CollectorRegistry

    from scheduler.control.server import PortInUse, check_port_free, start_server

    port = free_port()
    check_port_free("127.0.0.1", port)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        with pytest.raises(PortInUse, match="--metrics-port"):
            check_port_free("127.0.0.1", port)
        with pytest.raises(PortInUse, match=f"127.0.0.1:{port} is already in use"):
            await start_server(CollectorRegistry(), lambda: True, "127.0.0.1", port)


def test_a_dead_api_server_is_refused_after_a_bounded_retry(tmp_path: Path) -> None:
    dead = f"https://127.0.0.1:{free_port()}"  # nothing listens there
    kubeconfig = kubeconfig_to(tmp_path / "dead.kubeconfig", dead, "t")
    run = subprocess.Popen(
        [sys.executable, "-m", "scheduler.cli", *run_flags(kubeconfig)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    agent = lattice("agent", "--node-name", "n1", env={"KUBECONFIG": str(kubeconfig)})
    out, err = run.communicate(timeout=90)
    for outcome in (agent, Outcome(run.returncode, out, err, agent.seconds)):
        line = outcome.refused()
        assert f"cannot reach the API server at {dead}" in line
        assert "attempts over 15s" in line
    assert 14 < agent.seconds < 40


def test_rejected_credentials_are_one_line(bare_plane: DevCluster, tmp_path: Path) -> None:
    server = bare_plane.load_state().server  # type: ignore[union-attr]
    kubeconfig = kubeconfig_to(tmp_path / "bad.kubeconfig", server, "not-a-token")
    assert "401 Unauthorized" in lattice(*run_flags(kubeconfig)).refused()
    agent = lattice("agent", "--node-name", "n1", env={"KUBECONFIG": str(kubeconfig)})
    assert "rejected the credentials" in agent.refused()


def test_no_credentials_at_all(tmp_path: Path) -> None:
    env = {"KUBECONFIG": "", "HOME": str(tmp_path), "KUBERNETES_SERVICE_HOST": ""}
    run = lattice("run", "--metrics-port", "0", env=env)
    assert "no credentials" in run.refused()
    missing = lattice("run", "--kubeconfig", str(tmp_path / "absent"), "--metrics-port", "0")
    assert "does not exist" in missing.refused()
    agent = lattice("agent", "--node-name", "n1", env=env)
    assert "no credentials" in agent.refused()


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["run", "--renew-deadline", "-1"], "--renew-deadline"),
        (["run", "--retry-period", "0"], "--retry-period"),
        (["run", "--metrics-port", "70000"], "--metrics-port"),
        (["run", "--lease-duration", "ten"], "--lease-duration"),
        (["run", "--no-such-flag"], "--no-such-flag"),
        (["agent", "--report-interval", "abc"], "--report-interval"),
        (["agent", "--node-name", "n", "--sample-interval", "0"], "interval"),
    ],
)
def test_bad_flags_are_one_line(args: list[str], flag: str) -> None:
    line = lattice(*args).refused(code=2)
    assert flag in line


def test_inconsistent_leader_election_flags_are_one_line() -> None:
    line = lattice("run", "--lease-duration", "5", "--renew-deadline", "10").refused(code=2)
    assert "lease-duration > renew-deadline" in line
