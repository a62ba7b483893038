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
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from lattice_dev.devcluster import realnode
from lattice_dev.devcluster.build import ensure_binaries, kubernetes_version
from lattice_dev.devcluster.cluster import ClusterConfig, DevCluster
from scheduler import __version__
from tests.charts.render import CHART
from tests.charts.test_install import Plane, failed_creates, wait_for

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    if not (os.environ.get("CI") or os.geteuid() == 0):
        pytest.skip("a real node needs root (kubelet, containerd, a bridge)")
    dev = DevCluster(tmp_path_factory.mktemp("real-node") / "state")
    dev.up(ClusterConfig(nodes=1, real_node=True, with_kube_scheduler=True), progress=print)
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
    assert info["kubeletVersion"] == kubernetes_version()
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
    image = cluster.node_image()
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


def test_chart_installed_the_usual_way_runs_on_the_real_node(
    cluster: DevCluster, tmp_path: Path
) -> None:
    """helm install -n lattice-system --create-namespace with the image built here: real
    containers, Ready, one leader by its in-cluster token, a pod bound; the agent on the
    real node only, reporting this machine's CPUs; killing the leader's container hands
    over to the standby."""
    plane = Plane(cluster, tmp_path)
    image = cluster.node_image()
    layout = realnode.Layout(cluster.state_dir / "real-node")
    not_kwok = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "type", "operator": "NotIn", "values": ["kwok"]}]}
                ]
            }
        }
    }
    plane.helm(
        "install",
        "lattice",
        str(CHART),
        "-n",
        "lattice-system",
        "--create-namespace",
        "--set",
        f"image.repository={image.rsplit(':', 1)[0]}",
        "--set",
        f"image.tag={image.rsplit(':', 1)[1]}",
        "--set",
        "image.pullPolicy=Never",
        "--set-json",
        f"scheduler.affinity={json.dumps(not_kwok)}",
        "--set-json",
        f"agent.affinity={json.dumps(not_kwok)}",
        "--set-json",
        f"test.affinity={json.dumps(not_kwok)}",
        "--set-json",
        f"cleanup.affinity={json.dumps(not_kwok)}",
        "--set",
        f"agent.kubeletConfig.path={layout.kubelet_config}",
        "--wait",
        "--timeout=5m",
    )
    label = plane.run(
        "label", "ns", "lattice-system", "pod-security.kubernetes.io/enforce=restricted"
    )
    assert label.returncode == 0, label.stderr
    assert "violate" not in label.stderr.lower(), label.stderr  # running pods meet restricted

    def ready_schedulers() -> list[dict[str, Any]] | None:
        pods = plane.get("pods", "-n", "lattice-system")["items"]
        ok = [
            p
            for p in pods
            if p["spec"].get("nodeName") == realnode.NODE_NAME
            and all(c.get("ready") for c in p["status"].get("containerStatuses") or [{}])
        ]
        return ok if len(ok) == 2 else None

    pods = wait_for(ready_schedulers, "both scheduler replicas Ready on the real node", 180)
    assert all(
        c["restartCount"] == 0 and c["containerID"].startswith("containerd://")
        for p in pods
        for c in p["status"]["containerStatuses"]
    )
    names = {p["metadata"]["name"] for p in pods}

    def holder() -> str | None:
        leases = plane.get("leases", "-n", "lattice-system")["items"]
        held = [lease["spec"].get("holderIdentity") or "" for lease in leases]
        return next((h for h in held if any(n in h for n in names)), None)

    leader_identity = wait_for(holder, "a replica holds the Lease", 120)
    leader = next(n for n in names if n in leader_identity)

    def bound(name: str) -> str | None:
        pod = plane.get("pod", "-n", "default", name)
        node: str | None = pod["spec"].get("nodeName")
        return node

    probe = """
apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: default}}
spec:
  schedulerName: lattice
  containers: [{{name: c, image: localhost/none, resources: {{requests: {{cpu: 10m}}}}}}]
  affinity: {{nodeAffinity: {{requiredDuringSchedulingIgnoredDuringExecution:
    {{nodeSelectorTerms: [{{matchExpressions: [{{key: type, operator: In, values: [kwok]}}]}}]}}}}}}
"""
    plane.kubectl("apply", "-f", "-", stdin=probe.format(name="probe-1"))
    assert wait_for(lambda: bound("probe-1"), "the leader binds a pod", 90).startswith("kwok-")

    def published() -> dict[str, Any] | None:
        got = plane.run("get", "nodetopology", realnode.NODE_NAME, "-o", "json")
        return json.loads(got.stdout) if got.returncode == 0 else None

    topology = wait_for(published, "the agent publishes the real node's NodeTopology", 120)
    assert topology["spec"]["summary"]["cpus"] == os.cpu_count()
    agents = plane.get("pods", "-n", "lattice-agent")["items"]
    assert [p["spec"]["nodeName"] for p in agents] == [realnode.NODE_NAME]

    # The leader's container dies; a replica holding the Lease binds the next pod (the
    # standby, or the restarted container, whose identity is the same pod name).
    leader_pod = next(p for p in pods if p["metadata"]["name"] == leader)
    container = leader_pod["status"]["containerStatuses"][0]["containerID"].split("//", 1)[1]
    ctr = ["ctr", "--address", str(layout.socket), "--namespace", "k8s.io"]
    killed = subprocess.run([*ctr, "tasks", "kill", "--signal", "SIGKILL", container], check=False)
    assert killed.returncode == 0
    killed_at = time.monotonic()
    plane.kubectl("apply", "-f", "-", stdin=probe.format(name="probe-2"))
    wait_for(lambda: bound("probe-2"), "the standby binds the next pod", 90)
    took = time.monotonic() - killed_at
    print(f"standby bound the next pod {took:.1f}s after the leader's container was killed")
    # The identity is the pod's name, so the leader's restarted container may take the
    # Lease back at once (the old process is dead: no two leaders); when the pod itself
    # goes (deleted: it releases the Lease on SIGTERM), another replica takes over. That
    # is the warm standby unless the Deployment's replacement for the deleted pod has
    # started by the release: the released Lease is free to every candidate (one CI run
    # saw the replacement win), as kube-scheduler's is.
    plane.kubectl("delete", "pod", "-n", "lattice-system", leader, "--wait=false")

    def taken_over() -> str | None:
        others = {p["metadata"]["name"] for p in plane.get("pods", "-n", "lattice-system")["items"]}
        others.discard(leader)
        leases = plane.get("leases", "-n", "lattice-system")["items"]
        held = [lease["spec"].get("holderIdentity") or "" for lease in leases]
        return next((n for n in sorted(others) for h in held if n in h), None)

    taker = wait_for(
        taken_over, "another replica holds the Lease once the leader's pod is deleted", 60
    )
    plane.kubectl("apply", "-f", "-", stdin=probe.format(name="probe-3"))
    wait_for(lambda: bound("probe-3"), "the new leader binds a pod", 60)
    events = plane.get("events", "-n", "default", "--field-selector", "reason=Scheduled")
    by = {e["involvedObject"]["name"]: e.get("reportingInstance") for e in events["items"]}
    assert by.get("probe-3") == taker, by
    assert failed_creates(plane, "lattice-system", "lattice-agent") == []
    restarts = {
        p["metadata"]["name"]: c["restartCount"]
        for p in plane.get("pods", "-n", "lattice-system")["items"]
        for c in p["status"].get("containerStatuses") or []
    }
    killed_once = restarts.pop(leader, 1)  # still terminating: its one restart was the kill
    assert killed_once <= 1, restarts
    assert set(restarts.values()) == {0}, restarts  # the others never restarted: no loop


def _load_reports(plane: Plane) -> dict[str, Any] | None:
    got = plane.run("get", "nodetopology", realnode.NODE_NAME, "-o", "json")
    if got.returncode != 0:
        return None
    load: dict[str, Any] | None = (json.loads(got.stdout).get("status") or {}).get("load")
    return load


def test_agent_load_reports_move_with_a_cpu_burner(cluster: DevCluster, tmp_path: Path) -> None:
    """The agent on the real node reads real /proc: a busy loop on every CPU of this
    machine (the node) shows in its next reports, and its end shows in later ones."""
    plane = Plane(cluster, tmp_path)
    first = wait_for(lambda: _load_reports(plane), "a load report from the agent", 120)
    cpus = os.cpu_count() or 1
    assert first["cpu"]["capacityMillicores"] == cpus * 1000
    burn = "import time\nend = time.monotonic() + 150\nwhile time.monotonic() < end: pass\n"
    burners = [subprocess.Popen([sys.executable, "-c", burn]) for _ in range(cpus)]
    started = datetime.now(UTC)
    try:

        def hot() -> dict[str, Any] | None:
            load = _load_reports(plane)
            if load is None:
                return None
            # A report whose whole window ran with the burners.
            window_start = datetime.fromisoformat(load["sampleTime"]) - timedelta(
                seconds=float(load["windowSeconds"])
            )
            return load if window_start >= started and load["cpuPercent"] >= 85 else None

        burning = wait_for(hot, "a report at >= 85 % cpu while every CPU is busy", 120)
    finally:
        for proc in burners:
            proc.kill()
            proc.wait()
    stopped = datetime.now(UTC)

    def cooler() -> dict[str, Any] | None:
        load = _load_reports(plane)
        if load is None:
            return None
        window_start = datetime.fromisoformat(load["sampleTime"]) - timedelta(
            seconds=float(load["windowSeconds"])
        )
        cooled = load["cpuPercent"] <= burning["cpuPercent"] - 10
        return load if window_start >= stopped and cooled else None

    after = wait_for(cooler, "a report >= 10 points lower once the burners stopped", 120)
    print(
        f"agent cpu reports: {first['cpuPercent']} % before, {burning['cpuPercent']} % "
        f"with {cpus} burners, {after['cpuPercent']} % after"
    )


def test_helm_test_upgrade_and_rollback(cluster: DevCluster, tmp_path: Path) -> None:
    """After the install above: `helm test` runs `lattice selftest` in a real container
    (the Service's /readyz answers, a probe pod is bound); `helm upgrade --reuse-values`
    to one replica at debug level and `helm rollback` to the first revision both roll out."""
    plane = Plane(cluster, tmp_path)
    out = plane.helm("test", "lattice", "-n", "lattice-system", "--logs", "--timeout=3m")
    assert "Phase:          Succeeded" in out, out
    assert "answered 200" in out, out
    assert "bound probe pod" in out, out
    probes = plane.get(
        "pods", "-n", "lattice-system", "-l", "app.kubernetes.io/component=selftest-probe"
    )
    assert probes["items"] == []  # the probe is deleted

    def rolled_out(replicas: int, level: str) -> list[dict[str, Any]] | None:
        dep = plane.get("deployment", "-n", "lattice-system", "lattice-scheduler")
        args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
        status = dep.get("status") or {}
        done = (
            dep["spec"]["replicas"] == replicas
            and f"--log-level={level}" in args
            and status.get("updatedReplicas") == replicas
            and status.get("readyReplicas") == replicas
            and status.get("replicas") == replicas
        )
        return [dep] if done else None

    plane.helm(
        "upgrade",
        "lattice",
        str(CHART),
        "-n",
        "lattice-system",
        "--reuse-values",
        "--set",
        "scheduler.replicas=1",
        "--set",
        "scheduler.logLevel=debug",
        "--wait",
        "--timeout=5m",
    )
    wait_for(lambda: rolled_out(1, "debug"), "the upgrade to 1 replica at debug rolled out", 180)
    plane.helm("rollback", "lattice", "1", "-n", "lattice-system", "--wait", "--timeout=5m")
    wait_for(lambda: rolled_out(2, "info"), "the rollback to 2 replicas at info rolled out", 180)
    history = plane.helm("history", "lattice", "-n", "lattice-system", "-o", "json")
    assert [r["revision"] for r in json.loads(history)] == [1, 2, 3]
    again = plane.helm("test", "lattice", "-n", "lattice-system", "--timeout=3m")
    assert "Phase:          Succeeded" in again, again


def test_uninstall_leaves_only_the_crds_and_the_release_namespace(
    cluster: DevCluster, tmp_path: Path
) -> None:
    """`helm uninstall` removes the chart's objects, and its post-delete hook (`lattice
    cleanup`, a real container) what the running software created: the LatticeScheduler
    object, the agent's NodeTopology, the Lease. The hook's own objects go too; a
    NodeTopology someone else wrote stays."""
    plane = Plane(cluster, tmp_path)
    assert [o["metadata"]["name"] for o in plane.get("latticeschedulers")["items"]] == ["lattice"]
    assert [o["metadata"]["name"] for o in plane.get("nodetopologies")["items"]] == [
        realnode.NODE_NAME
    ]
    foreign = {
        "apiVersion": "lattice.dev/v1alpha1",
        "kind": "NodeTopology",
        "metadata": {"name": "not-ours"},  # no managed-by label: not the agent's
        "spec": plane.get("nodetopology", realnode.NODE_NAME)["spec"],
    }
    plane.kubectl("create", "-f", "-", stdin=json.dumps(foreign))
    plane.helm("uninstall", "lattice", "-n", "lattice-system", "--wait", "--timeout=3m")

    def chart_gone() -> bool | None:
        left = plane.run(
            "get",
            "deployments,daemonsets,services,jobs,serviceaccounts",
            "-A",
            "-l",
            "app.kubernetes.io/part-of=lattice",
            "-o",
            "name",
        )
        cluster_wide = plane.run(
            "get",
            "clusterroles,clusterrolebindings",
            "-l",
            "app.kubernetes.io/part-of=lattice",
            "-o",
            "name",
        )
        agent_ns = plane.run(
            "get", "namespace", "lattice-agent", "--ignore-not-found", "-o", "name"
        )
        empty = not (left.stdout.strip() or cluster_wide.stdout.strip() or agent_ns.stdout.strip())
        return True if empty else None

    try:
        wait_for(
            chart_gone, "the chart's, the hooks' objects and the agent's namespace deleted", 180
        )
    except AssertionError:
        left = plane.run(
            "get",
            "all,serviceaccounts,roles,rolebindings,clusterroles,clusterrolebindings,ns",
            "-A",
            "-l",
            "app.kubernetes.io/part-of=lattice",
            "-o",
            "name",
        )
        raise AssertionError(f"left after uninstall:\n{left.stdout}{left.stderr}") from None
    assert plane.get("latticeschedulers")["items"] == []
    assert [o["metadata"]["name"] for o in plane.get("nodetopologies")["items"]] == ["not-ours"]
    leases = [o["metadata"]["name"] for o in plane.get("leases", "-n", "lattice-system")["items"]]
    assert "lattice-scheduler" not in leases, leases
    plane.kubectl("delete", "nodetopology", "not-ours")
    crds = plane.kubectl("get", "crd", "-o", "name")
    assert "latticeschedulers.lattice.dev" in crds  # Helm never deletes a chart's CRDs


def test_down_stops_containers_and_unmounts(cluster: DevCluster) -> None:
    """Last in this module: down leaves no container process and no mount behind."""
    ns = "real-node-test"
    image = cluster.node_image()
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
