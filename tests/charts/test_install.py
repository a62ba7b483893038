"""The chart and the shipped manifests, installed on a real control plane.

kube-scheduler runs, so Lattice's own pods are placed on the kwok nodes; the Deployment
and DaemonSet controllers of kube-controller-manager create the pods through the API
server's admission, Pod Security included (on by default, enforcing the namespaces'
labels). kwok then runs them. One control plane for the module, three nodes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

from lattice_dev.devcluster.cluster import ClusterConfig, DevCluster
from lattice_dev.devcluster.profiles import node_name
from tests.agent.trees import TWO_SOCKET, roots
from tests.charts import render
from tests.charts.render import CHART, CRDS, MANIFESTS

NODES = 3
SCHED_NS = "lattice-system"
AGENT_NS = "lattice-agent"
T = TypeVar("T")


class Plane:
    def __init__(self, cluster: DevCluster, tmp: Path) -> None:
        state = cluster.load_state()
        assert state is not None
        self.kubectl_bin = str(Path(state.binaries) / "kubectl")
        self.kubeconfig = cluster.kubeconfig
        self.tmp = tmp
        # helm's own cache and config in the test's folder, never the developer's.
        homes = {f"HELM_{k}_HOME": str(tmp / "helm" / k) for k in ("CACHE", "CONFIG", "DATA")}
        self.helm_env = {**os.environ, **homes}

    def run(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.kubectl_bin, f"--kubeconfig={self.kubeconfig}", *args],
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
            input=stdin,
        )

    def kubectl(self, *args: str, stdin: str | None = None) -> str:
        out = self.run(*args, stdin=stdin)
        if out.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: {out.stderr}")
        return out.stdout

    def get(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", "-o", "json", *args))

    def helm(self, *args: str) -> str:
        return render.helm(*args, kubeconfig=self.kubeconfig, env=self.helm_env)


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    tmp = tmp_path_factory.mktemp("chartplane")
    cluster = DevCluster(tmp / "state")
    cluster.up(ClusterConfig(nodes=NODES, with_kube_scheduler=True))
    try:
        yield Plane(cluster, tmp)
    finally:
        cluster.down()


def wait_for(probe: Callable[[], T | None], what: str, within: float = 90.0) -> T:
    deadline = time.monotonic() + within
    while True:
        got = probe()
        if got is not None:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {within:.0f}s")
        time.sleep(0.5)


def failed_creates(plane: Plane, *namespaces: str) -> list[str]:
    """The FailedCreate events (a controller's pods refused, e.g. by Pod Security)."""
    out = []
    for ns in namespaces:
        events = plane.get("events", "-n", ns, "--field-selector", "reason=FailedCreate")
        out += [f"{ns}: {e['message']}" for e in events["items"]]
    return out


def assert_lattice_runs(plane: Plane) -> None:
    """The scheduler's replicas and one agent per node are created, placed and running."""
    nodes = {node_name(i) for i in range(NODES)}

    def deployment_available() -> dict[str, Any] | None:
        st: dict[str, Any] = plane.get("deploy", "lattice-scheduler", "-n", SCHED_NS)["status"]
        return st if st.get("replicas") == st.get("availableReplicas") == 2 else None

    def one_agent_per_node() -> dict[str, Any] | None:
        st: dict[str, Any] = plane.get("ds", "lattice-agent", "-n", AGENT_NS)["status"]
        counts = ("desiredNumberScheduled", "currentNumberScheduled", "numberReady")
        return st if all(st.get(c) == NODES for c in counts) else None

    wait_for(deployment_available, "the scheduler Deployment's 2 replicas available")
    wait_for(one_agent_per_node, f"the agent DaemonSet: desired == current == ready == {NODES}")
    sched = plane.get("pods", "-n", SCHED_NS, "-l", "app.kubernetes.io/name=lattice-scheduler")
    agents = plane.get("pods", "-n", AGENT_NS, "-l", "app.kubernetes.io/name=lattice-agent")
    assert len(sched["items"]) == 2
    assert {p["spec"]["nodeName"] for p in sched["items"]} <= nodes
    assert sorted(p["spec"]["nodeName"] for p in agents["items"]) == sorted(nodes)
    assert {p["status"]["phase"] for p in sched["items"] + agents["items"]} == {"Running"}
    assert failed_creates(plane, SCHED_NS, AGENT_NS) == []


def assert_agent_writes_only_its_own_node(plane: Plane) -> None:
    """The real agent, with the credentials its pod would get (a token bound to the pod, so
    naming its node), publishes its own node's NodeTopology and is refused any other's:
    RBAC lets it create any name, the chart's admission policy narrows it to its node."""
    pod = plane.get("pods", "-n", AGENT_NS, "-l", "app.kubernetes.io/name=lattice-agent")["items"][
        0
    ]
    own = pod["spec"]["nodeName"]
    other = next(node_name(i) for i in range(NODES) if node_name(i) != own)
    token = plane.kubectl(
        *("create", "token", "lattice-agent", "-n", AGENT_NS, "--bound-object-kind=Pod"),
        f"--bound-object-name={pod['metadata']['name']}",
        f"--bound-object-uid={pod['metadata']['uid']}",
    ).strip()
    config = yaml.safe_load(plane.kubeconfig.read_text())
    config["users"][0]["user"] = {"token": token}
    agent_config = plane.tmp / "agent.kubeconfig"
    agent_config.write_text(yaml.safe_dump(config))
    sysfs, procfs = roots(TWO_SOCKET)

    def agent(node: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "scheduler.cli", "agent", "--node-name", node, "--once"]
        fixture = ["--sysfs-root", str(sysfs), "--procfs-root", str(procfs)]
        return subprocess.run(
            [*argv, *fixture],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            env={**os.environ, "KUBECONFIG": str(agent_config)},
        )

    published = agent(own)
    assert published.returncode == 0, published.stderr
    assert agent(other).returncode != 0
    names = {o["metadata"]["name"] for o in plane.get("nodetopologies")["items"]}
    assert names == {own}
    # The refusal is the policy's (RBAC alone would have allowed it).
    body = plane.get("nodetopology", own)
    body["metadata"] = {"name": other}
    body.pop("status", None)
    refused = subprocess.run(
        [plane.kubectl_bin, f"--kubeconfig={agent_config}", "create", "--dry-run=server", "-f-"],
        input=json.dumps(body),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert "may only write the NodeTopology of its own node" in refused.stderr, refused
    plane.kubectl("delete", "nodetopology", own)


def assert_nothing_left(plane: Plane, rendered: str) -> None:
    """Every object the chart renders is gone (CRDs are not rendered: see the test)."""

    def gone() -> bool | None:
        out = plane.run("get", "-f", "-", "--ignore-not-found", "-o", "name", stdin=rendered)
        return True if out.returncode == 0 and not out.stdout.strip() else None

    wait_for(gone, "every object of the chart deleted", within=120)
    labelled = plane.kubectl(
        "get",
        "namespaces,clusterroles,clusterrolebindings,"
        "validatingadmissionpolicies,validatingadmissionpolicybindings",
        "-l",
        "app.kubernetes.io/part-of=lattice",
        "-o",
        "name",
    )
    assert labelled.strip() == ""


def test_a_restricted_namespace_refuses_the_agent(plane: Plane) -> None:
    """The control for the tests below: Pod Security is enforced here, and the agent's
    DaemonSet in a `restricted` namespace (the bug this chart fixes) gets FailedCreate."""
    ns = "psa-probe"
    plane.kubectl("create", "namespace", ns)
    plane.kubectl("label", "namespace", ns, "pod-security.kubernetes.io/enforce=restricted")
    try:
        agent = render.render(
            *("--set", f"agent.namespace={ns}"),
            *("--set", "namespaces.create=false"),
            *("--show-only", "templates/agent/serviceaccount.yaml"),
            *("--show-only", "templates/agent/daemonset.yaml"),
            namespace="default",  # the scheduler's (not shown) must differ from the agent's
        )
        plane.kubectl("apply", "-f", "-", stdin=agent)

        def refused() -> list[str] | None:
            return failed_creates(plane, ns) or None

        events = wait_for(refused, "FailedCreate for the agent in a restricted namespace")
        reasons = {e.split('violates PodSecurity "restricted:latest": ', 1)[-1] for e in events}
        # hostPath is the only thing `restricted` refuses: the pod is otherwise unprivileged.
        assert reasons == {
            'restricted volume types (volumes "sys", "proc", "kubelet-config" use restricted '
            'volume type "hostPath")'
        }, events
        assert plane.get("pods", "-n", ns)["items"] == []
    finally:
        plane.kubectl("delete", "namespace", ns, "--wait=true")


def test_helm_install_runs_lattice_and_uninstall_leaves_nothing(plane: Plane) -> None:
    """The install every chart's README teaches; it failed while the chart created the
    release namespace itself ("namespaces lattice-system already exists")."""
    ns = ("-n", SCHED_NS)
    plane.helm(
        "install", "lattice", str(CHART), *ns, "--create-namespace", "--wait", "--timeout=3m"
    )
    try:
        assert_lattice_runs(plane)
        assert_agent_writes_only_its_own_node(plane)
        status = plane.helm("status", "lattice", *ns, "-o", "json")
        assert json.loads(status)["info"]["status"] == "deployed"
        # The release namespace is Helm's, unlabelled; the label NOTES.txt prints is one
        # the running scheduler pods already satisfy (the server warns of any that do not).
        notes = plane.helm("get", "notes", "lattice", *ns)
        assert f"kubectl label ns {SCHED_NS} pod-security.kubernetes.io/enforce=restricted" in notes
        label = plane.run(
            "label",
            "--dry-run=server",
            "--overwrite",
            "namespace",
            SCHED_NS,
            "pod-security.kubernetes.io/enforce=restricted",
        )
        assert label.returncode == 0, label.stderr
        assert "violate" not in label.stderr, label.stderr

        plane.helm("uninstall", "lattice", *ns, "--wait", "--timeout=3m")
        assert_nothing_left(plane, render.render())
        assert json.loads(plane.helm("list", "--all", "--all-namespaces", "-o", "json")) == []
    finally:
        plane.run("delete", "namespace", SCHED_NS, "--ignore-not-found", "--wait=true")
    # By Helm's design a chart's crds/ are installed once and never upgraded or deleted
    # (deleting a CRD deletes every object of it, cluster-wide): they stay until removed.
    crds = plane.kubectl("get", "crd", "-o", "name")
    for doc in render.crd_files(CRDS).values():
        name = yaml.safe_load(doc)["metadata"]["name"]
        assert f"customresourcedefinition.apiextensions.k8s.io/{name}" in crds


def test_kubectl_apply_of_the_shipped_manifests_runs_lattice(plane: Plane) -> None:
    """`kubectl apply -f crds/ -f manifests/` in one go, as the README says."""
    out = plane.kubectl("apply", "-f", str(CRDS), "-f", str(MANIFESTS))
    assert "daemonset.apps/lattice-agent created" in out
    assert "deployment.apps/lattice-scheduler created" in out
    assert_lattice_runs(plane)

    plane.kubectl("delete", "-f", str(MANIFESTS), "--ignore-not-found", "--wait=true")
    assert_nothing_left(plane, "".join(p.read_text() for p in sorted(MANIFESTS.glob("*.yaml"))))
