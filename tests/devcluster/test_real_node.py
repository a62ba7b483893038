"""`devcluster up --real-node`: a real kubelet with containerd beside kwok nodes.

A cluster of its own (the suite's plane has only kwok nodes): the node registers
with its own certificate under NodeRestriction, and Lattice's image runs there as a
real container under the restricted Pod Security level. A host that cannot run
containers skips with one reason, except under CI or as root, where it must work.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scheduler import __version__
from scheduler.devcluster import realnode
from scheduler.devcluster.build import ensure_binaries
from scheduler.devcluster.cluster import ClusterConfig, DevCluster
from scheduler.devcluster.image import ensure_image

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    if not (os.environ.get("CI") or os.geteuid() == 0):
        pytest.skip("a real node needs root (kubelet, containerd, a bridge)")
    dev = DevCluster(tmp_path_factory.mktemp("real-node") / "state")
    dev.up(ClusterConfig(nodes=1, real_node=True), progress=print)
    try:
        yield dev
    finally:
        dev.down()


def kubectl(dev: DevCluster, *args: str, kubeconfig: Path | None = None, stdin: str = "") -> Any:
    done = subprocess.run(
        [str(ensure_binaries().kubectl), f"--kubeconfig={kubeconfig or dev.kubeconfig}", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return done


def test_node_registers_with_its_own_credentials(cluster: DevCluster) -> None:
    done = kubectl(cluster, "get", "node", realnode.NODE_NAME, "-o", "json")
    assert done.returncode == 0, done.stderr
    node = json.loads(done.stdout)
    info = node["status"]["nodeInfo"]
    assert info["kubeletVersion"] == "v1.34.4"
    assert info["containerRuntimeVersion"].startswith("containerd://")
    assert {"type": "InternalIP", "address": realnode.NODE_IP} in node["status"]["addresses"]
    # NodeRestriction: the node's identity may change itself, never another node.
    own = realnode.Layout(cluster.state_dir / "real-node").kubeconfig
    other = kubectl(cluster, "label", "node", "kwok-node-0000", "x=y", kubeconfig=own)
    assert other.returncode != 0
    assert "forbidden" in other.stderr.lower()
    mine = kubectl(cluster, "label", "node", realnode.NODE_NAME, "x=y", kubeconfig=own)
    assert mine.returncode == 0, mine.stderr
    reserved = "node-restriction.kubernetes.io/pool=a"
    taken = kubectl(cluster, "label", "node", realnode.NODE_NAME, reserved, kubeconfig=own)
    assert taken.returncode != 0
    assert "forbidden" in taken.stderr.lower()
    whoami = kubectl(cluster, "auth", "whoami", "-o", "json", kubeconfig=own)
    assert json.loads(whoami.stdout)["status"]["userInfo"]["username"] == (
        f"system:node:{realnode.NODE_NAME}"
    )


POD = """
apiVersion: v1
kind: Pod
metadata: {{name: version, namespace: {ns}}}
spec:
  nodeName: {node}
  restartPolicy: Never
  automountServiceAccountToken: false
  securityContext: {{runAsNonRoot: true, seccompProfile: {{type: RuntimeDefault}}}}
  containers:
  - name: lattice
    image: {image}
    imagePullPolicy: Never
    command: ["/bin/sh", "-c", "{script}"]
    securityContext:
      allowPrivilegeEscalation: false
      readOnlyRootFilesystem: true
      capabilities: {{drop: [ALL]}}
"""


VERSION_SCRIPT = "lattice --version | tee /dev/termination-log; id -u >> /dev/termination-log"


def test_lattice_image_runs_on_the_real_node_under_restricted(cluster: DevCluster) -> None:
    ns = "real-node-test"
    assert kubectl(cluster, "create", "namespace", ns).returncode == 0
    label = "pod-security.kubernetes.io/enforce=restricted"
    assert kubectl(cluster, "label", "namespace", ns, label).returncode == 0
    image = ensure_image(print).ref
    done = kubectl(
        cluster,
        "apply",
        "-f",
        "-",
        stdin=POD.format(ns=ns, node=realnode.NODE_NAME, image=image, script=VERSION_SCRIPT),
    )
    assert done.returncode == 0, done.stderr  # admitted under restricted
    deadline = time.monotonic() + 120
    pod: dict[str, Any] = {}
    while time.monotonic() < deadline:
        pod = json.loads(kubectl(cluster, "get", "pod", "-n", ns, "version", "-o", "json").stdout)
        if pod["status"].get("phase") in ("Succeeded", "Failed"):
            break
        time.sleep(1)
    state = pod["status"]["containerStatuses"][0]["state"]
    assert pod["status"]["phase"] == "Succeeded", pod["status"]
    assert state["terminated"]["exitCode"] == 0
    assert state["terminated"]["message"].split() == ["lattice", __version__, "65532"]
    assert pod["status"]["podIP"].startswith("10.88.")


def test_down_stops_containers_and_unmounts(cluster: DevCluster) -> None:
    """Last in this module: down leaves no container process and no mount behind."""
    ns = "real-node-test"
    image = ensure_image(print).ref
    body = POD.format(ns=ns, node=realnode.NODE_NAME, image=image, script="sleep 3600")
    body = body.replace("name: version", "name: sleeper")
    assert kubectl(cluster, "apply", "-f", "-", stdin=body).returncode == 0
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        got = kubectl(cluster, "get", "pod", "-n", ns, "sleeper", "-o", "jsonpath={.status.phase}")
        if got.stdout == "Running":
            break
        time.sleep(1)
    assert got.stdout == "Running"
    socket = realnode.Layout(cluster.state_dir / "real-node").socket
    ctr = ["ctr", "--address", str(socket), "--namespace", "k8s.io", "tasks", "ls"]
    listed = subprocess.run(ctr, capture_output=True, text=True, check=True).stdout
    pids = [int(row.split()[1]) for row in listed.splitlines()[1:] if "RUNNING" in row]
    assert len(pids) >= 2, listed  # the sandbox and the sleeper

    def running() -> list[int]:
        return [pid for pid in pids if Path(f"/proc/{pid}").exists()]

    assert running() == pids
    stopped = cluster.down()
    assert {"kubelet", "containerd"} <= set(stopped)
    assert running() == []
    with open("/proc/self/mounts") as mounts:
        assert not [line for line in mounts if str(cluster.state_dir) in line]
    assert not cluster.state_dir.exists()
