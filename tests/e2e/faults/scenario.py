"""One seeded fault run: `lattice run` behind :class:`FaultProxy` while pods stream in,
then the proxy heals and the API objects alone say whether anything was lost.

The workload mixes every write path of the binding cycle: plain pods (the binding),
pods with a WaitForFirstConsumer claim on local PVs (VolumeBinding's PreBind writes the
PV's claimRef and waits for the PV controller), pods with a ResourceClaimTemplate
(DynamicResources writes allocation and ``reservedFor``), gangs of plain pods and a gang
whose members have claims (PodGroups, placed all or nothing). The test client talks to
the API server directly; only Lattice goes through the proxy. Optionally kube-apiserver
is restarted in the middle of the fault window (the harness's ``restart_component``).

The audit (:func:`audit`) reads pods, claims, PVCs and PodGroups, and Lattice's own log
for ``pod_bound`` lines, and counts what a user would call a bug: a pod unbound with no
reason (``lost``), a pod logged bound twice or bound elsewhere than logged (``double``),
a device in two claims, a claim allocated or reserved for a pod that is gone or unbound
or on another node (``leaked``), a gang partly bound, and lines that show a binding task
died (``crashed``). ``after_heal`` is how long after the heal the last pod got a node.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import random
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, cast

import yaml
from kubernetes_asyncio import client

from lattice_dev.devcluster.profiles import node_name
from tests.e2e.differential.volumes_objects import claim_volume, pv, pvc, storage_class
from tests.e2e.faults.proxy import FaultMix, FaultProxy
from tests.e2e.lattice_proc import LatticeProcess
from tests.e2e.test_gangs import LABEL, create_group
from tests.e2e.test_scheduler import LEASE_NS, Plane, list_pods, pod
from tests.e2e.test_stream_recovery import (
    LEASE,
    TRANSIENT,
    _transient,
    create_pods_through_outages,
    tolerant_poll,
)

DEVICES_PER_NODE: Final = 8
GPU_NODES: Final = 3
"""Nodes with a ResourceSlice of the run's driver (of the plane's six)."""
KUBE_BAR: Final = 34.0
"""Seconds after the heal kube-scheduler 1.37.2 needed to bind the issue's workload (#36)."""
CRASH_LINES: Final = re.compile(
    r"binding_crashed|binding_unwind_failed|binding_settle_failed|"
    r"Task exception was never retrieved|IllegalTransition"
)


@dataclass(frozen=True)
class Workload:
    """How many pods of each kind stream in, over how long the faults last."""

    plain: int = 60
    volume: int = 6
    dra: int = 8
    gangs: int = 2
    gang_size: int = 4
    dra_gang_size: int = 3
    window: float = 20.0
    """Seconds of faults; the pods are created evenly over the first 3/4 of it."""
    grace: float = 90.0
    """Seconds after the heal before the audit gives up waiting for pods to bind."""
    restart: bool = False
    """Restart kube-apiserver in the middle of the window."""

    @property
    def total(self) -> int:
        gang_pods = self.gangs * self.gang_size + (self.dra_gang_size if self.dra_gang_size else 0)
        return self.plain + self.volume + self.dra + gang_pods


@dataclass
class Outcome:
    seed: int
    pods: int = 0
    bound: int = 0
    pending: int = 0
    """Unbound, with a PodScheduled=False condition saying why."""
    lost: int = 0
    """Unbound with no reason at all."""
    double: int = 0
    devices_twice: int = 0
    leaked: int = 0
    partial_gangs: int = 0
    crashed: int = 0
    after_heal: float | None = None
    """Seconds from the heal until every pod had a node (None: not within the grace)."""
    unbound_at_heal: int = 0
    restart_down: float | None = None
    exit_code: int | None = None
    failure: str | None = None
    """Why the run itself broke off (e.g. Lattice exited, never became leader)."""
    """`lattice run`'s exit code on SIGTERM after the audit: 0 is a graceful stop."""
    faults: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return (
            self.bound == self.pods
            and not (self.lost or self.double or self.devices_twice or self.leaked)
            and not (self.partial_gangs or self.crashed)
            and self.exit_code == 0
            and self.failure is None
        )


def proxy_kubeconfig(source: Path, target: Path, port: int) -> Path:
    """``source`` with every cluster's server moved to the proxy (same CA: TLS passes
    through, and the API server's certificate names 127.0.0.1)."""
    cfg = yaml.safe_load(source.read_text())
    for entry in cfg["clusters"]:
        entry["cluster"]["server"] = f"https://127.0.0.1:{port}"
    target.write_text(yaml.safe_dump(cfg))
    return target


def api_address(kubeconfig: Path) -> tuple[str, int]:
    server = yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
    host, port = str(server).removeprefix("https://").rsplit(":", 1)
    return host, int(port)


# -- objects ------------------------------------------------------------------------------


def driver_of(ns: str) -> str:
    return f"{ns}.faults.lattice.dev"


def cluster_objects(ns: str, volumes: int) -> list[dict[str, Any]]:
    """The run's cluster-scoped objects: DeviceClass, ResourceSlices, StorageClass, PVs
    (one local PV per claim plus two spare, spread over the nodes)."""
    driver = driver_of(ns)
    out: list[dict[str, Any]] = [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": f"{ns}-gpu"},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]},
        },
        {**storage_class(f"{ns}-local"), "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass"},
    ]
    for i in range(GPU_NODES):
        node = node_name(i)
        out.append(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {"name": f"{ns}-{node}"},
                "spec": {
                    "driver": driver,
                    "nodeName": node,
                    "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                    "devices": [{"name": f"gpu-{d}"} for d in range(DEVICES_PER_NODE)],
                },
            }
        )
    for i in range(volumes + 2):
        body = pv(f"{ns}-pv-{i}", "10Gi", storage_class=f"{ns}-local", host=node_name(i % 6))
        body.pop("status")
        out.append(body)
    return out


def namespaced_objects(ns: str) -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "one-gpu", "namespace": ns},
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [{"name": "gpu", "exactly": {"deviceClassName": f"{ns}-gpu"}}]
                    }
                }
            },
        }
    ]


def _gpu(body: dict[str, Any]) -> dict[str, Any]:
    body["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]
    return body


def _member(body: dict[str, Any], group: str) -> dict[str, Any]:
    body["metadata"]["labels"][LABEL] = group
    return body


def groups_of(w: Workload) -> dict[str, int]:
    """PodGroup name -> its members (minMember is all of them)."""
    out = {f"gang-{g}": w.gang_size for g in range(w.gangs)}
    if w.dra_gang_size:
        out["gpu-gang"] = w.dra_gang_size
    return out


def pod_bodies(ns: str, w: Workload, rng: random.Random) -> list[dict[str, Any]]:
    """Every pod of the run, in a seeded order (a gang's members stay together)."""
    singles: list[list[dict[str, Any]]] = []
    singles += [[pod(f"plain-{i}", cpu="100m")] for i in range(w.plain)]
    singles += [[_gpu(pod(f"gpu-{i}", cpu="100m"))] for i in range(w.dra)]
    for i in range(w.volume):
        body = pod(f"vol-{i}", cpu="100m")
        body["spec"]["volumes"] = [claim_volume("data", f"data-{i}")]
        singles.append([body])
    for g in range(w.gangs):
        group = f"gang-{g}"
        singles.append(
            [_member(pod(f"{group}-{m}", cpu="500m"), group) for m in range(w.gang_size)]
        )
    if w.dra_gang_size:
        singles.append(
            [
                _member(_gpu(pod(f"gpu-gang-{m}", cpu="100m")), "gpu-gang")
                for m in range(w.dra_gang_size)
            ]
        )
    rng.shuffle(singles)
    return [b for group in singles for b in group]


async def create_objects(plane: Plane, api: client.ApiClient, ns: str, w: Workload) -> None:
    plane.run("apply", "-f", "-", stdin=yaml.safe_dump_all(cluster_objects(ns, w.volume)))
    plane.run("apply", "-f", "-", stdin=yaml.safe_dump_all(namespaced_objects(ns)))
    core = client.CoreV1Api(api)
    for i in range(w.volume):
        body = pvc(f"data-{i}", "5Gi", namespace=ns, storage_class=f"{ns}-local")
        await core.create_namespaced_persistent_volume_claim(
            ns, cast(client.V1PersistentVolumeClaim, body)
        )
    for name, size in groups_of(w).items():
        await create_group(api, ns, name, size)


def delete_cluster_objects(plane: Plane, ns: str, w: Workload) -> None:
    bodies = cluster_objects(ns, w.volume)
    plane.run(
        "delete", "--ignore-not-found", "--wait=false", "-f", "-", stdin=yaml.safe_dump_all(bodies)
    )


# -- the run ------------------------------------------------------------------------------


async def stream(api: client.ApiClient, ns: str, bodies: list[dict[str, Any]], over: float) -> None:
    """Create the pods evenly over ``over`` seconds (a gang's members at once), retrying
    through an API server restart as a client with retries does."""
    started = time.monotonic()
    step = over / max(1, len(bodies))
    batch: list[dict[str, Any]] = []
    tasks = []
    for i, body in enumerate(bodies):
        batch.append(body)
        group = body["metadata"]["labels"].get(LABEL)
        following = bodies[i + 1]["metadata"]["labels"].get(LABEL) if i + 1 < len(bodies) else None
        if group is not None and following == group:
            continue
        delay = started + i * step - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(create_pods_through_outages(api, ns, batch)))
        batch = []
    await asyncio.gather(*tasks)


async def run_seed(
    plane: Plane, api: client.ApiClient, ns: str, seed: int, w: Workload, log_dir: Path
) -> Outcome:
    """Start Lattice behind a faulting proxy, stream the workload, heal, audit."""
    rng = random.Random(seed)
    outcome = Outcome(seed=seed, pods=w.total)
    await create_objects(plane, api, ns, w)
    proxy = FaultProxy(
        api_address(plane.user_kubeconfig), seed=rng.randrange(2**32), mix=FaultMix()
    )
    port = await proxy.start()
    kubeconfig = proxy_kubeconfig(
        plane.user_kubeconfig, log_dir / f"faults-{seed}.kubeconfig", port
    )
    sched = LatticeProcess(
        kubeconfig,
        log_dir / f"faults-{seed}.log",
        f"faults-{seed}",
        "--lease-namespace",
        LEASE_NS,
        *LEASE,
    ).start()
    try:
        await tolerant_poll(lambda: _logged(sched, "leader_elected"), within=60)
        bodies = pod_bodies(ns, w, rng)
        proxy.fault()
        faulted = time.monotonic()
        creating = asyncio.create_task(stream(api, ns, bodies, over=w.window * 0.75))
        if w.restart:
            await asyncio.sleep(w.window / 2)
            outcome.restart_down = await asyncio.to_thread(
                plane.cluster.restart_component, "kube-apiserver"
            )
        await creating
        await asyncio.sleep(max(0.0, faulted + w.window - time.monotonic()))
        await proxy.heal()
        healed = time.monotonic()
        outcome.unbound_at_heal = len(
            [p for p in await _tolerant_list(api, ns) if not p["spec"].get("nodeName")]
        )
        outcome.after_heal = await _wait_all_bound(api, ns, w.total, sched, healed, w.grace)
        outcome.faults = dict(proxy.counts)
        await audit(api, ns, w, sched, outcome)
    except Exception as exc:  # the row says so; the other seeds still run
        outcome.failure = repr(exc)
        outcome.faults = dict(proxy.counts)
    finally:
        # In a thread: the proxy runs on this loop, and the process's shutdown (the
        # lease released, bindings drained) goes through it.
        await asyncio.to_thread(sched.stop)
        await proxy.close()
        outcome.exit_code = sched.proc.returncode if sched.proc is not None else None
        if outcome.exit_code != 0:
            outcome.problems.append(f"lattice stopped with {outcome.exit_code}, not 0")
        with contextlib.suppress(Exception):
            delete_cluster_objects(plane, ns, w)
    return outcome


async def _logged(sched: LatticeProcess, event: str) -> bool:
    assert sched.proc is not None
    assert sched.proc.poll() is None, f"lattice exited ({sched.proc.returncode})"
    return any(line.get("event") == event for line in sched.lines())


async def _tolerant_list(api: client.ApiClient, ns: str) -> list[dict[str, Any]]:
    async def listed() -> list[dict[str, Any]]:
        return await list_pods(api, ns)

    return await tolerant_poll(listed, within=60)


async def _wait_all_bound(
    api: client.ApiClient,
    ns: str,
    total: int,
    sched: LatticeProcess,
    healed: float,
    grace: float,
) -> float | None:
    """Seconds after ``healed`` when all ``total`` pods first had a node, or None."""
    deadline = healed + grace
    while time.monotonic() < deadline:
        assert sched.proc is not None
        assert sched.proc.poll() is None, "lattice exited"
        try:
            pods = await list_pods(api, ns)
        except (client.ApiException, *TRANSIENT) as exc:
            if isinstance(exc, client.ApiException) and not _transient(exc):
                raise
            pods = []
        if len(pods) == total and all(p["spec"].get("nodeName") for p in pods):
            return time.monotonic() - healed
        await asyncio.sleep(0.25)
    return None


# -- the audit ----------------------------------------------------------------------------


async def _claims(api: client.ApiClient, ns: str) -> list[dict[str, Any]]:
    raw: Any = await client.CustomObjectsApi(api).list_namespaced_custom_object(
        "resource.k8s.io", "v1", ns, "resourceclaims", _preload_content=False
    )
    items: list[dict[str, Any]] = json.loads(await raw.read())["items"]
    return items


def _pending_reason(p: dict[str, Any]) -> str | None:
    for cond in (p.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return str(cond.get("reason") or "") or None
    return None


def _selector_nodes(allocation: dict[str, Any]) -> set[str] | None:
    """The nodes an allocation's nodeSelector names by hostname/metadata.name, or None
    when it selects by other labels."""
    out: set[str] = set()
    for term in (allocation.get("nodeSelector") or {}).get("nodeSelectorTerms") or []:
        for field_ in (term.get("matchFields") or []) + (term.get("matchExpressions") or []):
            if field_.get("key") in ("metadata.name", "kubernetes.io/hostname"):
                out.update(field_.get("values") or [])
    return out or None


async def audit(
    api: client.ApiClient, ns: str, w: Workload, sched: LatticeProcess, out: Outcome
) -> None:
    """Fill ``out`` from the API objects and Lattice's log (see the module docstring)."""
    pods = await list_pods(api, ns)
    by_name = {p["metadata"]["name"]: p for p in pods}
    by_uid = {p["metadata"]["uid"]: p for p in pods}
    if len(pods) != w.total:
        out.problems.append(f"{len(pods)} pods exist, {w.total} created")
    for p in pods:
        if p["spec"].get("nodeName"):
            out.bound += 1
        elif _pending_reason(p):
            out.pending += 1
        else:
            out.lost += 1
            out.problems.append(f"lost: {p['metadata']['name']} (no node, no reason)")
    # bound once, where it was logged bound
    logged: dict[str, list[str]] = collections.defaultdict(list)
    for line in sched.lines():
        if line.get("event") == "pod_bound" and str(line.get("pod", "")).startswith(f"{ns}/"):
            logged[str(line["pod"]).split("/", 1)[1]].append(str(line.get("node")))
    for name, nodes in logged.items():
        now = (by_name.get(name) or {}).get("spec", {}).get("nodeName")
        if len(nodes) > 1 or nodes[0] != now:
            out.double += 1
            out.problems.append(f"double: {name} logged bound to {nodes}, on {now}")
    # devices and claims
    holders: dict[tuple[str, str, str], list[str]] = collections.defaultdict(list)
    for claim in await _claims(api, ns):
        name = claim["metadata"]["name"]
        status = claim.get("status") or {}
        allocation = status.get("allocation")
        reserved = status.get("reservedFor") or []
        if allocation is None:
            if reserved:
                out.leaked += 1
                out.problems.append(f"leaked: {name} reserved but not allocated")
            continue
        for r in allocation["devices"]["results"]:
            holders[(r["driver"], r["pool"], r["device"])].append(name)
        if not reserved:
            out.leaked += 1
            out.problems.append(f"leaked: {name} allocated, reserved for no pod")
        on_nodes = _selector_nodes(allocation)
        for consumer in reserved:
            holder = by_uid.get(consumer.get("uid", ""))
            on = holder["spec"].get("nodeName") if holder else None
            if holder is None or not on or (on_nodes is not None and on not in on_nodes):
                out.leaked += 1
                out.problems.append(
                    f"leaked: {name} reserved for {consumer.get('name')} "
                    f"({'gone' if holder is None else on or 'unbound'}), allocated on {on_nodes}"
                )
    for device, claims in holders.items():
        if len(claims) > 1:
            out.devices_twice += 1
            out.problems.append(f"device {device} in {claims}")
    # pods with claims: bound means every claim allocated and reserved for it
    for p in pods:
        if not p["spec"].get("nodeName") or not p["spec"].get("resourceClaims"):
            continue
        statuses = (p.get("status") or {}).get("resourceClaimStatuses") or []
        if len(statuses) != len(p["spec"]["resourceClaims"]):
            out.problems.append(f"claims: {p['metadata']['name']} bound without its claims")
            out.leaked += 1
    # volumes: a bound pod's claim is bound to a PV on its node
    core = client.CoreV1Api(api)
    for p in pods:
        node = p["spec"].get("nodeName")
        for vol in p["spec"].get("volumes") or []:
            claim_name = (vol.get("persistentVolumeClaim") or {}).get("claimName")
            if not claim_name or not node:
                continue
            pvc_: Any = await core.read_namespaced_persistent_volume_claim(claim_name, ns)
            match = re.fullmatch(rf"{ns}-pv-(\d+)", pvc_.spec.volume_name or "")
            if match is None:
                out.problems.append(f"volume: {claim_name} of a bound pod has no PV of the run")
                out.leaked += 1
                continue
            host = node_name(int(match[1]) % 6)
            if host != node:
                out.problems.append(f"volume: {claim_name}'s PV is on {host}, its pod on {node}")
                out.leaked += 1
    # gangs
    for group, size in groups_of(w).items():
        members = [p for p in pods if p["metadata"]["labels"].get(LABEL) == group]
        bound = sum(1 for p in members if p["spec"].get("nodeName"))
        if 0 < bound < size:
            out.partial_gangs += 1
            out.problems.append(f"gang {group}: {bound}/{size} bound")
    # the process
    text = sched.log.read_text(errors="replace")
    crashes = [ln for ln in text.splitlines() if CRASH_LINES.search(ln)]
    out.crashed = len(crashes)
    out.problems += [f"log: {ln[:300]}" for ln in crashes[:5]]


HEADER: Final = (
    f"{'seed':>12} {'pods':>5} {'bound':>5} {'pend':>4} {'lost':>4} {'double':>6} "
    f"{'dev2x':>5} {'leaked':>6} {'partial':>7} {'crash':>5} {'unbound@heal':>12} "
    f"{'bind after heal':>15} {'faults':>6} {'exit':>4}"
)


def row(o: Outcome) -> str:
    after = "never" if o.after_heal is None else f"{o.after_heal:.1f} s"
    faults = sum(v for k, v in o.faults.items() if k not in ("connections", "chunks"))
    return (
        f"{o.seed:>12} {o.pods:>5} {o.bound:>5} {o.pending:>4} {o.lost:>4} {o.double:>6} "
        f"{o.devices_twice:>5} {o.leaked:>6} {o.partial_gangs:>7} {o.crashed:>5} "
        f"{o.unbound_at_heal:>12} {after:>15} {faults:>6} {o.exit_code!s:>4}"
    )
