"""`lattice run`: every background task of the scheduler process, started and
stopped in one place.

Start-up: API client -> the API server's release (GET /version: the kube-scheduler
release whose behaviour Lattice mirrors, see release.py) -> our LatticeScheduler object
(created with defaults if missing) -> the intake's streams (pods pending for us, pods on
nodes, nodes, namespaces, NodeTopologies, NodeResourceTopologies, PodGroups: server-side
filtered list + watch, see intake.py) -> their initial lists applied in one go
(readiness) -> /metrics server -> kopf (our LatticeScheduler object only) ->
leader election -> (leader only) scheduling loop and status. There is no
periodic full re-list: a stream re-lists only on 410 Gone, and reconciles then.

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
import dataclasses
import gc
import json
import signal
import time
from collections.abc import Iterator, Mapping
from typing import Any, Final

import kopf
import structlog
from kubernetes_asyncio import client

from scheduler.config import RunConfig
from scheduler.control.dra import GROUP as DRA_GROUP
from scheduler.control.dra import VERSION as DRA_VERSION
from scheduler.control.feed import Feed, describe, resources
from scheduler.control.intake import ASSIGNED_PODS, PENDING_PODS, Intake, Update
from scheduler.control.kubeconfig import (
    CONNECTION_ERRORS,
    Credentials,
    StartupError,
    describe_api_error,
    load_credentials,
    one_line,
    require_lattice_crds,
    serves,
    skip_environment_lookups,
    wait_for_api,
)
from scheduler.control.kubeio import KubeWriter, keep_connections_open
from scheduler.control.kueue import KueueTopologies, Resolution
from scheduler.control.leader import Elector
from scheduler.control.ratelimit import TokenBucket
from scheduler.control.release import ServerVersion, choose_release
from scheduler.control.scheduler import Scheduler
from scheduler.control.server import PortInUse, check_port_free, start_server
from scheduler.control.settings import SchedulerSettings, SettingsError, parse_spec
from scheduler.control.status import build_status, ensure_object, write_status
from scheduler.control.watch import build_registry, operator_settings
from scheduler.core.profile import DEFAULT_KUBE_MINOR, DEFAULT_PROFILE
from scheduler.obs.metrics import Metrics

log = structlog.get_logger("lattice.app")

STALL_AFTER = 60.0
"""Seconds a leader may hold poppable pods without popping one before /healthz fails. A
cycle takes milliseconds and never awaits, and bindings and solves run beside the loop, so
only a dead or wedged loop gets near this."""


CONNECTION_POOL: Final = 1024 + 64
"""Keep-alive connections of our client: room for the largest ``bindConcurrency`` plus the
watch streams and the reporter's writes, so a binding never waits for a connection (every
user of the pool is bounded on its own; unused room costs nothing)."""


def _api_client(credentials: Credentials) -> client.ApiClient:
    """Our own client: the same Configuration kopf's credentials are derived from."""
    credentials.configuration.connection_pool_maxsize = CONNECTION_POOL
    api = client.ApiClient(configuration=credentials.configuration)
    skip_environment_lookups(api)
    if not keep_connections_open(api):
        log.warning("keepalive_not_set", reason="this aiohttp has no connector keep-alive")
    return api


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """No cyclic collection while the initial lists fill the cache, then what they built
    frozen, without a collection.

    Listing 5000 nodes and 30 000 bound pods builds a few million objects that live as
    long as the process. With the collector on, each full collection walks every one built
    so far, and the growing heap triggers several: half of the sync's CPU (measured with
    ``just bench-startup``: 8.9-9.8 s of CPU with it, 4.8-4.9 s without, the same peak RSS:
    pages are acyclic and freed by reference counting). A collection after the sync, to
    find cycles before freezing, walked all of it once more for nothing: 0.8 s of CPU live
    at that size and 0 objects found (0 offline too), so the collection runs before the
    pause instead, where the heap is small (start-up's imports are frozen already,
    ``scheduler.cli``). A cycle built during the sync would be frozen once, never
    collected: bounded, and none was measured. On failure the collector is switched back
    on all the same."""
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()


def mirrored_release(version: ServerVersion | None) -> int:
    """The release to behave as (see release.py), logged once: a warning when it is not the
    API server's own."""
    release = choose_release(version)
    if release.warning is not None:
        log.warning(
            "kubernetes_release_unsupported", reason=f"{release.warning}; {release.describe()}"
        )
    else:
        server = "?" if version is None else version.text
        log.info("kubernetes_release", reason=f"API server {server}: {release.describe()}")
    return release.kube_minor


def _kopf_login(credentials: Credentials) -> Any:
    """kopf connects with the same credentials as our own client (see kubeconfig.py)."""
    return credentials.kopf_login()


KOPF_START_TIMEOUT: Final = 30.0
KUEUE_START_WAIT: Final = 5.0
"""Seconds start-up waits for the Kueue Topology that ``fromKueue`` names to be read."""


class App:
    """The running process: owns every task and stops them all."""

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        self.metrics = Metrics.create()
        self.synced = False
        self.settings_error: str | None = None
        self.generation: int | None = None
        self.stopping = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        self.intake: Intake | None = None
        self._elector: Elector | None = None
        self._leading_since: float | None = None
        """Monotonic time this replica started scheduling (None: a standby)."""
        self.kube_minor = DEFAULT_KUBE_MINOR
        """The Kubernetes release mirrored (1.x): the API server's, set at start."""
        self._kopf_listed = asyncio.Event()
        """kopf has handed over our object once: its start-up (discovery, the first list)
        is over."""
        self.kueue: KueueTopologies | None = None
        """The Kueue Topology that ``spec.topology.fromKueue`` names, followed (set at start)."""

    # -- settings -----------------------------------------------------------
    def _apply_object(self, body: Mapping[str, Any]) -> None:
        meta = body.get("metadata") or {}
        if meta.get("name") != self.cfg.scheduler_name:
            return
        self.generation = meta.get("generation")
        try:
            settings = parse_spec(
                body.get("spec") or {}, self.cfg.scheduler_name, kube_minor=self.kube_minor
            )
        except SettingsError as exc:
            self.settings_error = str(exc)
            log.warning("settings_rejected", reason=str(exc))
            return
        self.settings_error = None
        settings = self._with_kueue_levels(settings)
        if settings != self.scheduler.settings:
            self.scheduler.apply_settings(settings)

    def _with_kueue_levels(self, settings: SchedulerSettings) -> SchedulerSettings:
        """With ``fromKueue``: the levels of the named Kueue Topology as last read (none
        until it is), and the follower pointed at it."""
        name = settings.topology.from_kueue
        if self.kueue is not None:
            self.kueue.follow(name)
        if name is None:
            return settings
        read = self.kueue.resolution if self.kueue is not None else None
        levels = read.levels if read is not None and read.name == name else ()
        topology = dataclasses.replace(settings.topology, levels=levels)
        return dataclasses.replace(settings, topology=topology)

    def _on_kueue(self, resolution: Resolution) -> None:
        """The named Topology changed (or appeared, or went): its levels are applied as a
        change of ``spec.topology.levels`` is."""
        current = self.scheduler.settings
        if current.topology.from_kueue != resolution.name:
            return
        settings = self._with_kueue_levels(current)
        if settings != current:
            self.scheduler.apply_settings(settings)

    def _on_settings(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        self._kopf_listed.set()
        if event_type != "DELETED":
            self._apply_object(body)

    # -- intake -----------------------------------------------------------
    async def _start_intake(self) -> None:
        """Follow every stream. Custom resources, namespaces and nodes are applied once
        listed; then bound pods page by page as they are read (30 000 of them are never
        held whole); pending pods only once every stream has synced, so the first cycle
        sees the whole cluster (readiness waits for it). DeviceTaintRules are followed only
        where discovery finds them in ``resource.k8s.io/v1`` (1.37; not 1.35, nor 1.36
        whose beta is v1beta2 and off)."""
        taint_rules = await serves(
            self.api, group=DRA_GROUP, version=DRA_VERSION, plural="devicetaintrules"
        )
        log.info(
            "device_taint_rules",
            reason="followed" if taint_rules else "not served as resource.k8s.io/v1",
        )
        self.intake = intake = Intake(
            self.api, resources(self.cfg.scheduler_name, device_taint_rules=taint_rules)
        )
        self.feed = Feed(self.scheduler)
        intake.start()
        pods = {ASSIGNED_PODS, PENDING_PODS}
        first = [key for key in intake.streams if key not in pods]
        await intake.wait_synced(first)
        self.feed.apply(intake.get_nowait(first))
        held: list[Update] = []
        while not intake.synced:
            got = await intake.get()
            held.extend(u for u in got if u.stream == PENDING_PODS)
            self.feed.apply([u for u in got if u.stream != PENDING_PODS])
        rest = intake.get_nowait()
        self.feed.apply([u for u in rest if u.stream != PENDING_PODS])
        # Every bound pod is in: the GPU mix learns them before the pending pods arrive.
        gpu_pods = self.scheduler.rebuild_gpu_demand()
        self.feed.apply([*held, *(u for u in rest if u.stream == PENDING_PODS)])
        self.synced = True
        log.info(
            "cache_synced",
            reason=f"{self._cache_summary()}; GPU mix from {gpu_pods} bound GPU pods",
        )

    def _cache_summary(self) -> str:
        c = self.scheduler.cache
        return (
            f"{c.snapshot.num_nodes} nodes, {len(c.pod_keys())} pods placed, "
            f"{len(self.scheduler.queue)} pending"
        )

    async def _feed_loop(self, intake: Intake) -> None:
        """Everything each read brought, applied at once between scheduling cycles."""
        while True:
            self.feed.apply(await intake.get())

    # -- loops --------------------------------------------------------------
    async def _housekeeping(self) -> None:
        while True:
            self.scheduler.tick()
            await asyncio.sleep(0.25)

    async def _status_loop(self) -> None:
        while True:
            status = build_status(
                self.scheduler,
                leader=self.cfg.leader_election.identity,
                ready=self.synced,
                settings_error=self.settings_error,
                generation=self.generation,
                kueue=self.kueue.resolution if self.kueue is not None else None,
            )
            try:
                await write_status(self.api, self.cfg.scheduler_name, status)
            except (client.ApiException, OSError) as exc:
                log.warning("status_write_failed", reason=str(exc))
            await asyncio.sleep(self.cfg.status_interval)

    async def _quota_status_loop(self) -> None:
        """ElasticQuota ``status.used``, written on change only, at most once a second."""
        while True:
            await self.scheduler.write_quota_statuses()
            await asyncio.sleep(1.0)

    async def _gang_status_loop(self) -> None:
        """PodGroup status, written on change only, at most once a second per gang."""
        while True:
            await self.scheduler.gang_flow.write_statuses()
            await asyncio.sleep(1.0)

    async def _lead(self) -> None:
        """Runs while we lead. The election library runs this in a task of its own that it
        does not cancel when its own task is cancelled, so the work is a task of ours,
        cancelled with this one or at shutdown."""
        await self._spawn(self._leading())

    async def _leading(self) -> None:
        """The scheduling loop and the status writers."""
        opened = await self.scheduler.open_connections()
        log.info("connections_opened", reason=f"{opened} keep-alive connections for writes")
        self._leading_since = time.monotonic()
        self._spawn(self._status_loop())
        self._spawn(self._gang_status_loop())
        self._spawn(self._quota_status_loop())
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
            self.kube_minor = mirrored_release(await wait_for_api(self.api, self.credentials))
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
            if self.intake is not None:
                await self.intake.close()
            await self.api.close()

    async def _run(self) -> int:
        obj = await ensure_object(self.api, self.cfg.scheduler_name)
        settings = SchedulerSettings(
            scheduler_name=self.cfg.scheduler_name,
            profile=dataclasses.replace(DEFAULT_PROFILE, kube_minor=self.kube_minor),
        )
        writer = KubeWriter(
            self.api,
            component=self.cfg.scheduler_name,
            instance=self.cfg.leader_election.identity,
            limiter=TokenBucket(settings.client_qps, settings.client_burst),
        )
        self.scheduler = Scheduler(settings, writer=writer, metrics=self.metrics)
        self.kueue = KueueTopologies(self.api, self._on_kueue, spawn=self._spawn)
        self._apply_object(obj)
        if self.kueue.name is not None:
            # Before the PodGroups are read, so none is refused for a slice level the
            # Topology has; a Topology that is slow to come is applied when it comes.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(KUEUE_START_WAIT):
                    await self.kueue.wait_read()
        with collector_paused():
            await self._start_intake()
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
            login=_kopf_login(self.credentials),
            on_settings=self._on_settings,
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
        # Until kopf has listed our object (its start-up done, ~0.3 s of CPU), so that its
        # start-up does not compete with the first cycles; the object exists
        # (ensure_object), so the wait is short unless kopf is stuck: then go on.
        ready_wait = self._spawn(self._kopf_listed.wait())
        await asyncio.wait(
            [ready_wait, kopf_task], timeout=KOPF_START_TIMEOUT, return_when=asyncio.FIRST_COMPLETED
        )
        if not ready_wait.done():
            log.warning("kopf_slow_to_start", reason=f"no first listing in {KOPF_START_TIMEOUT}s")
        ready_wait.cancel()
        # What start-up built (modules, the listed cluster) lives as long as the process:
        # out of the collector's sight, so no full collection while scheduling walks it.
        gc.collect()
        gc.freeze()
        log.info(
            "start_up_done",
            reason=f"kopf listed: {ready_wait.done() and not ready_wait.cancelled()}; "
            f"{gc.get_freeze_count()} objects frozen",
        )
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):  # ours, not kopf's: we stop in order
            loop.add_signal_handler(sig, self.stopping.set)
        self._spawn(self._housekeeping())
        assert self.intake is not None
        feed_task = self._spawn(self._feed_loop(self.intake))

        elector: Elector | None = None
        if self.cfg.leader_election.enabled:
            elector = self._elector = Elector(self.api, self.cfg.leader_election, self._lead)
            leading = self._spawn(elector.run())
            lost = self._spawn(elector.lost.wait())
        else:
            leading = self._spawn(self._lead())
            lost = self._spawn(asyncio.Event().wait())
        stop = self._spawn(self.stopping.wait())
        await asyncio.wait(
            [stop, lost, kopf_task, leading, feed_task], return_when=asyncio.FIRST_COMPLETED
        )
        code = 0 if stop.done() else 1
        reason = "signal" if stop.done() else "leadership lost" if lost.done() else "task ended"
        for task in (kopf_task, leading, feed_task):
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
        await self.intake.close()
        await self.kueue.close()
        log.info("feed_stats", reason=json.dumps(describe(self.feed.stats)))
        left = set(self._tasks)
        for task in left:
            task.cancel()
        await asyncio.gather(*left, return_exceptions=True)
        await runner.cleanup()
        return code
