"""API-shaped builders for pods, nodes and namespaces, after kube-scheduler's MakePod().

Builders produce the plain dicts the API server returns (camelCase keys), so every test goes
through ``Pod.from_api`` / ``Node.from_api`` and exercises parsing too::

    pod = make_pod("web", cpu="500m").label("app", "web").toleration("gpu", effect="NoSchedule")
    node = make_node("n1", cpu="4").label("zone", "a").taint("gpu", "true", "NoSchedule")
    snapshot = cluster([node], [(pod, "n1")])
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Self

from scheduler.core.snapshot import Snapshot
from scheduler.model.node import Namespace, Node
from scheduler.model.pod import Pod

Body = dict[str, Any]
_uids = itertools.count(1)


def expr(key: str, operator: str, *values: str) -> Body:
    """A ``matchExpressions`` entry."""
    out: Body = {"key": key, "operator": operator}
    if values:
        out["values"] = list(values)
    return out


def selector(labels: Mapping[str, str] | None = None, expressions: Sequence[Body] = ()) -> Body:
    """A ``metav1.LabelSelector`` body."""
    out: Body = {}
    if labels:
        out["matchLabels"] = dict(labels)
    if expressions:
        out["matchExpressions"] = list(expressions)
    return out


def _requests(cpu: str | None, memory: str | None, extra: Mapping[str, str] | None) -> Body:
    requests: Body = {}
    if cpu is not None:
        requests["cpu"] = cpu
    if memory is not None:
        requests["memory"] = memory
    requests.update(extra or {})
    return requests


class PodBuilder:
    def __init__(self, name: str, namespace: str = "default") -> None:
        self.body: Body = {
            "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{next(_uids)}"},
            "spec": {"containers": []},
        }

    @property
    def _meta(self) -> Body:
        meta: Body = self.body["metadata"]
        return meta

    @property
    def _spec(self) -> Body:
        spec: Body = self.body["spec"]
        return spec

    def namespace(self, namespace: str) -> Self:
        self._meta["namespace"] = namespace
        return self

    def uid(self, uid: str) -> Self:
        self._meta["uid"] = uid
        return self

    def label(self, key: str, value: str) -> Self:
        self._meta.setdefault("labels", {})[key] = value
        return self

    def labels(self, labels: Mapping[str, str]) -> Self:
        for key, value in labels.items():
            self.label(key, value)
        return self

    def terminating(self) -> Self:
        self._meta["deletionTimestamp"] = "2024-01-01T00:00:00Z"
        return self

    def container(
        self,
        cpu: str | None = None,
        memory: str | None = None,
        *,
        resources: Mapping[str, str] | None = None,
        limits: Mapping[str, str] | None = None,
        ports: Sequence[Body] = (),
        name: str | None = None,
    ) -> Self:
        body: Body = {"name": name or f"c{len(self._spec['containers'])}"}
        requests = _requests(cpu, memory, resources)
        if requests or limits:
            body["resources"] = {}
            if requests:
                body["resources"]["requests"] = requests
            if limits:
                body["resources"]["limits"] = dict(limits)
        if ports:
            body["ports"] = list(ports)
        self._spec["containers"].append(body)
        return self

    def init_container(
        self,
        cpu: str | None = None,
        memory: str | None = None,
        *,
        resources: Mapping[str, str] | None = None,
        sidecar: bool = False,
        ports: Sequence[Body] = (),
    ) -> Self:
        inits = self._spec.setdefault("initContainers", [])
        body: Body = {"name": f"init{len(inits)}"}
        requests = _requests(cpu, memory, resources)
        if requests:
            body["resources"] = {"requests": requests}
        if sidecar:
            body["restartPolicy"] = "Always"
        if ports:
            body["ports"] = list(ports)
        inits.append(body)
        return self

    def _last(self, kind: str) -> Body:
        """The last container of a kind (an app container is made if there is none)."""
        items: list[Body] = self._spec.setdefault(kind, [])
        if not items:
            items.append({"name": "c0" if kind == "containers" else f"{kind[:-1]}0"})
        return items[-1]

    def restart_rule(self, action: str = "RestartAllContainers", *, init: bool = False) -> Self:
        """A ``restartPolicyRules`` entry on the last app (or init) container."""
        rules = self._last("initContainers" if init else "containers")
        rules.setdefault("restartPolicyRules", []).append(
            {"action": action, "exitCodes": {"operator": "In", "values": [42]}}
        )
        return self

    def volume_mount(
        self, name: str = "v", *, bind_options: Sequence[str] = (), kind: str = "containers"
    ) -> Self:
        """A volume mount on the last container of ``kind``, with bind-mount options if any."""
        mount: Body = {"name": name, "mountPath": f"/mnt/{name}"}
        if bind_options:
            mount["bindMountOptions"] = list(bind_options)
        self._last(kind).setdefault("volumeMounts", []).append(mount)
        return self

    def host_network(self, value: bool = True) -> Self:
        self._spec["hostNetwork"] = value
        return self

    def host_users(self, value: bool) -> Self:
        self._spec["hostUsers"] = value
        return self

    def overhead(self, **resources: str) -> Self:
        self._spec["overhead"] = dict(resources)
        return self

    def pod_resources(self, **requests: str) -> Self:
        self._spec["resources"] = {"requests": dict(requests)}
        return self

    def host_port(self, port: int, protocol: str = "TCP", host_ip: str = "") -> Self:
        entry: Body = {"containerPort": port, "hostPort": port, "protocol": protocol}
        if host_ip:
            entry["hostIP"] = host_ip
        return self.container(ports=[entry])

    def node_name(self, name: str) -> Self:
        self._spec["nodeName"] = name
        return self

    def node_selector(self, labels: Mapping[str, str]) -> Self:
        self._spec["nodeSelector"] = dict(labels)
        return self

    def _affinity(self, kind: str) -> Body:
        affinity: Body = self._spec.setdefault("affinity", {}).setdefault(kind, {})
        return affinity

    def node_affinity_term(self, *expressions: Body, fields: Sequence[Body] = ()) -> Self:
        """Add a required nodeSelectorTerm (terms are ORed)."""
        required = self._affinity("nodeAffinity").setdefault(
            "requiredDuringSchedulingIgnoredDuringExecution", {"nodeSelectorTerms": []}
        )
        term: Body = {}
        if expressions:
            term["matchExpressions"] = list(expressions)
        if fields:
            term["matchFields"] = list(fields)
        required["nodeSelectorTerms"].append(term)
        return self

    def node_affinity_in(self, key: str, *values: str) -> Self:
        return self.node_affinity_term(expr(key, "In", *values))

    def preferred_node_affinity(self, weight: int, *expressions: Body) -> Self:
        preferred = self._affinity("nodeAffinity").setdefault(
            "preferredDuringSchedulingIgnoredDuringExecution", []
        )
        preferred.append({"weight": weight, "preference": {"matchExpressions": list(expressions)}})
        return self

    def _pod_term(
        self,
        topology_key: str,
        labels: Mapping[str, str] | None,
        expressions: Sequence[Body],
        namespaces: Sequence[str] | None,
        namespace_selector: Body | None,
        match_label_keys: Sequence[str],
        mismatch_label_keys: Sequence[str],
    ) -> Body:
        term: Body = {
            "labelSelector": selector(labels, expressions),
            "topologyKey": topology_key,
        }
        if namespaces is not None:
            term["namespaces"] = list(namespaces)
        if namespace_selector is not None:
            term["namespaceSelector"] = namespace_selector
        if match_label_keys:
            term["matchLabelKeys"] = list(match_label_keys)
        if mismatch_label_keys:
            term["mismatchLabelKeys"] = list(mismatch_label_keys)
        return term

    def pod_affinity(
        self,
        topology_key: str,
        labels: Mapping[str, str] | None = None,
        *,
        expressions: Sequence[Body] = (),
        anti: bool = False,
        weight: int | None = None,
        namespaces: Sequence[str] | None = None,
        namespace_selector: Body | None = None,
        match_label_keys: Sequence[str] = (),
        mismatch_label_keys: Sequence[str] = (),
    ) -> Self:
        """Add a required (``weight=None``) or preferred pod (anti-)affinity term."""
        kind = "podAntiAffinity" if anti else "podAffinity"
        term = self._pod_term(
            topology_key,
            labels,
            expressions,
            namespaces,
            namespace_selector,
            match_label_keys,
            mismatch_label_keys,
        )
        section = self._affinity(kind)
        if weight is None:
            section.setdefault("requiredDuringSchedulingIgnoredDuringExecution", []).append(term)
        else:
            section.setdefault("preferredDuringSchedulingIgnoredDuringExecution", []).append(
                {"weight": weight, "podAffinityTerm": term}
            )
        return self

    def pod_anti_affinity(
        self, topology_key: str, labels: Mapping[str, str] | None = None, **kwargs: Any
    ) -> Self:
        return self.pod_affinity(topology_key, labels, anti=True, **kwargs)

    def toleration(
        self, key: str = "", value: str = "", effect: str = "", operator: str = "Equal"
    ) -> Self:
        entry: Body = {"operator": operator}
        if key:
            entry["key"] = key
        if value:
            entry["value"] = value
        if effect:
            entry["effect"] = effect
        self._spec.setdefault("tolerations", []).append(entry)
        return self

    def spread(
        self,
        max_skew: int,
        topology_key: str,
        labels: Mapping[str, str] | None = None,
        *,
        hard: bool = True,
        expressions: Sequence[Body] = (),
        min_domains: int | None = None,
        node_affinity_policy: str | None = None,
        node_taints_policy: str | None = None,
        match_label_keys: Sequence[str] = (),
        label_selector: Body | None = None,
        null_selector: bool = False,
    ) -> Self:
        entry: Body = {
            "maxSkew": max_skew,
            "topologyKey": topology_key,
            "whenUnsatisfiable": "DoNotSchedule" if hard else "ScheduleAnyway",
            "labelSelector": label_selector
            if label_selector is not None
            else selector(labels, expressions),
        }
        if null_selector:
            entry["labelSelector"] = None
        if min_domains is not None:
            entry["minDomains"] = min_domains
        if node_affinity_policy is not None:
            entry["nodeAffinityPolicy"] = node_affinity_policy
        if node_taints_policy is not None:
            entry["nodeTaintsPolicy"] = node_taints_policy
        if match_label_keys:
            entry["matchLabelKeys"] = list(match_label_keys)
        self._spec.setdefault("topologySpreadConstraints", []).append(entry)
        return self

    def priority(self, value: int) -> Self:
        self._spec["priority"] = value
        return self

    def gate(self, name: str) -> Self:
        self._spec.setdefault("schedulingGates", []).append({"name": name})
        return self

    def obj(self) -> Body:
        """A deep copy of the API body."""
        body = copy.deepcopy(self.body)
        if not body["spec"]["containers"]:
            body["spec"]["containers"] = [{"name": "c0"}]
        return body

    def build(self) -> Pod:
        return Pod.from_api(self.obj())


def make_pod(
    name: str = "pod",
    cpu: str | None = None,
    memory: str | None = None,
    *,
    namespace: str = "default",
    resources: Mapping[str, str] | None = None,
) -> PodBuilder:
    """A pod with one container requesting the given resources (none by default)."""
    builder = PodBuilder(name, namespace)
    if cpu is not None or memory is not None or resources:
        builder.container(cpu, memory, resources=resources)
    return builder


class NodeBuilder:
    def __init__(self, name: str) -> None:
        self.body: Body = {
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "spec": {},
            "status": {"allocatable": {}},
        }

    def label(self, key: str, value: str) -> Self:
        self.body["metadata"]["labels"][key] = value
        return self

    def labels(self, labels: Mapping[str, str]) -> Self:
        for key, value in labels.items():
            self.label(key, value)
        return self

    def without_label(self, key: str) -> Self:
        self.body["metadata"]["labels"].pop(key, None)
        return self

    def taint(self, key: str, value: str = "", effect: str = "NoSchedule") -> Self:
        entry: Body = {"key": key, "effect": effect}
        if value:
            entry["value"] = value
        self.body["spec"].setdefault("taints", []).append(entry)
        return self

    def unschedulable(self, value: bool = True) -> Self:
        self.body["spec"]["unschedulable"] = value
        return self

    def declared_features(self, *names: str) -> Self:
        """``status.declaredFeatures`` (the API server keeps them sorted)."""
        self.body["status"]["declaredFeatures"] = sorted(names)
        return self

    def allocatable(self, **resources: str | int) -> Self:
        self.body["status"]["allocatable"].update(resources)
        return self

    def resource(self, name: str, amount: str | int) -> Self:
        self.body["status"]["allocatable"][name] = amount
        return self

    def obj(self) -> Body:
        return copy.deepcopy(self.body)

    def build(self) -> Node:
        return Node.from_api(self.obj())


def make_node(
    name: str = "node",
    cpu: str | int | None = "4",
    memory: str | None = "8Gi",
    pods: int | None = 110,
    **labels: str,
) -> NodeBuilder:
    builder = NodeBuilder(name)
    alloc: Body = {}
    if cpu is not None:
        alloc["cpu"] = cpu
    if memory is not None:
        alloc["memory"] = memory
    if pods is not None:
        alloc["pods"] = str(pods)
    builder.allocatable(**alloc)
    return builder.labels(labels)


def make_namespace(name: str, **labels: str) -> Namespace:
    return Namespace.from_api({"metadata": {"name": name, "labels": labels}})


PodLike = PodBuilder | Pod
NodeLike = NodeBuilder | Node


def as_pod(pod: PodLike) -> Pod:
    return pod.build() if isinstance(pod, PodBuilder) else pod


def as_node(node: NodeLike) -> Node:
    return node.build() if isinstance(node, NodeBuilder) else node


def cluster(
    nodes: Iterable[NodeLike],
    pods: Iterable[tuple[PodLike, str]] = (),
    namespaces: Iterable[Namespace] = (),
) -> Snapshot:
    """A snapshot with the given nodes, placed pods and namespaces."""
    return Snapshot(
        [as_node(n) for n in nodes],
        [(as_pod(p), node) for p, node in pods],
        namespaces,
    )


def quota_body(
    namespace: str,
    name: str = "quota",
    *,
    min: Mapping[str, str | int] | None = None,
    max: Mapping[str, str | int] | None = None,
) -> Body:
    """A scheduler-plugins ``ElasticQuota`` body (``scheduling.x-k8s.io/v1alpha1``)."""
    spec: Body = {}
    if min is not None:
        spec["min"] = dict(min)
    if max is not None:
        spec["max"] = dict(max)
    return {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "ElasticQuota",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }
