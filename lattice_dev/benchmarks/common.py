"""Helpers the benchmarks share: a binding watcher, paced pod creation, CRD installation."""

from __future__ import annotations

import asyncio
import compileall
import contextlib
import json
import subprocess
import sys
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from pathlib import Path
from typing import Any, cast

import aiohttp
from kubernetes_asyncio import client

import scheduler
from lattice_dev.devcluster.cluster import ClusterState, DevCluster
from scheduler.model.topology import parse_time

REPO = Path(__file__).resolve().parents[2]

BoundCallback = Callable[[str, str, float], None]
"""Called as (pod name, node name, monotonic time) when a pod is first seen bound."""

Event = dict[str, Any]
"""One decoded watch event: ``{"type": ..., "object": {...}}``."""


class WatchError(RuntimeError):
    """The API server ended a watch with an error other than 410 Gone."""


class Watcher:
    """Records when, and where, each pod of a namespace is first seen bound.

    A benchmark's figures are only as good as this watch, so it must not lose
    pods when the API server closes it (its own timeout, or a slow reader
    dropped while a fast scheduler floods it with binding events): a paged LIST,
    then WATCH with bookmarks resumed from the last resourceVersion seen; only
    410 Gone (that version compacted away) costs a re-list. A re-list records
    the pods bound while the watch was down at the re-list's time, and lists
    them in :attr:`relisted`: their bind times, and so the pods/s they enter,
    are an upper bound, which the benchmark says when it prints the figure.
    """

    def __init__(
        self,
        api: client.ApiClient,
        ns: str,
        on_bound: BoundCallback | None = None,
        *,
        timeout_seconds: int = 300,
        page_size: int = 500,
    ) -> None:
        self.core = client.CoreV1Api(api)
        self.ns = ns
        self.bound: dict[str, float] = {}
        """Pod name -> time.monotonic() when first seen bound."""
        self.nodes: dict[str, str] = {}
        """Pod name -> node it was bound to."""
        self.relisted: set[str] = set()
        """Pods first seen bound by a re-list after 410 Gone, timed at the re-list."""
        self.reconnects = 0
        """Watches resumed from the last resourceVersion (closed by the server or the network)."""
        self.cuts: dict[str, int] = {}
        """Of those, the ones ended by an error rather than the server: error type -> count."""
        self.relists = 0
        """Re-lists after 410 Gone."""
        self.rv: str | None = None
        """Where the next watch resumes; None until the first list."""
        self.on_bound = on_bound
        self.timeout_seconds = timeout_seconds
        self.page_size = page_size
        self._task: asyncio.Task[None] | None = None
        self.started = asyncio.Event()
        """Set once the first list is in: every later binding will be seen."""

    def _saw(self, obj: dict[str, Any], now: float, *, relisted: bool) -> None:
        meta = obj.get("metadata") or {}
        name = meta.get("name")
        node = (obj.get("spec") or {}).get("nodeName")
        if not node or not name or name in self.bound:
            return
        self.bound[name] = now
        self.nodes[name] = node
        if relisted:
            self.relisted.add(name)
        if self.on_bound is not None:
            self.on_bound(name, node, now)

    async def _list(self, *, relisted: bool) -> str:
        """A paged LIST of the namespace (one consistent snapshot); its resourceVersion."""
        token = ""
        while True:
            page: dict[str, Any] = {"_continue": token} if token else {}
            try:
                resp: Any = await self.core.list_namespaced_pod(
                    self.ns, limit=self.page_size, _preload_content=False, **page
                )
            except client.ApiException as exc:
                if exc.status != 410 or not token:
                    raise
                token = ""  # the continue token expired mid-list: start the snapshot again
                continue
            body = json.loads(await resp.read())
            now = time.monotonic()
            for obj in body.get("items") or []:
                self._saw(obj, now, relisted=relisted)
            meta = body.get("metadata") or {}
            token = meta.get("continue") or ""
            if not token:
                return str(meta["resourceVersion"])

    async def _events(self, rv: str) -> AsyncGenerator[Event, None]:
        """The decoded events of one WATCH from ``rv``, until the server ends it."""
        resp: Any = await self.core.list_namespaced_pod(
            self.ns,
            watch=True,
            resource_version=rv,
            allow_watch_bookmarks=True,
            timeout_seconds=self.timeout_seconds,
            _preload_content=False,
        )
        try:
            async for line in resp.content:
                if line.strip():
                    yield json.loads(line)
        finally:
            resp.release()

    async def _watch(self) -> bool:
        """Follow one watch from :attr:`rv`; True if it ended in 410 Gone."""
        assert self.rv is not None
        try:
            async with contextlib.aclosing(self._events(self.rv)) as events:
                async for ev in events:
                    obj = ev.get("object") or {}
                    if ev.get("type") == "ERROR":
                        if obj.get("code") == 410 or obj.get("reason") in ("Expired", "Gone"):
                            return True
                        raise WatchError(f"HTTP {obj.get('code')} {obj.get('reason')}")
                    rv = (obj.get("metadata") or {}).get("resourceVersion")
                    if rv:
                        self.rv = rv
                    if ev.get("type") in ("ADDED", "MODIFIED"):
                        self._saw(obj, time.monotonic(), relisted=False)
        except client.ApiException as exc:
            if exc.status == 410:
                return True
            raise WatchError(f"HTTP {exc.status} {exc.reason}") from exc
        return False

    async def _run(self) -> None:
        if self.rv is None:
            self.rv = await self._list(relisted=False)
        self.started.set()
        while True:
            try:
                gone = await self._watch()
            except (aiohttp.ClientError, TimeoutError, ValueError, WatchError) as exc:
                # A cut connection, a truncated line or a server error: resume from
                # the last version after a pause (an error that persists shows in
                # the count, and the pods it hides in "bound N/M").
                kind = str(exc) if isinstance(exc, WatchError) else type(exc).__name__
                self.cuts[kind] = self.cuts.get(kind, 0) + 1
                gone = False
                await asyncio.sleep(0.5)
            if gone:
                self.rv = await self._list(relisted=True)
                self.relists += 1
            else:
                self.reconnects += 1

    def start(self) -> None:
        """Start (or, after :meth:`stop`, resume from the last resourceVersion)."""
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    def summary(self, names: set[str]) -> str:
        """``bound N/M`` for the pods in ``names``, and what the watch had to do."""
        bound = len(names & self.bound.keys())
        line = f"bound {bound}/{len(names)}"
        extra = []
        if self.reconnects:
            why = ", ".join(f"{n} {kind}" for kind, n in sorted(self.cuts.items()))
            extra.append(f"{self.reconnects} watch resumes" + (f", {why}" if why else ""))
        if self.relists:
            late = len(names & self.relisted)
            extra.append(
                f"WARNING: {self.relists} re-lists after 410 Gone, {late} pods timed at the re-list"
            )
        return line + (f" ({'; '.join(extra)})" if extra else "")


async def create_pods(
    core: client.CoreV1Api, ns: str, bodies: list[dict[str, Any]], rate: float | None = None
) -> dict[str, float]:
    """Create pods (at ``rate``/s, or as fast as 32 parallel calls go); return send times."""
    sent: dict[str, float] = {}
    sem = asyncio.Semaphore(32)

    async def one(body: dict[str, Any]) -> None:
        async with sem:
            sent[body["metadata"]["name"]] = time.monotonic()
            # Raw: deserialising each answer into a V1Pod costs the client more CPU
            # than the API server spends creating the pod.
            resp: Any = await core.create_namespaced_pod(
                ns, cast(client.V1Pod, body), _preload_content=False
            )
            text = await resp.read()
            if resp.status >= 400:  # raw answers do not raise: a refused pod must not pass
                raise RuntimeError(f"creating pod {ns}/{body['metadata']['name']}: {text[:300]!r}")

    if rate is None:
        await asyncio.gather(*(one(b) for b in bodies))
        return sent
    tasks = []
    start = time.monotonic()
    for i, body in enumerate(bodies):
        delay = start + i / rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(body)))
    await asyncio.gather(*tasks)
    return sent


async def wait_all(watcher: Watcher, names: set[str], within: float) -> int:
    """Wait until every pod in ``names`` is bound or ``within`` s passed; the number unbound."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        missing = len(names - watcher.bound.keys())
        if not missing:
            return 0
        await asyncio.sleep(0.2)
    return len(names - watcher.bound.keys())


def apply_crds(cluster: DevCluster, state: ClusterState) -> None:
    """Apply the repository's CRDs (server-side) and wait until they are established."""
    kubectl = [str(Path(state.binaries) / "kubectl"), f"--kubeconfig={cluster.kubeconfig}"]
    subprocess.run(
        [*kubectl, "apply", "--server-side", "-f", str(REPO / "crds")],
        check=True,
        capture_output=True,
    )
    subprocess.run(
        [*kubectl, "wait", "--for=condition=Established", "crd", "--all", "--timeout=60s"],
        check=True,
        capture_output=True,
    )


def precompile_lattice() -> None:
    """Byte-compile the ``scheduler`` package the benchmarks run, as the image does at build
    time (``compileall`` in the Dockerfile): where ``PYTHONDONTWRITEBYTECODE`` is set (this
    machine sets it), a source tree is otherwise compiled again at every start, CPU a
    deployed Lattice never spends and the whole-process CPU per pod would count."""
    compileall.compile_dir(str(Path(scheduler.__file__).parent), quiet=1, workers=0)


def start_lattice(
    cluster: DevCluster,
    log_level: str = "warning",
    *,
    name: str = "lattice",
    election: Sequence[str] = ("--no-leader-elect",),
    metrics_port: int = 0,
) -> int:
    """`lattice run` on the cluster, quiet, metrics on loopback; its pid. By default the only
    replica (no election) on a free port; a replica of several names itself and passes its
    election flags and a port of its own."""
    precompile_lattice()
    return cluster.start_process(
        name,
        [
            sys.executable,
            "-m",
            "scheduler.cli",
            "run",
            f"--kubeconfig={cluster.kubeconfig}",
            *election,
            "--metrics-host=127.0.0.1",
            f"--metrics-port={metrics_port}",
            f"--log-level={log_level}",
        ],
        marker="scheduler.cli",
    )


async def wait_lattice_ready(
    objects: client.CustomObjectsApi, started: float, within: float = 120.0
) -> None:
    """Until the LatticeScheduler status says Ready, written after ``started`` (unix time)
    by the process just started; a benchmark that waits longer streams anyway, saying so."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        obj: dict[str, Any] = await objects.get_cluster_custom_object(
            "lattice.dev", "v1alpha1", "latticeschedulers", "lattice"
        )
        status = obj.get("status") or {}
        stamp = status.get("lastUpdateTime")
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in status.get("conditions", [])
        )
        if ready and stamp and parse_time(stamp).timestamp() >= int(started):
            return
        await asyncio.sleep(0.5)
    print(f"  (lattice not Ready after {within:.0f}s; streaming anyway)", flush=True)
