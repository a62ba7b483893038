"""`lattice devcluster` lifecycle: one cluster per folder, nothing left behind."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from scheduler.devcluster import process
from scheduler.devcluster.cluster import AlreadyRunning, ClusterConfig, DevCluster
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
