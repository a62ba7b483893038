"""`lattice devcluster` lifecycle: one cluster per folder, nothing left behind."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lattice_dev.devcluster import process
from lattice_dev.devcluster.cluster import AlreadyRunning, ClusterConfig, ClusterState, DevCluster
from tests.conftest import ControlPlane


def test_second_up_refuses_to_start_a_twin(control_plane: ControlPlane) -> None:
    twin = DevCluster(control_plane.cluster.state_dir)
    with pytest.raises(AlreadyRunning, match="already running"):
        twin.up(ClusterConfig(nodes=1))
    assert all(control_plane.cluster.running().values())


def _lattice(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "scheduler.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_cli_up_status_down_leaves_no_process(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    up = _lattice("devcluster", "--state-dir", str(state_dir), "up", "--nodes", "2")
    assert up.returncode == 0, up.stderr
    assert "devcluster ready" in up.stdout

    status = _lattice("devcluster", "--state-dir", str(state_dir), "status")
    assert status.returncode == 0, status.stderr
    info = json.loads(status.stdout)
    assert set(info["components"]) == {
        "etcd",
        "kube-apiserver",
        "kube-controller-manager",
        "kwok",
    }
    pids = json.loads((state_dir / "state.json").read_text())["pids"]

    kubeconfig = _lattice("devcluster", "--state-dir", str(state_dir), "kubeconfig")
    nodes = subprocess.run(
        ["kubectl", "--kubeconfig", kubeconfig.stdout.strip(), "get", "nodes", "-o", "name"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert nodes.stdout.split() == ["node/kwok-node-0000", "node/kwok-node-0001"]

    down = _lattice("devcluster", "--state-dir", str(state_dir), "down")
    assert down.returncode == 0, down.stderr
    assert not state_dir.exists()
    for name, pid in pids.items():
        assert not process.is_running(pid, name), name

    again = _lattice("devcluster", "--state-dir", str(state_dir), "status")
    assert again.returncode == 1
    assert "no devcluster" in again.stdout


def test_unknown_profile_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown node profile 'nope'; choose one of"):
        DevCluster(tmp_path / "s").up(ClusterConfig(node_profile="nope"))


def test_free_port_is_outside_the_ephemeral_range() -> None:
    """Outgoing connections take ephemeral ports; a listener's port must not be one."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = {process.free_port() for _ in range(20)}
    assert len(ports) == 20
    assert all(port < low for port in ports)


def test_a_component_whose_port_is_taken_starts_on_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CI failure: something bound kube-controller-manager's port between our choice
    and its start. The cluster must come up anyway, on another port."""
    import socket

    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    taken = holder.getsockname()[1]
    original = DevCluster._write_credentials

    def take_port(self: DevCluster, state: ClusterState) -> None:
        original(self, state)
        state.ports["kube-controller-manager"] = taken
        self._save(state)

    monkeypatch.setattr(DevCluster, "_write_credentials", take_port)
    cluster = DevCluster(tmp_path / "state")
    try:
        state = cluster.up(ClusterConfig(nodes=1))
        assert state.ports["kube-controller-manager"] != taken
        assert all(cluster.running().values())
        log = cluster.log("kube-controller-manager").read_text()
        assert "address already in use" in log
        assert "retrying on" in log
    finally:
        cluster.down()
        holder.close()
