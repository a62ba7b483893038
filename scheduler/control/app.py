"""`lattice run`: every background task of the scheduler process, started and
stopped in one place.

Start-up: API client -> our LatticeScheduler object (created with defaults if
missing) -> one full list into the cache (readiness) -> /metrics server ->
kopf watches -> leader election -> (leader only) scheduling loop and status.

Shutdown on SIGTERM/SIGINT: stop taking pods, let in-flight bindings finish
(bounded), cancel what is left, release the lease, stop the watches, cancel
every task this module started. Losing the lease ends the process with a
non-zero code, as kube-scheduler does: a fresh start is the simplest way back to
a consistent standby.

/healthz fails while the lease is lost (until the process has ended) and when the
scheduling loop stalls: the leader has had poppable pods for :data:`STALL_AFTER`
seconds without a single pop. An idle leader and a standby are healthy.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import time
from collections.abc import Mapping
from typing import Any

import kopf
import structlog
from kubernetes_asyncio import client

from scheduler.config import RunConfig
from scheduler.control.gangs import GangEntry
from scheduler.control.kubeconfig import (
    CONNECTION_ERRORS,
    Credentials,
    StartupError,
    describe_api_error,
    load_credentials,
    one_line,
    require_lattice_crds,
    wait_for_api,
)
from scheduler.control.kubeio import PODGROUP_GROUP, PODGROUP_PLURAL, PODGROUP_VERSION, KubeWriter
from scheduler.control.leader import Elector
from scheduler.control.queue import PENDING_QUEUES
from scheduler.control.ratelimit import TokenBucket
from scheduler.control.scheduler import Scheduler
from scheduler.control.server import PortInUse, check_port_free, start_server
from scheduler.control.settings import (
    API_GROUP,
    API_VERSION,
    SchedulerSettings,
    SettingsError,
    parse_spec,
)
from scheduler.control.status import build_status, ensure_object, write_status
from scheduler.control.watch import build_registry, operator_settings
from scheduler.model import noderesourcetopology as nrt
from scheduler.obs.metrics import Metrics

log = structlog.get_logger("lattice.app")

STALL_AFTER = 60.0
"""Seconds a leader may hold poppable pods without popping one before /healthz fails. A
cycle takes milliseconds and never awaits, and bindings and solves run beside the loop, so
only a dead or wedged loop gets near this."""


def _api_client(credentials: Credentials) -> client.ApiClient:
    """Our own client: the same Configuration kopf's credentials are derived from."""
    return client.ApiClient(configuration=credentials.configuration)


def _kopf_login(credentials: Credentials) -> Any:
    """kopf connects with the same credentials as our own client (see kubeconfig.py)."""
    return credentials.kopf_login()


async def _list(call: Any, **kwargs: Any) -> tuple[list[dict[str, Any]], int | None]:
    """Items and the list's resourceVersion (None if it is not an etcd revision)."""
    resp = await call(_preload_content=False, **kwargs)
    doc = json.loads(await resp.read())
    rv = doc.get("metadata", {}).get("resourceVersion")
    items: list[dict[str, Any]] = doc["items"]
    return items, int(rv) if str(rv).isdigit() else None


class App:
    """The running process: owns every task and stops them all."""

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        self.metrics = Metrics.create()
        self.synced = False
        self.settings_error: str | None = None
        self.generation: int | None = None
        self.stopping = asyncio.Event()
        self._relist_pending = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self._elector: Elector | None = None
        self._leading_since: float | None = None
        """Monotonic time this replica started scheduling (None: a standby)."""

    # -- settings -----------------------------------------------------------
    def _apply_object(self, body: Mapping[str, Any]) -> None:
        meta = body.get("metadata") or {}
        if meta.get("name") != self.cfg.scheduler_name:
            return
        self.generation = meta.get("generation")
        try:
            settings = parse_spec(body.get("spec") or {}, self.cfg.scheduler_name)
        except SettingsError as exc:
            self.settings_error = str(exc)
            log.warning("settings_rejected", reason=str(exc))
            return
        self.settings_error = None
        if settings != self.scheduler.settings:
            self.scheduler.apply_settings(settings)

    def _on_settings(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        if event_type != "DELETED":
            self._apply_object(body)

    # -- cache sync ---------------------------------------------------------
    async def sync(self) -> None:
        """List everything once: the initial fill, and the reconcile after re-lists."""
        core = client.CoreV1Api(self.api)
        (nodes, nrv), (namespaces, nsrv), (pods, prv), podgroups = await asyncio.gather(
            _list(core.list_node),
            _list(core.list_namespace),
            _list(core.list_pod_for_all_namespaces),
            self._list_podgroups(),
        )
        # PodGroups first: a member pod finds its gang's spec when it arrives.
        for group in podgroups:
            self.scheduler.podgroup_upserted(group)
        # Watch events processed while the lists were in flight are newer than the lists.
        known = [rv for rv in (nrv, nsrv, prv) if rv is not None]
        list_rv = min(known) if len(known) == 3 else None
        bound = [p for p in pods if (p.get("spec") or {}).get("nodeName")]
        removed = self.scheduler.cache.reconcile(nodes, bound, namespaces, list_rv)
        self.scheduler.note_bound_gang_members(bound)
        live = set()
        for pod in pods:
            if not (pod.get("spec") or {}).get("nodeName"):
                self.scheduler.pod_upserted(pod)
                meta = pod["metadata"]
                live.add(f"{meta['namespace']}/{meta['name']}")
        for name in PENDING_QUEUES:
            for queued in self.scheduler.queue.pods(name):
                if isinstance(queued, GangEntry):
                    continue  # kept in step with its members by the scheduler
                key = f"{queued.namespace}/{queued.name}"
                if key not in live and self.scheduler.queued_before(key, list_rv):
                    self.scheduler.queue.delete(queued)  # deleted during a watch gap
                    self.scheduler.forget_reports(queued.uid)
        self.scheduler.prune_gang_members(live, list_rv)
        for report in await self._list_topologies():
            self.scheduler.topology_upserted(report)
        found = await self._list_noderesourcetopologies()
        if found is not None:
            listed = {str((o.get("metadata") or {}).get("name", "")) for o in found}
            for node in self.scheduler.nrt_names() - listed:  # deleted during a watch gap
                self.scheduler.nrt_deleted({"metadata": {"name": node}})
            for obj in found:
                self.scheduler.nrt_upserted(obj)
        if any(removed.values()):
            log.warning("cache_reconciled", reason=json.dumps(removed))
        self.synced = True

    async def _list_podgroups(self) -> list[dict[str, Any]]:
        objects = client.CustomObjectsApi(self.api)
        try:
            found: dict[str, Any] = await objects.list_cluster_custom_object(
                PODGROUP_GROUP, PODGROUP_VERSION, PODGROUP_PLURAL
            )
        except client.ApiException as exc:
            # 404: no PodGroup CRD in this cluster, so no gangs; gang pods wait with an event.
            if exc.status != 404:
                log.warning("podgroup_list_failed", reason=f"{exc.status} {exc.reason}")
            return []
        items: list[dict[str, Any]] = found.get("items", [])
        return items

    async def _list_topologies(self) -> list[dict[str, Any]]:
        objects = client.CustomObjectsApi(self.api)
        try:
            found: dict[str, Any] = await objects.list_cluster_custom_object(
                API_GROUP, API_VERSION, "nodetopologies"
            )
        except client.ApiException as exc:
            # 404: the CRD is not installed (no topology-aware placement); anything else
            # (a CRD whose storage is still initialising answers 429) is left to the watch.
            if exc.status != 404:
                log.warning("topology_list_failed", reason=f"{exc.status} {exc.reason}")
            return []
        items: list[dict[str, Any]] = found.get("items", [])
        return items

    async def _list_noderesourcetopologies(self) -> list[dict[str, Any]] | None:
        """NFD's NodeResourceTopologies; None when they could not be listed."""
        objects = client.CustomObjectsApi(self.api)
        try:
            found: dict[str, Any] = await objects.list_cluster_custom_object(
                nrt.GROUP, nrt.VERSION, nrt.PLURAL
            )
        except client.ApiException as exc:
            # 404: no NFD topology-updater here; nodes are then known from our agents only.
            if exc.status != 404:
                log.warning("topology_list_failed", reason=f"{exc.status} {exc.reason}")
                return None
            return []
        items: list[dict[str, Any]] = found.get("items", [])
        return items

    async def _initial_sync(self) -> None:
        """The first full list, retried on transient API errors (a busy or starting
        API server answers 429/5xx): readiness waits for it, the process does not die."""
        delay = 0.5
        for attempt in range(1, 11):
            try:
                await self.sync()
                return
            except (client.ApiException, OSError) as exc:
                status = getattr(exc, "status", None)
                if isinstance(exc, client.ApiException) and status not in (429, 500, 503, 504):
                    raise
                log.warning("initial_sync_retry", attempt=attempt, reason=str(exc)[:200])
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)
        await self.sync()

    def _on_relist(self) -> None:
        if not self._relist_pending:
            self._relist_pending = True
            self._spawn(self._debounced_resync())

    async def _debounced_resync(self) -> None:
        await asyncio.sleep(2.0)  # let the whole re-list arrive first
        self._relist_pending = False
        await self.sync()

    # -- loops --------------------------------------------------------------
    async def _housekeeping(self) -> None:
        last_resync = time.monotonic()
        while True:
            self.scheduler.tick()
            if time.monotonic() - last_resync > self.cfg.resync_interval:
                last_resync = time.monotonic()
                try:
                    await self.sync()
                except (client.ApiException, OSError) as exc:
                    log.warning("resync_failed", reason=str(exc))
            await asyncio.sleep(0.25)

    async def _status_loop(self) -> None:
        while True:
            status = build_status(
                self.scheduler,
                leader=self.cfg.leader_election.identity,
                ready=self.synced,
                settings_error=self.settings_error,
                generation=self.generation,
            )
            try:
                await write_status(self.api, self.cfg.scheduler_name, status)
            except (client.ApiException, OSError) as exc:
                log.warning("status_write_failed", reason=str(exc))
            await asyncio.sleep(self.cfg.status_interval)

    async def _gang_status_loop(self) -> None:
        """PodGroup status, written on change only, at most once a second per gang."""
        while True:
            await self.scheduler.write_gang_statuses()
            await asyncio.sleep(1.0)

    async def _lead(self) -> None:
        """Runs while we lead. The election library runs this in a task of its own that it
        does not cancel when its own task is cancelled, so the work is a task of ours,
        cancelled with this one or at shutdown."""
        await self._spawn(self._leading())

    async def _leading(self) -> None:
        """The scheduling loop and the status writers."""
        self._leading_since = time.monotonic()
        self._spawn(self._status_loop())
        self._spawn(self._gang_status_loop())
        await self.scheduler.run()

    def health(self) -> str | None:
        """What /healthz reports: None when healthy, else the problem (see the module)."""
        if self._elector is not None and self._elector.lost.is_set():
            return "the leader lease was lost"
        if self._leading_since is None:
            return None
        starved = self.scheduler.queue.starved_for(since=self._leading_since)
        if starved > STALL_AFTER:
            return (
                f"the scheduling loop stalled: pods have been ready for {starved:.0f}s "
                "without a scheduling cycle"
            )
        return None

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        """Every task of the process is started here, so shutdown can cancel them all."""
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # -- the whole life -----------------------------------------------------
    async def run(self) -> int:
        """Start-up refusals (busy port, no credentials, unreachable API server, missing
        CRDs or RBAC) raise :class:`StartupError`: one line, printed by the CLI."""
        self.cfg.validate()
        try:
            check_port_free(self.cfg.metrics_host, self.cfg.metrics_port)  # before any API call
        except OSError as exc:
            raise StartupError(str(exc)) from exc
        self.credentials = await load_credentials(self.cfg.kubeconfig)
        self.api = _api_client(self.credentials)
        try:
            await wait_for_api(self.api, self.credentials)
            await require_lattice_crds(self.api, self.credentials)
            return await self._run()
        except PortInUse as exc:
            raise StartupError(str(exc)) from exc
        except client.ApiException as exc:
            raise StartupError(describe_api_error(exc, self.credentials, "starting")) from exc
        except CONNECTION_ERRORS as exc:
            raise StartupError(
                f"lost the API server at {self.credentials.server} while starting: {one_line(exc)}"
            ) from exc
        finally:
            await self.api.close()

    async def _run(self) -> int:
        obj = await ensure_object(self.api, self.cfg.scheduler_name)
        settings = SchedulerSettings(scheduler_name=self.cfg.scheduler_name)
        writer = KubeWriter(
            self.api,
            component=self.cfg.scheduler_name,
            instance=self.cfg.leader_election.identity,
            limiter=TokenBucket(settings.client_qps, settings.client_burst),
        )
        self.scheduler = Scheduler(settings, writer=writer, metrics=self.metrics)
        self._apply_object(obj)
        await self._initial_sync()
        runner, port = await start_server(
            self.metrics.registry,
            lambda: self.synced,
            self.cfg.metrics_host,
            self.cfg.metrics_port,
            health=self.health,
        )
        log.info("serving", reason=f"metrics on {self.cfg.metrics_host}:{port}")
        kopf_stop = asyncio.Event()
        kopf_ready = asyncio.Event()
        registry = build_registry(
            self.scheduler,
            login=_kopf_login(self.credentials),
            on_settings=self._on_settings,
            on_relist=self._on_relist,
            synced=lambda: self.synced,
        )
        kopf_task = self._spawn(
            kopf.operator(
                registry=registry,
                settings=operator_settings(),
                clusterwide=True,
                standalone=True,
                stop_flag=kopf_stop,
                ready_flag=kopf_ready,
            )
        )
        ready_wait = self._spawn(kopf_ready.wait())
        await asyncio.wait([ready_wait, kopf_task], return_when=asyncio.FIRST_COMPLETED)
        ready_wait.cancel()
        await asyncio.sleep(0.1)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):  # ours, not kopf's: we stop in order
            loop.add_signal_handler(sig, self.stopping.set)
        self._spawn(self._housekeeping())

        elector: Elector | None = None
        if self.cfg.leader_election.enabled:
            elector = self._elector = Elector(self.api, self.cfg.leader_election, self._lead)
            leading = self._spawn(elector.run())
            lost = self._spawn(elector.lost.wait())
        else:
            leading = self._spawn(self._lead())
            lost = self._spawn(asyncio.Event().wait())
        stop = self._spawn(self.stopping.wait())
        await asyncio.wait([stop, lost, kopf_task, leading], return_when=asyncio.FIRST_COMPLETED)
        code = 0 if stop.done() else 1
        reason = "signal" if stop.done() else "leadership lost" if lost.done() else "task ended"
        for task in (kopf_task, leading):
            if task.done() and not task.cancelled() and task.exception() is not None:
                log.error("task_failed", reason=repr(task.exception()))
        log.info("stopping", reason=reason)

        # Stop taking pods, let in-flight bindings finish, then give up the lease.
        self.scheduler.queue.close()
        await self.scheduler.shutdown(self.cfg.shutdown_grace)
        if elector is not None and elector.leading.is_set():
            leading.cancel()  # no renewal may overwrite the release
            await asyncio.gather(leading, return_exceptions=True)
            await elector.release()
        kopf_stop.set()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(kopf_task), 10)
        left = set(self._tasks)
        for task in left:
            task.cancel()
        await asyncio.gather(*left, return_exceptions=True)
        await runner.cleanup()
        return code
