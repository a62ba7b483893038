"""Lease-based leader election (kubernetes-asyncio's LeaseLock), plus release.

Only the leader schedules and writes status; standbys keep a warm cache from
the same watches and take over when the lease expires. On a graceful stop the
leader releases the lease (holder cleared, duration 1 s), so a standby takes
over at once instead of after the lease duration.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Awaitable, Callable
from typing import cast

import structlog
from kubernetes_asyncio import client
from kubernetes_asyncio.leaderelection import electionconfig, leaderelection
from kubernetes_asyncio.leaderelection.resourcelock.leaselock import LeaseLock

from scheduler.config import LeaderElectionConfig
from scheduler.control.transient import TRANSPORT_ERRORS

log = structlog.get_logger("lattice.leader")

CONNECTION_ERRORS = TRANSPORT_ERRORS
"""What a dead or restarting API server raises (as in kubeconfig.py)."""


class _Election(leaderelection.LeaderElection):
    """The library counts an ApiException as a failed try and tries again until the renew
    deadline, but lets a connection error through, which ended the election task (and the
    process) the moment an API server restarted. Such an error is a failed try too."""

    async def try_acquire_or_renew(self) -> bool:
        try:
            ok: bool = await super().try_acquire_or_renew()
            return ok
        except CONNECTION_ERRORS as exc:
            log.warning("lease_try_failed", reason=f"{type(exc).__name__}: {exc}"[:300])
            return False


class Elector:
    """Runs the election in a task; ``leading`` and ``lost`` tell the app what happened."""

    def __init__(
        self,
        api: client.ApiClient,
        cfg: LeaderElectionConfig,
        on_lead: Callable[[], Awaitable[None]],
    ) -> None:
        self.api = api
        self.cfg = cfg
        self.leading = asyncio.Event()
        self.lost = asyncio.Event()
        self._on_lead = on_lead

    async def run(self) -> None:
        lock = LeaseLock(self.cfg.lease_name, self.cfg.lease_namespace, self.cfg.identity, self.api)

        async def started() -> None:
            self.leading.set()
            log.info("leader_elected", reason=self.cfg.identity)
            await self._on_lead()

        async def stopped() -> None:
            if self.leading.is_set():
                log.warning("leadership_lost", reason=self.cfg.identity)
                self.lost.set()

        config = electionconfig.Config(
            lock,
            # The library writes str(lease_duration) and parses it back with int().
            lease_duration=int(self.cfg.lease_duration),
            renew_deadline=self.cfg.renew_deadline,
            retry_period=self.cfg.retry_period,
            onstarted_leading=started,
            onstopped_leading=stopped,
        )
        await _Election(config).run()

    async def release(self) -> None:
        """Give the lease up if we hold it, so a standby need not wait for expiry."""
        coord = client.CoordinationV1Api(self.api)
        try:
            lease = await coord.read_namespaced_lease(self.cfg.lease_name, self.cfg.lease_namespace)
            if lease.spec.holder_identity != self.cfg.identity:
                return
            past = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=self.cfg.lease_duration)
            lease.spec.holder_identity = cast(str, None)  # cleared: nobody holds it
            lease.spec.lease_duration_seconds = 1
            lease.spec.renew_time = past
            await coord.replace_namespaced_lease(
                self.cfg.lease_name, self.cfg.lease_namespace, lease
            )
            log.info("leader_released", reason=self.cfg.identity)
        except client.ApiException as exc:
            log.warning("leader_release_failed", reason=f"{exc.status} {exc.reason}")
        except CONNECTION_ERRORS as exc:  # the lease expires by itself
            log.warning("leader_release_failed", reason=f"{type(exc).__name__}: {exc}"[:300])
