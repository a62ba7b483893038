"""The chart without a cluster: lint, one source of truth for manifests/ and CRDs, and the
properties an operator relies on (least privilege, Pod Security, the agent's mounts)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tests.charts import render
from tests.charts.render import CHART, CRDS, MANIFESTS, crd_files, documents, helm


def objects(rendered: str) -> list[dict[str, Any]]:
    return [yaml.safe_load(text) for _, text in documents(rendered)]


def find(objs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    hits = [o for o in objs if o["kind"] == kind and name in (None, o["metadata"]["name"])]
    assert len(hits) == 1, f"{len(hits)} {kind} {name or ''} in the render"
    return hits[0]


@pytest.fixture(scope="module")
def default() -> list[dict[str, Any]]:
    return objects(render.render())


@pytest.mark.parametrize(
    "values",
    [
        [],
        ["--set", "scheduler.serviceMonitor.enabled=true"],
        ["--set", "agent.enabled=false", "--set", "scheduler.replicas=1"],
        ["--set", "agent.kubeletConfig.enabled=false", "--set", "namespaces.create=false"],
    ],
    ids=["defaults", "service-monitor", "no-agent", "no-kubelet-config"],
)
def test_helm_lint_is_clean(values: list[str]) -> None:
    out = helm("lint", "--strict", str(CHART), *values)
    assert "1 chart(s) linted, 0 chart(s) failed" in out


def test_chart_crds_are_the_repos_crds() -> None:
    """Helm installs CRDs only from the chart's crds/; it must hold exactly crds/."""
    repo, chart = crd_files(CRDS), crd_files(CHART / "crds")
    assert sorted(chart) == sorted(repo), "run `just manifests`"
    for name, data in repo.items():
        assert chart[name] == data, f"charts/lattice/crds/{name} differs: run `just manifests`"


def test_manifests_are_the_default_render() -> None:
    want = render.manifest_files(render.render_manifests())
    assert sorted(p.name for p in MANIFESTS.glob("*.yaml")) == sorted(want)
    for name, text in want.items():
        assert (MANIFESTS / name).read_text() == text, f"manifests/{name}: run `just manifests`"


def test_each_manifest_file_declares_the_namespaces_it_uses() -> None:
    for path in sorted(MANIFESTS.glob("*.yaml")):
        objs = [d for d in yaml.safe_load_all(path.read_text()) if d]
        declared = {o["metadata"]["name"] for o in objs if o["kind"] == "Namespace"}
        used = {o["metadata"]["namespace"] for o in objs if "namespace" in o["metadata"]}
        assert used, path
        assert used <= declared, f"{path.name} uses {used - declared} without declaring it"


def test_the_scheduler_goes_in_the_release_namespace_and_the_agent_in_its_own(
    default: list[dict[str, Any]],
) -> None:
    """`helm install -n lattice-system --create-namespace`: Helm makes the release namespace,
    so the chart must not create it too (it did: "namespaces lattice-system already
    exists"); the agent's privileged namespace is the chart's own."""
    kinds_in_release = {
        o["kind"] for o in default if o["metadata"].get("namespace") == "lattice-system"
    }
    assert {"Deployment", "ServiceAccount", "Service", "Role"} <= kinds_in_release
    assert [o["metadata"]["name"] for o in default if o["kind"] == "Namespace"] == ["lattice-agent"]
    agent = find(default, "Namespace", "lattice-agent")["metadata"]["labels"]
    assert agent["pod-security.kubernetes.io/enforce"] == "privileged"
    assert find(default, "DaemonSet")["metadata"]["namespace"] == "lattice-agent"
    elsewhere = objects(render.render(namespace="team-a"))
    assert find(elsewhere, "Deployment")["metadata"]["namespace"] == "team-a"


def test_manifests_create_both_namespaces_with_their_pod_security() -> None:
    objs = objects(render.render_manifests())
    sched = find(objs, "Namespace", "lattice-system")["metadata"]["labels"]
    agent = find(objs, "Namespace", "lattice-agent")["metadata"]["labels"]
    assert sched["pod-security.kubernetes.io/enforce"] == "restricted"
    assert agent["pod-security.kubernetes.io/enforce"] == "privileged"
    assert find(objs, "Deployment")["metadata"]["namespace"] == "lattice-system"
    assert find(objs, "DaemonSet")["metadata"]["namespace"] == "lattice-agent"


def test_rbac_grants_no_secrets_and_names_the_lease(default: list[dict[str, Any]]) -> None:
    rules = [r for o in default if o["kind"] in ("ClusterRole", "Role") for r in o["rules"]]
    for rule in rules:
        assert "*" not in rule["verbs"], rule
        assert "*" not in rule["resources"], rule
        assert not {"secrets", "configmaps"} & set(rule["resources"]), rule
    role = find(default, "Role", "lattice-scheduler-leader-election")
    lease_rules = [r for r in role["rules"] if r["resources"] == ["leases"]]
    assert {tuple(r["verbs"]): r.get("resourceNames") for r in lease_rules} == {
        ("create",): None,  # a name cannot be checked at create
        ("get", "update"): ["lattice-scheduler"],
    }
    args = find(default, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--lease-name=lattice-scheduler" in args
    assert "--scheduler-name=lattice" in args
    gangs = find(default, "ClusterRole", "lattice-scheduler")["rules"]
    assert {
        "apiGroups": ["scheduling.x-k8s.io"],
        "resources": ["podgroups"],
        "verbs": ["get", "list", "watch"],
    } in gangs
    assert {
        "apiGroups": ["scheduling.x-k8s.io"],
        "resources": ["podgroups/status"],
        "verbs": ["get", "patch", "update"],
    } in gangs
    # Kubernetes' own PodGroup: read, and only its status patched.
    assert [r for r in gangs if r["apiGroups"] == ["scheduling.k8s.io"]] == [
        {
            "apiGroups": ["scheduling.k8s.io"],
            "resources": ["podgroups"],
            "verbs": ["get", "list", "watch"],
        },
        {"apiGroups": ["scheduling.k8s.io"], "resources": ["podgroups/status"], "verbs": ["patch"]},
    ]
    # ElasticQuota: read, and only status.used written (least privilege).
    quota_rules = [r for r in gangs if any(n.startswith("elasticquotas") for n in r["resources"])]
    assert quota_rules == [
        {
            "apiGroups": ["scheduling.x-k8s.io"],
            "resources": ["elasticquotas"],
            "verbs": ["get", "list", "watch"],
        },
        {
            "apiGroups": ["scheduling.x-k8s.io"],
            "resources": ["elasticquotas/status"],
            "verbs": ["patch"],
        },
    ]


def test_rbac_reads_what_dynamic_resources_reads() -> None:
    """kube-scheduler 1.37's reads in resource.k8s.io (``policy.go``), DeviceTaintRules
    included: the scheduler follows them where the API server serves them. Read from the
    rendered manifests (equal to the chart's render: see above), so no helm is needed."""
    objs = [d for d in yaml.safe_load_all((MANIFESTS / "scheduler.yaml").read_text()) if d]
    rules = find(objs, "ClusterRole", "lattice-scheduler")["rules"]
    dra = {
        resource: tuple(r["verbs"])
        for r in rules
        if r["apiGroups"] == ["resource.k8s.io"]
        for resource in r["resources"]
    }
    for read in ("deviceclasses", "resourceslices", "devicetaintrules"):
        assert dra.get(read) == ("get", "list", "watch"), read


def test_rbac_reads_kueue_topologies_and_writes_nothing_of_kueue() -> None:
    """``spec.topology.fromKueue`` lists and watches the named Topology (get for a look
    by name); nothing else of Kueue's is read or written."""
    objs = [d for d in yaml.safe_load_all((MANIFESTS / "scheduler.yaml").read_text()) if d]
    rules = find(objs, "ClusterRole", "lattice-scheduler")["rules"]
    kueue = [r for r in rules if "kueue.x-k8s.io" in r["apiGroups"]]
    assert kueue == [
        {
            "apiGroups": ["kueue.x-k8s.io"],
            "resources": ["topologies"],
            "verbs": ["get", "list", "watch"],
        }
    ]


def test_scheduler_is_ha_and_unprivileged(default: list[dict[str, Any]]) -> None:
    deploy = find(default, "Deployment")
    assert deploy["spec"]["replicas"] == 2
    pod = deploy["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "system-cluster-critical"
    assert pod["securityContext"]["runAsNonRoot"] is True
    ctr = pod["containers"][0]
    assert "--leader-elect" in ctr["args"]
    assert ctr["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert find(default, "PodDisruptionBudget")["spec"]["maxUnavailable"] == 1
    svc = find(default, "Service")
    assert svc["spec"]["ports"][0]["targetPort"] == "metrics"
    assert svc["spec"]["selector"] == deploy["spec"]["selector"]["matchLabels"]
    assert not [o for o in default if o["kind"] == "ServiceMonitor"]  # opt-in


def test_agent_mounts_only_what_it_reads_read_only(default: list[dict[str, Any]]) -> None:
    pod = find(default, "DaemonSet")["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "system-node-critical"
    assert pod["tolerations"] == [{"operator": "Exists"}]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert not pod.get("hostNetwork")
    assert not pod.get("hostPID")
    ctr = pod["containers"][0]
    assert ctr["securityContext"]["allowPrivilegeEscalation"] is False
    assert ctr["securityContext"]["privileged"] is False
    assert ctr["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    host = {v["name"]: v["hostPath"] for v in pod["volumes"]}
    assert host == {
        "sys": {"path": "/sys", "type": "Directory"},
        "proc": {"path": "/proc", "type": "Directory"},
        "kubelet-config": {"path": "/var/lib/kubelet/config.yaml", "type": "File"},
    }
    mounts = {m["name"]: m for m in ctr["volumeMounts"]}
    assert set(mounts) == set(host)
    assert all(m["readOnly"] for m in mounts.values())
    # The flag points at the mounted file (what scheduler/agent/kubelet.py reads).
    kubelet_arg = next(a for a in ctr["args"] if a.startswith("--kubelet-config="))
    assert kubelet_arg == f"--kubelet-config={mounts['kubelet-config']['mountPath']}"
    assert {"--report-interval=15", "--sample-interval=5", "--topology-interval=60"} <= set(
        ctr["args"]
    )


def test_admission_policy_matches_the_agents_service_account(
    default: list[dict[str, Any]],
) -> None:
    policy = find(default, "ValidatingAdmissionPolicy")
    condition = policy["spec"]["matchConditions"][0]["expression"]
    sa = find(default, "ServiceAccount", "lattice-agent")["metadata"]
    assert f"'system:serviceaccount:{sa['namespace']}:{sa['name']}'" in condition
    binding = find(default, "ValidatingAdmissionPolicyBinding")
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    crb = find(default, "ClusterRoleBinding", "lattice-agent")
    assert crb["subjects"] == [
        {"kind": "ServiceAccount", "name": sa["name"], "namespace": sa["namespace"]}
    ]


def test_values_reach_the_objects() -> None:
    objs = objects(
        render.render(
            *("--set", "scheduler.schedulerName=gpu-sched", "--set", "scheduler.replicas=3"),
            *("--set", "scheduler.namespace=sched", "--set", "agent.namespace=agents"),
            *("--set", "agent.reportInterval=30", "--set", "image.tag=9.9.9"),
            *("--set", "scheduler.serviceMonitor.enabled=true"),
        )
    )
    deploy = find(objs, "Deployment")
    ctr = deploy["spec"]["template"]["spec"]["containers"][0]
    assert deploy["spec"]["replicas"] == 3
    assert "--scheduler-name=gpu-sched" in ctr["args"]
    assert ctr["image"] == "ghcr.io/lattice-scheduler/lattice:9.9.9"
    agent = find(objs, "DaemonSet")
    assert agent["metadata"]["namespace"] == "agents"
    assert "--report-interval=30" in agent["spec"]["template"]["spec"]["containers"][0]["args"]
    assert find(objs, "ServiceMonitor")["metadata"]["namespace"] == "sched"
    assert "system:serviceaccount:agents:lattice-agent" in str(
        find(objs, "ValidatingAdmissionPolicy")["spec"]["matchConditions"]
    )
    assert {o["metadata"]["name"] for o in objs if o["kind"] == "Namespace"} == {"sched", "agents"}


def test_without_the_agent_nothing_of_it_is_rendered() -> None:
    objs = objects(render.render("--set", "agent.enabled=false"))
    assert [o for o in objs if o["kind"] == "Namespace"] == []
    objs = objects(
        render.render("--set", "agent.enabled=false", *render.MANIFEST_VALUES, namespace="x")
    )
    assert {o["metadata"]["name"] for o in objs if o["kind"] == "Namespace"} == {"lattice-system"}
    assert not [o for o in objs if o["metadata"]["name"].startswith("lattice-agent")]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (["--set", "scheduler.leaderElection.enabled=false"], "two leaders would both bind"),
        (["--set", "agent.namespace=lattice-system"], "must differ from scheduler.namespace"),
        (["--set", "agent.sampleInterval=20"], "at most agent.reportInterval"),
        # values.schema.json: a misspelt key is an error, not silently ignored.
        (["--set", "agent.reportIntervall=30"], "'reportIntervall' not allowed"),
        (["--set", "scheduler.logLevel=loud"], "must be one of"),
    ],
)
def test_values_that_would_break_are_refused(values: list[str], message: str) -> None:
    with pytest.raises(RuntimeError, match=message):
        render.render(*values)
