"""`just bench-quota`: tenants sharing kwok GPU nodes under ElasticQuotas, live.

The tenants of ``lattice simulate --tenants`` (same ``NAME:MIN:MAX:WEIGHT:LOAD[:START-END]``
specification, same defaults, :mod:`scheduler.sim.tenants`) get a namespace each with an
``ElasticQuota`` (GPU ``min``, ``max``, ``lattice.dev/quota-weight``), and a Poisson stream of
pods (1, 2, 4 or 8 GPUs; run times exponential around ``--run`` s, clipped at 4x) is
created for each inside its active window while one ``lattice run`` (policy Fair) schedules
them. Churn: a pod is deleted ``run`` s after it is first seen bound (it completed); a pod
deleted by anyone else (reclaim, preemption) is created again and runs in full, as the
simulator re-queues an evicted task.

Sampled every ``--sample`` s from a watch of the pods (the objects, not Lattice's own
view): each tenant's GPUs on nodes (a terminating pod still counts) and the GPUs its
waiting pods ask for; the quotas' ``status.used`` from a list of the ElasticQuotas. Figures
per tenant after ``--warmup`` s (the cluster starts empty), through the simulator's own
accounting (:class:`~scheduler.sim.tenants.TenantFigures`, the fair share from
:func:`~scheduler.sim.tenants.tenant_shares`, over ``min(cluster GPUs, sum of mins)`` as
the simulator's): GPUs used against guaranteed and fair share over time, the time-averaged
``|used - fair| / fair``, time to reach min (p99 of the episodes in which it was below its
min with a waiting pod that fits under it), samples above ``max`` (pods and
``status.used``; must be 0) and reclaim evictions (``Preempted`` Events naming an
ElasticQuota, counted in the victim's namespace). Beside them, the same stream through the
simulator: each tenant's deviation, and its reclaim evictions with their per-reclaim lower
bound (the offline minimum the live min rule's evictions are read against).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, cast

import numpy as np
from kubernetes_asyncio import client

from lattice_dev.benchmarks.common import apply_crds, start_lattice, wait_lattice_ready
from lattice_dev.devcluster.cluster import ClusterConfig, DevCluster
from lattice_dev.devcluster.kube import api_client
from lattice_dev.devcluster.profiles import get_profile
from scheduler.core.fairshare import WEIGHT_ANNOTATION
from scheduler.model.node import Node
from scheduler.model.pod import Pod
from scheduler.sim.tenants import (
    DEFAULT_TENANTS,
    FAIR,
    Job,
    Tenant,
    TenantFigures,
    arrivals,
    owed_min,
    parse_tenant,
    simulate_policy,
    tenant_shares,
)
from scheduler.sim.trace import Trace

GPU: Final = "nvidia.com/gpu"
GPUS_PER_NODE: Final = 8
SIZES: Final = (1, 2, 4, 8)
SIZE_WEIGHTS: Final = (0.4, 0.3, 0.2, 0.1)
"""Pod sizes in GPUs and how often each is drawn (mean 2.6 GPUs)."""
LABEL: Final = "lattice.dev/bench-quota"
EQ: Final = ("scheduling.x-k8s.io", "v1alpha1", "elasticquotas")
LS: Final = ("lattice.dev", "v1alpha1", "latticeschedulers")
RECLAIM_PREFIX: Final = "Reclaimed by ElasticQuota"


# --- pure pieces -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Arrival:
    at: float
    """Seconds after the stream starts."""
    tenant: str
    gpus: int
    run: float


def plan(
    tenants: Sequence[Tenant], cluster_gpus: int, horizon: float, mean_run: float, seed: int
) -> list[Arrival]:
    """Every tenant's pods, in time order: the simulator's arrival process
    (:func:`~scheduler.sim.tenants.arrivals`) with pod sizes from :data:`SIZES`."""
    mean_gpus = float(np.dot(SIZES, SIZE_WEIGHTS))

    def draw(rng: np.random.Generator) -> tuple[int, float]:
        gpus = int(rng.choice(SIZES, p=SIZE_WEIGHTS))
        return gpus, min(float(rng.exponential(mean_run)), 4 * mean_run)

    drawn = arrivals(
        tenants,
        cluster_gpus,
        horizon,
        np.random.default_rng(seed),
        draw,
        mean_gpus=mean_gpus,
        mean_run=mean_run,
    )
    return [Arrival(at, name, gpus, run) for at, name, (gpus, run) in drawn]


@dataclass(frozen=True, slots=True)
class Simulated:
    """The bench's stream through the simulator's ``fair`` policy (:func:`simulated`)."""

    deviation: dict[str, float | None]
    """Each tenant's ``|used - fair| / fair`` (%)."""
    evictions: int
    """Reclaim evictions over the whole run (the simulator reclaims under the min rule only:
    a quota below its min takes from borrowers)."""
    reclaims: int
    eviction_bound: int
    """The sum over those reclaims of the fewest pods any reclaim could have evicted for
    the same pod (:func:`~scheduler.sim.tenants.simulate_policy`'s per-reclaim bound): the
    offline minimum the live evictions of the same rule are counted against."""


def simulated(
    tenants: Sequence[Tenant],
    nodes: int,
    stream: Sequence[Arrival],
    horizon: float,
    warmup: float,
    seed: int,
) -> Simulated:
    """What the simulator's ``fair`` policy (:func:`~scheduler.sim.tenants.simulate_policy`)
    makes of this very stream on the same nodes: placement and reclaim at once, no API
    server, no backoff, exact times. What the live figures are to be read against: the
    part of the gap that pod sizes, the rules and the short horizon leave even without any
    delay, and the evictions the min rule needed with its lower bound."""
    profile = get_profile("gpu-8x")
    bodies = [profile.node_body(f"gpu-{i:03d}", i) for i in range(nodes)]
    trace = Trace([Node.from_api(b) for b in bodies], [], [], 0, "bench-quota", bodies)
    jobs = []
    for i, a in enumerate(stream):
        body = pod_body(f"{a.tenant}-{i:05d}", a.tenant, a.gpus)
        body["metadata"]["uid"] = f"{a.tenant}-{i:05d}"
        jobs.append(Job(i, a.tenant, Pod.from_api(body), a.gpus, a.at, a.run))
    run = simulate_policy(trace, tenants, jobs, horizon, FAIR, warmup=warmup, seed=seed)
    return Simulated(
        {n: f.deviation_pct for n, f in run.tenants.items()},
        run.evictions,
        run.reclaims,
        run.eviction_bound,
    )


@dataclass(frozen=True, slots=True)
class Sample:
    at: float
    used: Mapping[str, int]
    """GPUs of each tenant's pods on nodes."""
    waiting: Mapping[str, tuple[int, ...]]
    """GPUs of each tenant's pods not yet bound."""
    status_used: Mapping[str, int] = field(default_factory=dict)
    """Each quota's ``status.used`` GPUs, as Lattice wrote it."""


@dataclass(slots=True)
class Summary:
    figures: dict[str, TenantFigures]
    above_max: dict[str, int]
    """Samples in which the tenant's pods held more GPUs than its max."""
    status_above_max: dict[str, int]
    """Samples in which its quota's ``status.used`` said more than its max."""
    span: float


def summarize(tenants: Sequence[Tenant], pool: int, samples: Sequence[Sample]) -> Summary:
    """The simulator's per-tenant figures from samples: each sample's state held until
    the next one; an episode owed its min starts and ends at a sample."""
    names = [t.name for t in tenants]
    figures = {n: TenantFigures(n) for n in names}
    above = dict.fromkeys(names, 0)
    status_above = dict.fromkeys(names, 0)
    owed_since: dict[str, float] = {}
    for i, s in enumerate(samples):
        for t in tenants:
            if t.max is not None and s.used[t.name] > t.max:
                above[t.name] += 1
            if t.max is not None and s.status_used.get(t.name, 0) > t.max:
                status_above[t.name] += 1
            owed = owed_min(t, s.used[t.name], s.waiting[t.name])
            if owed and t.name not in owed_since:
                owed_since[t.name] = s.at
            elif not owed and t.name in owed_since:
                figures[t.name].owed.append(s.at - owed_since.pop(t.name))
        if i + 1 == len(samples):
            break
        dt = samples[i + 1].at - s.at
        demand = {n: s.used[n] + sum(s.waiting[n]) for n in names}
        shares = tenant_shares(tenants, pool, s.used, demand)
        for t in tenants:
            figures[t.name].add(s.used[t.name], shares[t.name], t.max, dt)
    for n in owed_since:
        figures[n].still_owed += 1
    if samples:
        for n in names:
            figures[n].still_waiting = len(samples[-1].waiting[n])
    span = samples[-1].at - samples[0].at if len(samples) > 1 else 0.0
    return Summary(figures, above, status_above, span)


def _num(value: float | None, fmt: str = "{:.1f}") -> str:
    return "-" if value is None else fmt.format(value)


def format_report(
    tenants: Sequence[Tenant],
    pool: int,
    samples: Sequence[Sample],
    *,
    windows: int,
    reclaimed: Mapping[str, int],
    preempted: Mapping[str, int],
    sim: Mapping[str, float | None] | None = None,
) -> str:
    """The per-tenant table, then GPU share over time (used / fair share per window);
    ``sim``: the same stream's deviation in the simulator (:func:`simulated`), a column."""
    whole = summarize(tenants, pool, samples)
    over = sum(whole.above_max.values()) + sum(whole.status_above_max.values())
    head = (
        f"{'tenant':8} {'min':>4} {'max':>4} {'weight':>6} {'used':>6} {'guar.':>6} "
        f"{'fair':>6} {'|u-f|/f':>8} {'to-min p99':>10} {'owed':>4} {'>max':>4} "
        f"{'status>max':>10} {'reclaimed':>9} {'preempted':>9} {'waiting':>7}"
        + ("" if sim is None else f" {'sim |u-f|/f':>11}")
    )
    rows = [head]
    for t in tenants:
        f = whole.figures[t.name]
        span = whole.span or 1.0
        toward = np.percentile(f.owed, 99) if f.owed else None
        rows.append(
            f"{t.name:8} {t.min:>4} {'-' if t.max is None else t.max:>4} "
            f"{float(t.weight):>6g} {f.used_area / span:>6.1f} {f.guaranteed_area / span:>6.1f} "
            f"{f.fair_area / span:>6.1f} {_num(f.deviation_pct, '{:.1f}%'):>8} "
            f"{_num(None if toward is None else float(toward), '{:.1f}s'):>10} "
            f"{len(f.owed) + f.still_owed:>4} {whole.above_max[t.name]:>4} "
            f"{whole.status_above_max[t.name]:>10} {reclaimed.get(t.name, 0):>9} "
            f"{preempted.get(t.name, 0):>9} {f.still_waiting:>7}"
            + ("" if sim is None else f" {_num(sim.get(t.name), '{:.1f}%'):>11}")
        )
    if len(samples) > 1 and windows > 0:
        t0, t1 = samples[0].at, samples[-1].at
        edges = [t0 + (t1 - t0) * k / windows for k in range(windows + 1)]
        rows.append("")
        rows.append("GPUs used / fair share, time-averaged per window (guaranteed min in brackets)")
        rows.append(
            f"{'window':>11} "
            + " ".join(f"{t.name + ' [' + str(t.min) + ']':>13}" for t in tenants)
        )
        for lo, hi in itertools.pairwise(edges):
            part = [s for s in samples if lo <= s.at <= hi]
            if len(part) < 2:
                continue
            got = summarize(tenants, pool, part)
            span = got.span or 1.0
            figs = [got.figures[t.name] for t in tenants]
            cells = [f"{f.used_area / span:.1f}/{f.fair_area / span:.1f}" for f in figs]
            rows.append(f"{lo:4.0f}-{hi:4.0f}s  " + " ".join(f"{c:>13}" for c in cells))
    if over:
        rows.append(f"ABOVE MAX in {over} samples (pods and status.used)")
    return "\n".join(rows)


def quota_body(tenant: Tenant) -> dict[str, Any]:
    spec: dict[str, Any] = {"min": {GPU: str(tenant.min)}}
    if tenant.max is not None:
        spec["max"] = {GPU: str(tenant.max)}
    return {
        "apiVersion": f"{EQ[0]}/{EQ[1]}",
        "kind": "ElasticQuota",
        "metadata": {
            "name": "quota",
            "namespace": tenant.name,
            "annotations": {WEIGHT_ANNOTATION: f"{float(tenant.weight):g}"},
        },
        "spec": spec,
    }


def pod_body(name: str, tenant: str, gpus: int) -> dict[str, Any]:
    resources = {
        "requests": {"cpu": "1", "memory": "4Gi", GPU: str(gpus)},
        "limits": {GPU: str(gpus)},
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": tenant, "labels": {LABEL: "yes"}},
        "spec": {
            "schedulerName": "lattice",
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {"name": "c", "image": "registry.k8s.io/pause:3.10", "resources": resources}
            ],
        },
    }


# --- live ------------------------------------------------------------------------------


@dataclass(slots=True)
class PodState:
    tenant: str
    gpus: int
    run: float
    node: str = ""
    created: float = 0.0
    """Seconds after the stream started (for ``--keep``'s timeline)."""
    bound: float | None = None
    ended: float | None = None
    completing: bool = False
    """Deleted by the stream (it ran its time): not an eviction."""
    gone: bool = False


class Stream:
    """Creates the pods, follows them through a watch, deletes them when they complete and
    creates an evicted one again."""

    def __init__(self, api: client.ApiClient, tenants: Sequence[Tenant]) -> None:
        self.core = client.CoreV1Api(api)
        self.objects = client.CustomObjectsApi(api)
        self.tenants = tenants
        self.pods: dict[tuple[str, str], PodState] = {}
        self.evicted: dict[str, int] = {t.name: 0 for t in tenants}
        self.tasks: set[asyncio.Task[None]] = set()
        self.t0 = time.monotonic()
        self.errors: list[str] = []

    def now(self) -> float:
        return time.monotonic() - self.t0

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def create(self, name: str, tenant: str, gpus: int, run: float) -> None:
        self.pods[(tenant, name)] = PodState(tenant, gpus, run, created=self.now())
        try:
            await self.core.create_namespaced_pod(
                tenant, cast(client.V1Pod, pod_body(name, tenant, gpus)), _preload_content=False
            )
        except client.ApiException as exc:
            self.errors.append(f"create {tenant}/{name}: {exc.status} {exc.reason}")
            self.pods[(tenant, name)].gone = True

    async def _complete(self, key: tuple[str, str], after: float) -> None:
        await asyncio.sleep(after)
        state = self.pods[key]
        if state.gone:
            return
        state.completing = True
        with contextlib.suppress(client.ApiException):
            await self.core.delete_namespaced_pod(key[1], key[0], grace_period_seconds=0)

    def _seen(self, kind: str, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        key = (str(meta.get("namespace")), str(meta.get("name")))
        state = self.pods.get(key)
        if state is None or state.gone:
            return
        node = (obj.get("spec") or {}).get("nodeName") or ""
        if node and not state.node:
            state.node = node
            state.bound = self.now()
            self._spawn(self._complete(key, state.run))
        if kind == "DELETED":
            state.gone = True
            state.ended = self.now()
            if not state.completing:
                self.evicted[state.tenant] += 1
                again = f"{key[1].split('.', 1)[0]}.{self.evicted[state.tenant]}"
                self._spawn(self.create(again, state.tenant, state.gpus, state.run))

    async def watch(self) -> None:
        """List then watch the bench's pods; resumes, and re-lists after 410 Gone."""
        rv = ""
        while True:
            try:
                if not rv:
                    raw: Any = await self.core.list_pod_for_all_namespaces(
                        label_selector=LABEL, _preload_content=False
                    )
                    body = json.loads(await raw.read())
                    for obj in body.get("items") or []:
                        self._seen("ADDED", obj)
                    rv = body["metadata"]["resourceVersion"]
                resp: Any = await self.core.list_pod_for_all_namespaces(
                    label_selector=LABEL,
                    watch=True,
                    resource_version=rv,
                    allow_watch_bookmarks=True,
                    timeout_seconds=120,
                    _preload_content=False,
                )
                try:
                    async for line in resp.content:
                        if not line.strip():
                            continue
                        ev = json.loads(line)
                        obj = ev.get("object") or {}
                        if ev.get("type") == "ERROR":
                            rv = ""
                            break
                        rv = (obj.get("metadata") or {}).get("resourceVersion") or rv
                        if ev.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                            self._seen(str(ev["type"]), obj)
                finally:
                    resp.release()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a cut watch: resume after a pause
                self.errors.append(f"watch: {type(exc).__name__}")
                await asyncio.sleep(0.5)

    async def sample(self) -> Sample:
        used = {t.name: 0 for t in self.tenants}
        waiting: dict[str, list[int]] = {t.name: [] for t in self.tenants}
        for state in self.pods.values():
            if state.gone:
                continue
            if state.node:
                used[state.tenant] += state.gpus
            else:
                waiting[state.tenant].append(state.gpus)
        status: dict[str, int] = {}
        with contextlib.suppress(client.ApiException):
            listed = await self.objects.list_cluster_custom_object(*EQ)
            for eq in listed.get("items", []):
                got = ((eq.get("status") or {}).get("used") or {}).get(GPU)
                if got is not None:
                    status[eq["metadata"]["namespace"]] = int(got)
        return Sample(
            time.monotonic() - self.t0,
            used,
            {n: tuple(w) for n, w in waiting.items()},
            status,
        )


def reclaim_rule(message: str) -> str | None:
    """Which reclaim rule a ``Preempted`` Event's message names (the preemptor's, as
    :func:`scheduler.core.reclaim.reclaimed` writes it): ``min`` (its quota was within its
    min, the victim's borrowed), ``fair share`` (above its min, within its fair share),
    None for a plain preemption."""
    if not message.startswith(RECLAIM_PREFIX):
        return None
    return "min" if message.endswith("used more than its min") else "fair share"


async def _events(
    core: client.CoreV1Api, tenants: Sequence[Tenant]
) -> tuple[dict[str, int], dict[str, int], Counter[str]]:
    """Per victim namespace: evictions by reclaim (the message names an ElasticQuota) and
    plain preemptions; and the reclaim evictions by rule (:func:`reclaim_rule`)."""
    reclaimed, preempted = {}, {}
    rules: Counter[str] = Counter()
    for t in tenants:
        got = await core.list_namespaced_event(t.name, field_selector="reason=Preempted")
        named = [reclaim_rule(e.message or "") for e in got.items]
        rules.update(r for r in named if r is not None)
        reclaimed[t.name] = sum(1 for r in named if r is not None)
        preempted[t.name] = len(named) - reclaimed[t.name]
    return reclaimed, preempted, rules


def evictions_line(rules: Mapping[str, int], sim: Simulated) -> str:
    """Live reclaim evictions by rule beside the simulator's on the same stream: the min
    rule's against the offline per-reclaim lower bound (the simulator has no fair-share
    rule, so those evictions have no offline count)."""
    live = sum(rules.values())
    return (
        f"reclaim evictions: live {live} (min rule {rules.get('min', 0)}, fair-share rule "
        f"{rules.get('fair share', 0)}); the same stream in the simulator (min rule only, "
        f"no delays): {sim.evictions} in {sim.reclaims} reclaims, per-reclaim lower bound "
        f"{sim.eviction_bound}"
    )


async def _bench(cluster: DevCluster, args: argparse.Namespace, tenants: list[Tenant]) -> str:
    cluster_gpus = args.nodes * GPUS_PER_NODE
    pool = min(cluster_gpus, sum(t.min for t in tenants))
    async with api_client(cluster.kubeconfig) as api:
        core = client.CoreV1Api(api)
        objects: Any = client.CustomObjectsApi(api)
        profile = get_profile("gpu-8x")
        await cluster.add_nodes([profile.node_body(f"gpu-{i:03d}", i) for i in range(args.nodes)])
        for t in tenants:
            await core.create_namespace(cast(client.V1Namespace, {"metadata": {"name": t.name}}))
            await objects.create_namespaced_custom_object(*EQ[:2], t.name, EQ[2], quota_body(t))
        with contextlib.suppress(client.ApiException):  # 409: already there
            await objects.create_cluster_custom_object(
                *LS,
                {
                    "apiVersion": f"{LS[0]}/{LS[1]}",
                    "kind": "LatticeScheduler",
                    "metadata": {"name": "lattice"},
                    "spec": {"schedulerName": "lattice", "quota": {"policy": "Fair"}},
                },
            )
        started = time.time()
        start_lattice(cluster, log_level="info" if args.keep else "warning")
        await wait_lattice_ready(objects, started)
        stream_plan = plan(tenants, cluster_gpus, args.duration, args.run, args.seed)
        stream = Stream(api, tenants)
        watching = asyncio.create_task(stream.watch())
        samples: list[Sample] = []

        async def sampler() -> None:
            while True:
                samples.append(await stream.sample())
                await asyncio.sleep(args.sample)

        stream.t0 = time.monotonic()
        sampling = asyncio.create_task(sampler())
        for i, a in enumerate(stream_plan):
            delay = stream.t0 + a.at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            stream._spawn(stream.create(f"{a.tenant}-{i:05d}", a.tenant, a.gpus, a.run))
        delay = stream.t0 + args.duration - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        sampling.cancel()
        watching.cancel()
        await asyncio.gather(sampling, watching, return_exceptions=True)
        for task in list(stream.tasks):
            task.cancel()
        reclaimed, preempted, rules = await _events(core, tenants)
    kept = [s for s in samples if s.at >= args.warmup]
    created = len(stream.pods)
    if args.keep:
        _keep(Path(args.keep), stream, samples)
    sim = simulated(tenants, args.nodes, stream_plan, args.duration, args.warmup, args.seed)
    report = format_report(
        tenants,
        pool,
        kept,
        windows=args.windows,
        reclaimed=reclaimed,
        preempted=preempted,
        sim=sim.deviation,
    )
    tail = (
        f"\n{args.nodes} kwok gpu-8x nodes ({cluster_gpus} GPUs, fair shares over {pool}); "
        f"{created} pods created ({sum(stream.evicted.values())} of them again after an "
        f"eviction) over {args.duration:g}s, mean run {args.run:g}s, seed {args.seed}; "
        f"{len(kept)} samples every {args.sample:g}s after {args.warmup:g}s of warm-up"
    )
    tail += "\n" + evictions_line(rules, sim)
    if stream.errors:
        tail += f"\nerrors: {len(stream.errors)} (first: {stream.errors[0]})"
    return report + tail


def _keep(where: Path, stream: Stream, samples: Sequence[Sample]) -> None:
    """The run's raw record for a later look: every pod's life and every sample."""
    where.mkdir(parents=True, exist_ok=True)
    pods = [
        {
            "namespace": ns,
            "name": name,
            "gpus": s.gpus,
            "run": round(s.run, 3),
            "node": s.node,
            "created": round(s.created, 3),
            "bound": None if s.bound is None else round(s.bound, 3),
            "ended": None if s.ended is None else round(s.ended, 3),
            "completed": s.completing,
        }
        for (ns, name), s in stream.pods.items()
    ]
    (where / "pods.json").write_text(json.dumps(pods, indent=1))
    (where / "samples.json").write_text(
        json.dumps(
            [
                {
                    "at": round(x.at, 3),
                    "used": x.used,
                    "waiting": x.waiting,
                    "status": x.status_used,
                }
                for x in samples
            ]
        )
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=8, help="kwok gpu-8x nodes (default 8)")
    parser.add_argument(
        "--tenants",
        nargs="*",
        metavar="NAME:MIN:MAX:WEIGHT:LOAD[:START-END]",
        help="as `lattice simulate --tenants` (windows: fractions of --duration); "
        "default: the simulator's four",
    )
    parser.add_argument("--duration", type=float, default=180.0, help="stream length, s")
    parser.add_argument("--run", type=float, default=20.0, help="mean pod run time, s")
    parser.add_argument("--warmup", type=float, default=20.0, help="s left out of the figures")
    parser.add_argument("--sample", type=float, default=1.0, help="s between samples")
    parser.add_argument("--windows", type=int, default=6, help="rows of the share-over-time table")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--keep",
        metavar="DIR",
        help="write the run's record there: lattice's log (at level info), every pod's "
        "life (pods.json) and every sample (samples.json)",
    )
    args = parser.parse_args(argv)
    tenants = [parse_tenant(t, args.nodes * GPUS_PER_NODE) for t in args.tenants or DEFAULT_TENANTS]
    scratch = Path(tempfile.mkdtemp(prefix="lattice-bench-quota-"))
    cluster = DevCluster(scratch / "state")
    started = time.monotonic()
    try:
        state = cluster.up(ClusterConfig(nodes=0))
        apply_crds(cluster, state)
        text = asyncio.run(_bench(cluster, args, tenants))
    finally:
        if args.keep and cluster.log("lattice").exists():
            Path(args.keep).mkdir(parents=True, exist_ok=True)
            shutil.copy(cluster.log("lattice"), Path(args.keep) / "lattice.log")
        cluster.down()
        shutil.rmtree(scratch, ignore_errors=True)
    print(text)
    print(f"(total {time.monotonic() - started:.0f}s)")
    return 0 if "ABOVE" not in text else 1


if __name__ == "__main__":
    sys.exit(main())
