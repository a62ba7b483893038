"""`lattice explain`: run the core on the live cluster for one pod, without binding.

Reads nodes, pods and namespaces once, builds a snapshot the way the running
scheduler sees the cluster, and prints why each node was rejected or how it
scored. A pod that is already bound is explained as if it were pending again
(its own capacity taken out), which answers "why did it land there".

Load: the profile and loadAware settings come from the LatticeScheduler object
(defaults if there is none). Each node's latest NodeTopology load report seeds
a predictor (one sample, so predicted = measured; the running scheduler's EWMA
has more history), and pods bound since that sample minus the settle delay
(their PodScheduled time) are added as in-flight estimates, as the scheduler
counts them. The load table shows, per node, the report's status and age, and
CPU / memory as measured, predicted and estimated in flight, and the total the
LoadAware plugin scored against.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml
from kubernetes_asyncio import client

from scheduler.control.dra import GROUP as DRA_GROUP
from scheduler.control.dra import VERSION as DRA_VERSION
from scheduler.control.dra import DraObjects
from scheduler.control.dra import Kind as DraKind
from scheduler.control.gangs import gang_of
from scheduler.control.kubeconfig import StartupError, load_credentials
from scheduler.control.kubeio import PODGROUP_GROUP, PODGROUP_PLURAL, PODGROUP_VERSION
from scheduler.control.kueue import read_once as read_kueue_levels
from scheduler.control.quotas import NamespaceUsage, QuotaBook
from scheduler.control.release import choose_release, server_version
from scheduler.control.settings import API_GROUP, API_VERSION, PLURAL, GangSettings, parse_spec
from scheduler.core.dra.allocator import diagnose
from scheduler.core.dra.state import DraState
from scheduler.core.explain import Decision
from scheduler.core.framework import Cycle
from scheduler.core.from_api import as_pending, scheduled_at, snapshot_from_api
from scheduler.core.gpus import Figures
from scheduler.core.load import LoadView, load_report
from scheduler.core.plugins.dynamic_resources import DynamicResources
from scheduler.core.plugins.gpu_placement import GpuPlacement
from scheduler.core.profile import DEFAULT_PROFILE, DYNAMIC_RESOURCES, GPU_PLACEMENT, Profile
from scheduler.core.quota import GROUP as QUOTA_GROUP
from scheduler.core.quota import PLURAL as QUOTA_PLURAL
from scheduler.core.quota import VERSION as QUOTA_VERSION
from scheduler.core.quota import (
    Quota,
    QuotaContext,
    QuotaSnapshot,
    Verdict,
    admit,
    charged,
    format_amount,
    format_vector,
)
from scheduler.core.schedule import Framework, framework_for, schedule
from scheduler.core.snapshot import Snapshot
from scheduler.core.topology.state import TopologyState
from scheduler.core.volumes import VolumeState, volume_state_from_api
from scheduler.model.errors import InvalidObjectError
from scheduler.model.gang import GangSpec
from scheduler.model.names import CPU, MEMORY
from scheduler.model.pod import (
    EPHEMERAL,
    NODE_CONSTRAINED_INLINE_SOURCES,
    PERSISTENT_VOLUME_CLAIM,
    Pod,
)
from scheduler.model.podgroup import gang_from_podgroup
from scheduler.model.topology import NodeTopology, NodeTopologyStatus, TopologyParseError
from scheduler.model.workload import (
    UPSTREAM_GROUP,
    UPSTREAM_PLURAL,
    UPSTREAM_VERSION,
    gang_from_upstream,
    is_upstream,
    object_name,
)
from scheduler.predict import CpuMem, LoadPredictor, NodeLoadBreakdown
from scheduler.solver import GangPlan, SolveStatus, build_problem, solve
from scheduler.solver.levels_view import LevelView, SliceView, level_views, slice_views

_STORAGE_VOLUME_KEYS = (PERSISTENT_VOLUME_CLAIM, EPHEMERAL, *NODE_CONSTRAINED_INLINE_SOURCES)
"""Volumes whose pod the volume plugins decide with the storage objects (claims, inline
disks' attach limits from CSINodes): explain lists them for such a pod only."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--kubeconfig",
        type=Path,
        help="default: the in-cluster service account, else $KUBECONFIG or ~/.kube/config",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("pod", nargs="?", help="NAMESPACE/POD of a pod in the cluster")
    source.add_argument("-f", "--filename", type=Path, help="a pod manifest (YAML or JSON)")
    source.add_argument(
        "--gang", metavar="NAMESPACE/PODGROUP", help="a PodGroup: the joint plan or why none"
    )
    parser.add_argument("-o", "--output", choices=("table", "json"), default="table")
    parser.add_argument("--seed", type=int, default=0, help="tie-break seed (default 0)")
    parser.add_argument(
        "--scheduler-name",
        default="lattice",
        help="LatticeScheduler whose profile and loadAware settings to use (default lattice)",
    )


@dataclass(frozen=True)
class GangExplained:
    """A gang's joint plan as the running scheduler would make it now."""

    gang: GangSpec
    placed: int
    pending: int
    plan: GangPlan
    partial_boost_s: int | None = None
    """A partial gang (members placed, fewer than minMember, others pending): how long it
    ranks ahead of every pod from the moment it became partial. None: not partial."""
    levels: tuple[LevelView, ...] = ()
    """Per topology level, the domains the plan uses and why the others were not."""
    slices: tuple[SliceView, ...] = ()


@dataclass(frozen=True)
class Explained:
    decision: Decision | None
    load: dict[str, NodeLoadBreakdown]
    skipped: list[str]
    gang: GangExplained | None = None
    gpus: Figures | None = None
    """GPUPlacement's per-node figures for the pod (None: it scored nothing)."""
    claims: dict[str, list[ClaimRow]] | None = None
    """Per node, the pod's claim requests there (None: it allocates no device)."""
    release_warning: str | None = None
    """Why the release mirrored is not the API server's own (None: it is)."""
    quota: QuotaExplained | None = None
    """The pod's ElasticQuota and CapacityScheduling's verdict (None: its namespace has none)."""


@dataclass(frozen=True)
class QuotaExplained:
    """What CapacityScheduling read for the pod: its quota, every quota's totals, the
    pod's request and the verdict."""

    namespace: str
    quota: Quota | None
    """None when the namespace's quota is invalid (the verdict says why)."""
    request: dict[str, int]
    total_used: dict[str, int]
    total_min: dict[str, int]
    verdict: Verdict


def explain_quota(snapshot: QuotaSnapshot, pod: Pod, dra: DraState | None) -> QuotaExplained | None:
    """The quota view of ``pod`` (None when its namespace has no quota)."""
    if not snapshot.governs(pod.namespace):
        return None
    request = charged(pod, dra)
    return QuotaExplained(
        pod.namespace,
        snapshot.of(pod.namespace),
        request,
        snapshot.total_used(),
        snapshot.total_min(),
        admit(snapshot, pod.namespace, request, priority=pod.priority),
    )


def quota_json(q: QuotaExplained) -> dict[str, Any]:
    quota = q.quota
    return {
        "namespace": q.namespace,
        "name": None if quota is None else quota.name,
        "admitted": q.verdict.admitted,
        "rule": q.verdict.rule.value,
        "message": q.verdict.message,
        "request": format_vector(q.request),
        "used": None if quota is None else format_vector(quota.used),
        "min": None if quota is None else format_vector(quota.min),
        "max": None if quota is None else format_vector(quota.max),
        "allQuotasUsed": format_vector(q.total_used),
        "sumOfMins": format_vector(q.total_min),
    }


def render_quota(q: QuotaExplained) -> str:
    """One line for the verdict, then per resource: the quota's used, min and max, what
    the pod asks, and the totals the min rule compares (all quotas' use, sum of mins)."""
    quota = q.quota
    verdict = "admitted" if q.verdict.admitted else f"refused ({q.verdict.rule.value} rule)"
    if quota is None:
        return f"Quota of namespace {q.namespace}: {verdict}: {q.verdict.message}"
    lines = [
        f"Quota {quota.key}: {verdict}" + (f": {q.verdict.message}" if q.verdict.message else "")
    ]
    header = ("RESOURCE", "USED", "MIN", "MAX", "POD ASKS", "ALL USED", "SUM OF MINS")
    rows = [header]
    names = sorted({*quota.used, *quota.min, *quota.max, *q.request})
    for r in names:
        rows.append(
            (
                r,
                format_amount(r, quota.used.get(r, 0)),
                format_amount(r, quota.min.get(r, 0)),
                format_amount(r, quota.max[r]) if r in quota.max else "-",
                format_amount(r, q.request.get(r, 0)),
                format_amount(r, q.total_used.get(r, 0)),
                format_amount(r, q.total_min.get(r, 0)),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines += [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows
    ]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    try:
        explained = asyncio.run(_explain_retrying(args))
    except (InvalidObjectError, ValueError, FileNotFoundError, StartupError) as exc:
        print(f"lattice explain: {exc}", file=sys.stderr)
        return 2
    except client.ApiException as exc:
        print(f"lattice explain: API error {exc.status}: {exc.reason}", file=sys.stderr)
        return 2
    if explained.release_warning is not None:
        print(f"warning: {explained.release_warning}", file=sys.stderr)
    for line in explained.skipped:
        print(f"warning: skipped unreadable {line}", file=sys.stderr)
    decision, gang = explained.decision, explained.gang
    if args.output == "json":
        data: dict[str, Any] = {} if decision is None else decision.to_json()
        data["load"] = {name: load_json(b) for name, b in explained.load.items()}
        if decision is not None and explained.gpus is not None:
            data["gpus"] = gpu_json(decision, explained.gpus)
        if explained.claims is not None:
            data["claims"] = {
                node: [dataclasses.asdict(r) for r in rows]
                for node, rows in explained.claims.items()
            }
        if gang is not None:
            data["gang"] = gang_json(gang)
        if explained.quota is not None:
            data["quota"] = quota_json(explained.quota)
        print(json.dumps(data, indent=2))
        return 0
    if decision is not None:
        print(render_table(decision))
        if explained.quota is not None:
            print()
            print(render_quota(explained.quota))
        if explained.gpus is not None:
            print()
            print(render_gpu_table(decision, explained.gpus))
        if explained.claims is not None:
            print()
            print(render_claims_table(decision, explained.claims))
        if any(b.status.name != "UNKNOWN" for b in explained.load.values()):
            print()
            print(render_load_table(decision, explained.load))
    if gang is not None:
        if decision is not None:
            print()
        print(render_gang(gang))
    return 0


EXPLAIN_ATTEMPTS: Final = 5
"""Whole read-only passes tried when the API server says 429 or 503 (it sheds load, or is
still starting): client-go retries those itself, kubernetes-asyncio does not."""


async def _explain_retrying(args: argparse.Namespace) -> Explained:
    delay = 0.5
    for attempt in range(1, EXPLAIN_ATTEMPTS + 1):
        try:
            return await _explain(args)
        except client.ApiException as exc:
            if exc.status not in (429, 503) or attempt == EXPLAIN_ATTEMPTS:
                raise
            headers: Any = exc.headers or {}
            after = str(headers.get("Retry-After") or "")
            await asyncio.sleep(float(after) if after.isdigit() else delay)
            delay = min(delay * 2, 4.0)
    raise AssertionError("unreachable")


async def _list(call: Any) -> list[dict[str, Any]]:
    resp = await call(_preload_content=False)
    items: list[dict[str, Any]] = json.loads(await resp.read())["items"]
    return items


async def _explain(args: argparse.Namespace) -> Explained:
    creds = await load_credentials(args.kubeconfig)
    async with client.ApiClient(configuration=creds.configuration) as api:
        # Scores as the cluster's own release, like `lattice run` (see release.py).
        release = choose_release(server_version(await client.VersionApi(api).get_code()))
        core = client.CoreV1Api(api)
        gang_ref: tuple[str, str] | None = None
        body: dict[str, Any] = {}
        if args.gang is not None:
            ns, sep, name = str(args.gang).partition("/")
            if not sep or not ns or not name:
                raise ValueError(f"expected NAMESPACE/PODGROUP, got {args.gang!r}")
            gang_ref = (ns, name)
        elif args.filename is not None:
            body = yaml.safe_load(args.filename.read_text())
            if not isinstance(body, dict) or body.get("kind") != "Pod":
                raise ValueError(f"{args.filename} is not a Pod manifest")
            body.setdefault("metadata", {}).setdefault("namespace", "default")
        else:
            ns, sep, name = str(args.pod).partition("/")
            if not sep or not ns or not name:
                raise ValueError(f"expected NAMESPACE/POD, got {args.pod!r}")
            raw: Any = await core.read_namespaced_pod(name, ns, _preload_content=False)
            body = json.loads(await raw.read())
        if body and not (body.get("spec") or {}).get("nodeName"):
            member_of = gang_of(body)
            if member_of is not None:
                ns, _, name = member_of.partition("/")
                gang_ref = (ns, name)
        nodes, pods, namespaces = await asyncio.gather(
            _list(core.list_node),
            _list(core.list_pod_for_all_namespaces),
            _list(core.list_namespace),
        )
        storage_lists: dict[str, list[dict[str, Any]]] = {}
        if gang_ref is not None or any(
            key in v
            for v in (body.get("spec") or {}).get("volumes") or []
            if isinstance(v, dict)
            for key in _STORAGE_VOLUME_KEYS
        ):
            st = client.StorageV1Api(api)
            listed = await asyncio.gather(
                _list(core.list_persistent_volume),
                _list(core.list_persistent_volume_claim_for_all_namespaces),
                _list(st.list_storage_class),
                _list(st.list_csi_node),
                _list(st.list_volume_attachment),
                _list(st.list_csi_driver),
                _list(st.list_csi_storage_capacity_for_all_namespaces),
            )
            kinds = ("pvs", "pvcs", "classes", "csi_nodes", "attachments", "csi_drivers")
            storage_lists = dict(zip((*kinds, "capacities"), listed, strict=True))
        custom = client.CustomObjectsApi(api)
        dra_lists: dict[DraKind, list[dict[str, Any]]] = {}
        if _may_use_dra(body):
            listed_dra = await asyncio.gather(
                *(_list_dra(custom, plural) for plural in _DRA_PLURALS.values())
            )
            dra_lists = dict(zip(_DRA_PLURALS, listed_dra, strict=True))
        try:
            reports: dict[str, Any] = await custom.list_cluster_custom_object(
                "lattice.dev", "v1alpha1", "nodetopologies"
            )
        except client.ApiException as exc:
            if exc.status != 404:
                raise
            reports = {"items": []}
        profile = dataclasses.replace(DEFAULT_PROFILE, kube_minor=release.kube_minor)
        gang_settings = GangSettings()
        levels: tuple[str, ...] = ()
        try:
            obj: dict[str, Any] = await custom.get_cluster_custom_object(
                API_GROUP, API_VERSION, PLURAL, args.scheduler_name
            )
        except client.ApiException as exc:
            if exc.status != 404:
                raise
        else:
            settings = parse_spec(
                obj.get("spec") or {}, args.scheduler_name, kube_minor=release.kube_minor
            )
            profile, gang_settings = settings.profile, settings.gang
            levels = settings.topology.levels
            if settings.topology.from_kueue is not None:
                levels = (await read_kueue_levels(api, settings.topology.from_kueue)).levels
            profile = dataclasses.replace(profile, domain_levels=levels)  # as the scheduler
        quota_bodies: list[dict[str, Any]] = []
        if body:
            try:
                listed_quotas: dict[str, Any] = await custom.list_cluster_custom_object(
                    QUOTA_GROUP, QUOTA_VERSION, QUOTA_PLURAL
                )
                quota_bodies = list(listed_quotas.get("items", []))
            except client.ApiException as exc:
                if exc.status not in (403, 404):  # no CRD, or no grant: no quota view
                    raise
        group_body: dict[str, Any] | None = None
        upstream = False
        if gang_ref is not None:
            # A scheduler-plugins PodGroup first, then Kubernetes' own (a pod names its kind).
            sources = [
                (PODGROUP_GROUP, PODGROUP_VERSION, PODGROUP_PLURAL, gang_ref[1], False),
                (UPSTREAM_GROUP, UPSTREAM_VERSION, UPSTREAM_PLURAL, object_name(gang_ref[1]), True),
            ]
            if is_upstream(gang_ref[1]):
                sources = sources[1:]
            elif args.gang is None:
                sources = sources[:1]
            for group, version, plural, name, from_upstream in sources:
                try:
                    group_body = await custom.get_namespaced_custom_object(
                        group, version, gang_ref[0], plural, name
                    )
                except client.ApiException as exc:
                    if exc.status != 404:
                        raise
                    continue
                upstream = from_upstream
                break
            if group_body is None and args.gang is not None:
                raise ValueError(f"PodGroup {gang_ref[0]}/{gang_ref[1]} not found")
    meta = body.get("metadata") or {}
    exclude = (str(meta.get("namespace")), str(meta.get("name"))) if body else None
    built = snapshot_from_api(
        nodes, pods, namespaces, exclude_pod=exclude, kube_minor=profile.kube_minor
    )
    topology = TopologyState()
    for report in reports.get("items", []):
        try:
            topology.set_node_topology(
                report["metadata"]["name"], NodeTopology.from_spec(report.get("spec") or {})
            )
        except (TopologyParseError, ValueError) as exc:
            built.skipped.append(f"nodetopology/{report['metadata']['name']}: {exc}")
    for row in range(built.snapshot.num_nodes):
        for placed in built.snapshot.pods_on(row):
            topology.pod_placed(placed, built.snapshot.node_names[row])
    now = time.time()
    predictor = seed_predictor(
        profile,
        reports.get("items", []),
        pods,
        exclude=f"{meta.get('namespace')}/{meta.get('name')}",
        skipped=built.skipped,
    )
    view = LoadView(predictor, now)
    volumes = None
    if storage_lists:
        placed_pods = [
            p for row in range(built.snapshot.num_nodes) for p in built.snapshot.pods_on(row)
        ]
        storage = volume_state_from_api(**storage_lists, placed_pods=placed_pods)
        built.skipped.extend(storage.skipped)
        volumes = storage.state
    dra = None
    if dra_lists:
        objects = DraObjects(DraState(), log=_Unlogged())
        for kind, items in dra_lists.items():
            for item in items:
                objects.upsert(kind, item)
        built.skipped.extend(f"{key}: {why}" for key, why in objects.broken.items())
        dra = objects.state
    seed_gpu_demand(topology, profile, built.snapshot, pods, args.scheduler_name)
    decision = None
    gpus = None
    claims = None
    quota_view = None
    if body:
        pod = Pod.from_api(as_pending(body))
        quotas = QuotaBook()
        for item in quota_bodies:
            quotas.upserted(item)
        usage = NamespaceUsage()
        for row in range(built.snapshot.num_nodes):
            for placed in built.snapshot.pods_on(row):
                usage.placed(placed)
        quota_snapshot = quotas.snapshot(usage, dra)
        quota_view = explain_quota(quota_snapshot, pod, dra)
        decision = schedule(
            built.snapshot,
            pod,
            profile,
            seed=args.seed,
            topology=topology,
            load=view,
            volumes=volumes,
            dra=dra,
            quota=QuotaContext(quota_snapshot) if len(quotas) else None,
        )
        if GPU_PLACEMENT not in decision.explanation.skipped_scores:
            gpus = gpu_figures(profile, built.snapshot, pod, topology)
        if dra is not None and pod.resource_claims:
            claims = claim_rows(decision, built.snapshot, pod, dra)
    gang = None
    if group_body is not None:
        gang = explain_gang(
            group_body,
            pods,
            framework_for(profile),
            built.snapshot,
            topology=topology,
            load=view,
            seed=args.seed,
            scheduler_name=args.scheduler_name,
            time_limit_s=gang_settings.solver_time_limit_s,
            use_solver=gang_settings.use_solver,
            volumes=volumes,
            partial_boost_s=gang_settings.partial_boost_s,
            dra=dra,
            levels=levels,
            upstream=upstream,
        )
    breakdowns = load_breakdowns(predictor, built.snapshot, now)
    warning = None if release.warning is None else f"{release.warning}; {release.describe()}"
    return Explained(decision, breakdowns, built.skipped, gang, gpus, claims, warning, quota_view)


class _Unlogged:
    """Unreadable DRA objects are listed with the other skipped objects, not logged."""

    def warning(self, event: str, **fields: Any) -> None:
        return None


_DRA_PLURALS: Final = {
    DraKind.CLASS: "deviceclasses",
    DraKind.SLICE: "resourceslices",
    DraKind.CLAIM: "resourceclaims",
    DraKind.TAINT_RULE: "devicetaintrules",
}


def _may_use_dra(body: dict[str, Any]) -> bool:
    """The pod has resource claims, or asks for a resource a DeviceClass may serve
    (DRA-backed extended resources): the DRA objects must be read."""
    if (body.get("spec") or {}).get("resourceClaims"):
        return True
    try:
        return bool(Pod.from_api(as_pending(body)).container_requests)
    except InvalidObjectError:
        return False  # the schedule call below says what is wrong with it


async def _list_dra(custom: client.CustomObjectsApi, plural: str) -> list[dict[str, Any]]:
    """Every object of a ``resource.k8s.io/v1`` collection (claims: all namespaces); none
    where the release does not serve it (DeviceTaintRules before 1.37)."""
    try:
        raw: Any = await custom.list_cluster_custom_object(
            DRA_GROUP, DRA_VERSION, plural, _preload_content=False
        )
    except client.ApiException as exc:
        if exc.status == 404 and plural == _DRA_PLURALS[DraKind.TAINT_RULE]:
            return []
        raise
    items: list[dict[str, Any]] = json.loads(await raw.read()).get("items", [])
    return items


def seed_gpu_demand(
    topology: TopologyState,
    profile: Profile,
    snapshot: Snapshot,
    pods: list[dict[str, Any]],
    scheduler_name: str,
) -> None:
    """The request mix as the running scheduler rebuilds it at start: the pods on nodes
    (the snapshot's) as arrivals in creation order, by the same call
    (:meth:`~scheduler.core.gpus.GpuDemand.observe_placed`), then ours still pending. (The
    running scheduler's mix has also seen pods that arrived since its start and are gone:
    this one approximates it.)"""
    demand = topology.gpu_demand
    demand.set_resources(profile.gpu_placement.resources)
    created = {_name_of(b): _created(b) for b in pods}
    demand.observe_placed(
        (created.get((p.namespace, p.name), ""), p)
        for row in range(snapshot.num_nodes)
        for p in snapshot.pods_on(row)
    )
    for body in sorted(pods, key=_created):
        spec = body.get("spec") or {}
        if spec.get("nodeName") or spec.get("schedulerName") != scheduler_name:
            continue
        try:
            pod = Pod.from_api(body)
        except InvalidObjectError:
            continue
        demand.set_pending(f"{pod.namespace}/{pod.name}", pod)


def _name_of(body: dict[str, Any]) -> tuple[str, str]:
    meta = body.get("metadata") or {}
    return str(meta.get("namespace", "")), str(meta.get("name", ""))


def _created(body: dict[str, Any]) -> str:
    return str((body.get("metadata") or {}).get("creationTimestamp", ""))


def gpu_figures(
    profile: Profile, snapshot: Snapshot, pod: Pod, topology: TopologyState
) -> Figures | None:
    """The figures GPUPlacement scored from, by the profile's own plugin instance."""
    for plugin, _ in framework_for(profile).plugins.scores:
        if isinstance(plugin, GpuPlacement):
            return plugin.figures(Cycle(snapshot, pod, topology=topology))
    return None


def gpu_json(decision: Decision, fig: Figures) -> dict[str, Any]:
    rows = decision.explanation.node_names
    return {
        "podGPUs": fig.gpus,
        "mix": [
            {
                "gpus": c.gpus,
                "share": round(c.share, 4),
                "cpuMilli": c.cpu_milli,
                "memory": c.memory,
            }
            for c in fig.classes
        ],
        "nodes": {
            rows[i]: {
                "freeGPUs": int(fig.free.gpus[i]),
                "allocatableGPUs": int(fig.free.capacity[i]),
                "fragmentationBefore": int(fig.before_milli[i]) / 1000,
                "fragmentationAfter": int(fig.after_milli[i]) / 1000,
            }
            for i in decision.explanation.feasible_rows.tolist()
        },
    }


@dataclass(frozen=True)
class ClaimRow:
    """One claim request on one node, as ``lattice explain`` shows it."""

    claim: str
    request: str
    needed: int | None
    """Devices asked (None: all that match)."""
    matching: int
    free: int
    chosen: list[str]
    """Devices the allocation would take (selected node only)."""
    error: str = ""
    tainted: int = 0
    """Matching devices in no allocation that an untolerated taint keeps from the request
    (not counted in ``free``)."""
    taints: list[str] = dataclasses.field(default_factory=list)
    """Their untolerated taints, ``key=value:Effect``."""


def claim_rows(
    decision: Decision, snapshot: Snapshot, pod: Pod, dra: DraState
) -> dict[str, list[ClaimRow]] | None:
    """Per feasible node and per node DynamicResources rejected: each request of the claims
    the pod still has to allocate, with the devices matching its selectors and free there,
    and on the selected node the devices chosen. None when no claim needs an allocation."""
    cycle = Cycle(snapshot, pod, dra=dra)
    plugin = DynamicResources()
    plugin.pre_filter(cycle)
    state = cycle.state.get(DYNAMIC_RESOURCES)
    to_allocate = getattr(state, "to_allocate", None)
    allocator = getattr(state, "allocator", None)
    if not to_allocate or allocator is None:
        return None
    chosen: dict[tuple[str, str], list[str]] = {}
    plan = decision.claim_plan
    for write in plan.writes if plan is not None else ():
        for r in (write.allocation or {}).get("devices", {}).get("results", []):
            key = (f"{write.namespace}/{write.name}", str(r["request"]))
            chosen.setdefault(key, []).append(f"{r['driver']}/{r['pool']}/{r['device']}")
    out: dict[str, list[ClaimRow]] = {}
    explanation = decision.explanation
    for name in explanation.node_names:
        verdict = explanation.node(name)
        if verdict.plugin is not None and verdict.plugin != DYNAMIC_RESOURCES:
            continue
        row = snapshot.index_of(name)
        assert row is not None
        node = snapshot.node(row)
        rows: list[ClaimRow] = []
        for view in diagnose(allocator, node.name, node.labels, to_allocate):
            picked = chosen.get((view.claim, view.request), []) if name == decision.selected else []
            rows.append(
                ClaimRow(
                    view.claim,
                    view.request,
                    view.needed,
                    view.matching,
                    view.free,
                    picked,
                    view.error,
                    view.tainted,
                    list(view.taints),
                )
            )
        out[name] = rows
    return out


CLAIM_ROWS_SHOWN: Final = 20
"""Nodes the text table lists (the JSON has them all)."""


def render_claims_table(decision: Decision, claims: dict[str, list[ClaimRow]]) -> str:
    """Per node and claim request: devices needed, matching the selectors, free, and
    (selected node) chosen; a request with fewer free than needed is why a node fails."""
    header = ["", "NODE", "CLAIM", "REQUEST", "NEED", "MATCH", "FREE", "CHOSEN / WHY NOT"]
    rows = [header]
    names = sorted(claims, key=lambda n: (n != decision.selected, n))
    for name in names[:CLAIM_ROWS_SHOWN]:
        verdict = decision.explanation.node(name)
        for r in claims[name]:
            short = r.needed is not None and r.free < r.needed
            if r.error:
                why = r.error
            elif r.chosen:
                why = ", ".join(r.chosen)
            elif short and r.taints:
                why = f"too few free devices ({r.tainted} tainted: {', '.join(r.taints)})"
            elif short:
                why = "too few free devices"
            elif verdict.plugin is not None:
                why = "; ".join(verdict.reasons)
            else:
                why = ""
            rows.append(
                [
                    "*" if name == decision.selected else "",
                    name,
                    r.claim,
                    r.request,
                    "all" if r.needed is None else str(r.needed),
                    str(r.matching),
                    str(r.free),
                    why,
                ]
            )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    title = "Claims (per node: devices the request needs, its selectors match, and are free)"
    more = len(names) - CLAIM_ROWS_SHOWN
    tail = [f"... {more} more nodes (-o json lists them)"] if more > 0 else []
    return "\n".join([title, *lines, *tail])


def render_gpu_table(decision: Decision, fig: Figures) -> str:
    """Per feasible node: free GPUs, and how many of them the request mix could not use
    before and after the pod (GPUPlacement prefers the smallest increase)."""
    names = decision.explanation.node_names
    header = ["", "NODE", "GPUS FREE", "FRAG BEFORE", "FRAG AFTER", "CHANGE"]
    rows = [header]
    order = sorted(
        decision.explanation.feasible_rows.tolist(),
        key=lambda i: (-int(fig.gain_milli[i]), names[i]),
    )
    for i in order:
        change = -int(fig.gain_milli[i]) / 1000
        rows.append(
            [
                "*" if names[i] == decision.selected else "",
                names[i],
                f"{int(fig.free.gpus[i])}/{int(fig.free.capacity[i])}",
                f"{int(fig.before_milli[i]) / 1000:.2f}",
                f"{int(fig.after_milli[i]) / 1000:.2f}",
                f"{change:+.2f}",
            ]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    mix = ", ".join(
        f"{c.gpus} GPU{'s' if c.gpus != 1 else ''} {100 * c.share:.0f}%" for c in fig.classes
    )
    title = f"GPUs (pod asks {fig.gpus}; FRAG = free GPUs the request mix cannot use"
    return "\n".join([title + (f"; mix: {mix})" if mix else ")"), *lines])


def explain_gang(
    group: dict[str, Any],
    pods: list[dict[str, Any]],
    framework: Framework,
    snapshot: Snapshot,
    *,
    topology: TopologyState,
    load: LoadView,
    seed: int,
    scheduler_name: str,
    time_limit_s: float,
    use_solver: bool,
    volumes: VolumeState | None = None,
    partial_boost_s: int = GangSettings.partial_boost_s,
    dra: DraState | None = None,
    levels: Sequence[str] = (),
    upstream: bool = False,
) -> GangExplained:
    """The plan the scheduler would make for the gang's pending members now: members
    bound already count toward minMember, as in the running scheduler (finished ones do
    not: they hold nothing). ``partial_boost_s``: the scheduler's ``partialBoostSeconds``."""
    spec = gang_from_upstream(group) if upstream else gang_from_podgroup(group)
    placed = 0
    pending: list[Pod] = []
    for body in pods:
        meta, pod_spec = body.get("metadata") or {}, body.get("spec") or {}
        if meta.get("namespace") != spec.namespace:
            continue
        if gang_of(body) != spec.key:
            continue
        if pod_spec.get("nodeName"):
            placed += (body.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        elif pod_spec.get("schedulerName") == scheduler_name and not meta.get("deletionTimestamp"):
            member = Pod.from_api(body)
            if not member.scheduling_gates:
                pending.append(member)
    need = spec.min_member - placed
    boost: int | None = None
    if placed and need > 0 and pending:
        timeout = spec.schedule_timeout_s
        boost = timeout if timeout is not None else partial_boost_s
    if need <= 0 or not pending:
        reason = "admitted" if need <= 0 else "no pending members"
        plan = GangPlan(
            status=SolveStatus.OPTIMAL if need <= 0 else SolveStatus.INFEASIBLE,
            placements=(),
            admitted=need <= 0,
            message=f"gang {spec.key}: {reason}",
            solve_time_s=0.0,
            members=(),
            need=max(need, 0),
        )
        return GangExplained(spec, placed, len(pending), plan, boost)
    problem = build_problem(
        framework,
        snapshot,
        spec,
        pending,
        need=min(need, len(pending)),
        topology=topology,
        load=load,
        seed=seed,
        volumes=volumes,
        dra=dra,
        levels=levels,
    )
    plan = solve(problem, time_limit_s=time_limit_s, seed=seed, use_solver=use_solver)
    return GangExplained(
        spec,
        placed,
        len(pending),
        plan,
        boost,
        levels=level_views(problem, plan, snapshot, spec, levels),
        slices=slice_views(problem, plan, snapshot),
    )


def gang_json(g: GangExplained) -> dict[str, Any]:
    p = g.plan
    return {
        "gang": g.gang.key,
        "minMember": g.gang.min_member,
        "placed": g.placed,
        "pending": g.pending,
        "need": p.need,
        "status": p.status.value,
        "admitted": p.admitted,
        "message": p.message,
        "solveSeconds": round(p.solve_time_s, 6),
        "buildSeconds": round(p.build_time_s, 6),
        "variables": p.variables,
        "classes": p.classes,
        "greedyPlaced": p.greedy_placed,
        "domain": p.domain,
        "placements": {m.pod: m.node for m in p.members if m.node is not None},
        "partialBoostSeconds": g.partial_boost_s,
        "levels": [
            {
                "key": v.key,
                "role": v.role,
                "domains": [
                    {
                        "name": d.name,
                        "nodes": d.nodes,
                        "room": d.room,
                        "gpusFree": d.gpus_free,
                        "planned": d.planned,
                        "verdict": d.verdict,
                    }
                    for d in v.domains
                ],
            }
            for v in g.levels
        ],
        "slices": [
            {"slice": v.index, "domain": v.domain, "members": list(v.members)} for v in g.slices
        ],
        "members": [
            {
                "pod": m.pod,
                "class": m.member_class,
                "feasibleNodes": m.feasible_nodes,
                "node": m.node,
                "score": m.score,
                "rejectingPlugins": list(m.rejecting_plugins),
                "summary": m.summary,
            }
            for m in p.members
        ],
    }


def render_gang(g: GangExplained) -> str:
    """Per member: the class it was merged into, its feasible nodes, the plan's node."""
    p = g.plan
    lines = [
        f"gang {g.gang.key}: minMember {g.gang.min_member}, placed {g.placed}, "
        f"pending {g.pending}, need {p.need}",
        f"solver: {p.status.value} in {p.solve_time_s * 1000:.1f} ms "
        f"(build {p.build_time_s * 1000:.1f} ms, {p.variables} variables, {p.classes} classes, "
        f"greedy placed {p.greedy_placed})" + (f", domain {p.domain}" if p.domain else ""),
        p.message,
    ]
    if g.partial_boost_s is not None:
        source = (
            "its scheduleTimeoutSeconds"
            if g.gang.schedule_timeout_s is not None
            else "spec.gang.partialBoostSeconds: the PodGroup sets no scheduleTimeoutSeconds"
        )
        lines.append(
            f"partial: {g.placed}/{g.gang.min_member} members placed; the gang ranks ahead of "
            f"every pod for at most {g.partial_boost_s} s from the moment it became partial "
            f"({source}), then by its members' priority"
        )
    lines.extend(_render_levels(g))
    if p.members:
        rows = [["MEMBER", "CLASS", "FEASIBLE NODES", "PLAN", "SCORE", "REJECTED BY"]]
        for m in p.members:
            rows.append(
                [
                    m.pod,
                    str(m.member_class),
                    str(m.feasible_nodes),
                    m.node or "-",
                    "-" if m.score is None else str(m.score),
                    ", ".join(m.rejecting_plugins) or "-",
                ]
            )
        lines.append("")
        lines.extend(_table(rows))
    return "\n".join(lines)


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def _render_levels(g: GangExplained) -> list[str]:
    """Per level, widest first: each domain's room against the gang's need and its verdict;
    then the slices."""
    lines: list[str] = []
    for view in g.levels:
        lines.append("")
        lines.append(f"level {view.key}" + (f" ({view.role})" if view.role else ""))
        rows = [["  DOMAIN", "NODES", "ROOM", "GPUS FREE", "PLAN", "VERDICT"]]
        rows.extend(
            [
                f"  {d.name}",
                str(d.nodes),
                str(d.room),
                str(d.gpus_free),
                str(d.planned) if d.planned else "-",
                d.verdict,
            ]
            for d in view.domains
        )
        lines.extend(_table(rows))
    if g.slices:
        lines.append("")
        rows = [["SLICE", "DOMAIN", "MEMBERS"]]
        rows.extend([str(v.index), v.domain, ", ".join(v.members)] for v in g.slices)
        lines.extend(_table(rows))
    return lines


def seed_predictor(
    profile: Profile,
    reports: list[dict[str, Any]],
    pods: list[dict[str, Any]],
    *,
    exclude: str = "",
    skipped: list[str] | None = None,
) -> LoadPredictor:
    """A predictor holding each node's latest report and the pods bound since (see module)."""
    config = profile.load_aware.predict
    predictor = LoadPredictor(config)
    sample_times: dict[str, float] = {}
    for report in reports:
        name = str(report.get("metadata", {}).get("name", ""))
        raw = report.get("status")
        if not raw:
            continue
        try:
            status = NodeTopologyStatus.from_status(raw)
        except (TopologyParseError, ValueError) as exc:
            if skipped is not None:
                skipped.append(f"nodetopology/{name} status: {exc}")
            continue
        load = status.load
        if load is None:
            continue
        predictor.observe_report(load_report(name, load, status.pressure))
        sample_times[name] = load.sample_time.timestamp()
    for body in pods:
        meta, spec = body.get("metadata") or {}, body.get("spec") or {}
        node = spec.get("nodeName")
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        if not node or node not in sample_times or key == exclude:
            continue
        placed = scheduled_at(body)
        if placed is None or placed < sample_times[node] - config.settle_delay_s:
            continue  # the report already shows this pod
        try:
            requests = Pod.from_api(body).resources.requests
        except InvalidObjectError:
            continue
        predictor.note_placement(
            node, key, requests.get(CPU, 0), requests.get(MEMORY, 0), now=placed
        )
    return predictor


def load_breakdowns(
    predictor: LoadPredictor, snapshot: Snapshot, now: float
) -> dict[str, NodeLoadBreakdown]:
    cpu, mem = snapshot.resource_column(CPU), snapshot.resource_column(MEMORY)
    out: dict[str, NodeLoadBreakdown] = {}
    for row, name in enumerate(snapshot.node_names):
        req = CpuMem(
            float(snapshot.requested[cpu, row]) if cpu is not None else 0.0,
            float(snapshot.requested[mem, row]) if mem is not None else 0.0,
        )
        alloc = CpuMem(
            float(snapshot.allocatable[cpu, row]) if cpu is not None else 0.0,
            float(snapshot.allocatable[mem, row]) if mem is not None else 0.0,
        )
        out[name] = predictor.explain(name, requested=req, allocatable=alloc, now=now)
    return out


def load_json(b: NodeLoadBreakdown) -> dict[str, Any]:
    def pair(v: CpuMem | None) -> dict[str, float] | None:
        return (
            None
            if v is None
            else {"cpuMillicores": round(v.cpu, 1), "memoryBytes": round(v.memory)}
        )

    return {
        "status": b.status.name.lower(),
        "ageSeconds": None if b.age_s is None else round(b.age_s, 1),
        "measured": pair(b.measured),
        "predicted": pair(b.predicted),
        "inflight": pair(b.inflight),
        "inflightPods": list(b.inflight_pods),
        "requested": pair(b.requested),
        "total": pair(b.total),
        "capacity": pair(b.capacity),
        "utilisation": {
            "cpu": round(b.utilisation.cpu, 4),
            "memory": round(b.utilisation.memory, 4),
        },
    }


def render_load_table(decision: Decision, load: dict[str, NodeLoadBreakdown]) -> str:
    """Per node: what LoadAware saw. Percentages of the capacity the total is measured by."""

    def pct(v: float, cap: float) -> str:
        return "-" if cap <= 0 or v != v else f"{100 * v / cap:.0f}%"

    header = [
        "",
        "NODE",
        "LOAD",
        "AGE",
        "CPU MEASURED",
        "CPU PREDICTED",
        "CPU IN-FLIGHT",
        "CPU TOTAL",
        "MEM MEASURED",
        "MEM PREDICTED",
        "MEM IN-FLIGHT",
        "MEM TOTAL",
        "PODS IN-FLIGHT",
    ]
    rows = [header]
    for name in sorted(load, key=lambda n: (load[n].utilisation.cpu, n)):
        b = load[name]
        cap = b.capacity
        rows.append(
            [
                "*" if name == decision.selected else "",
                name,
                b.status.name.lower() + ("" if b.status.name == "FRESH" else " (by requests)"),
                "-" if b.age_s is None else f"{b.age_s:.0f}s",
                "-" if b.measured is None else pct(b.measured.cpu, cap.cpu),
                "-" if b.predicted is None else pct(b.predicted.cpu, cap.cpu),
                pct(b.inflight.cpu, cap.cpu),
                pct(b.total.cpu, cap.cpu),
                "-" if b.measured is None else pct(b.measured.memory, cap.memory),
                "-" if b.predicted is None else pct(b.predicted.memory, cap.memory),
                pct(b.inflight.memory, cap.memory),
                pct(b.total.memory, cap.memory),
                str(len(b.inflight_pods)),
            ]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return "\n".join(
        ["load (what LoadAware scored: total = predicted + in-flight when fresh)", *lines]
    )


def render_table(decision: Decision) -> str:
    """Nodes x plugins: feasible nodes first by rank, the chosen one marked with '*'."""
    data = decision.to_json()
    nodes: dict[str, Any] = data["nodes"]
    plugins = list(data["weights"])
    feasible = sorted(
        (n for n, v in nodes.items() if v["filter"] is None),
        key=lambda n: (bool(nodes[n]["passed_over"]), -(nodes[n]["total"] or 0), n),
    )
    rejected = sorted(n for n, v in nodes.items() if v["filter"] is not None)
    header = ["", "NODE", *(f"{p}(x{data['weights'][p]})" for p in plugins), "TOTAL", "FILTER"]
    rows = [header]
    for name in feasible + rejected:
        v = nodes[name]
        mark = "*" if name == decision.selected else ""
        scores = [str(v["weighted_scores"].get(p, "")) for p in plugins]
        total = "" if v["total"] is None else str(v["total"])
        if v["filter"] is not None:
            verdict = f"{v['plugin']}: {v['filter']}"
        elif v["passed_over"]:
            verdict = "ok, ranked last: " + "; ".join(v["passed_over"])
        else:
            verdict = "ok"
        rows.append([mark, name, *scores, total, verdict])
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    pod = data["pod"]
    chosen = decision.selected or "none"
    return "\n".join([f"pod {pod}: selected {chosen}", *lines, "", data["summary"]])
