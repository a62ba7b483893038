"""The scheduler's writes to the API: bindings, Events, the PodScheduled condition and
preemption's (a preemptor's ``nominatedNodeName``; a victim's DisruptionTarget condition and
its deletion).

Lattice writes nothing to a pod but these (and, for topology-aligned pods, the
device annotation at bind time): no finalizers, no kopf progress annotations.
Every write passes the client-side rate limiter. Outcomes of a binding are
values, because each one means something different to the cache and queue.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import enum
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, cast

import aiohttp
import orjson
from kubernetes_asyncio import client

from scheduler.control.dra import (
    create_claim,
    deallocate_claim,
    delete_claim,
    find_extended_claims,
    unreserve_claim,
    write_claim,
)
from scheduler.control.ratelimit import TokenBucket
from scheduler.control.transient import TRANSPORT_ERRORS, describe
from scheduler.core.dra.objects import ResourceClaim
from scheduler.core.dra.state import ClaimWrite
from scheduler.core.quota import GROUP as QUOTA_GROUP
from scheduler.core.quota import PLURAL as QUOTA_PLURAL
from scheduler.core.quota import VERSION as QUOTA_VERSION
from scheduler.core.volumes import PERSISTENT_VOLUME, VolumePatch
from scheduler.model.workload import UPSTREAM_GROUP, UPSTREAM_PLURAL, UPSTREAM_VERSION

TRACE_ANNOTATION = "lattice.dev/trace-id"
PODGROUP_GROUP = "scheduling.x-k8s.io"
PODGROUP_VERSION = "v1alpha1"
PODGROUP_PLURAL = "podgroups"

CONNECTION_ERRORS: Final = TRANSPORT_ERRORS
"""A request whose answer never came (ClientError: e.g. ServerDisconnected, no OSError):
the one rule of :mod:`scheduler.control.transient`."""


def _lost(exc: BaseException) -> str:
    return describe(exc)


class BindResult(enum.Enum):
    BOUND = "bound"
    """We bound it (or it was already bound to the same node by an earlier try of ours)."""
    BOUND_ELSEWHERE = "bound-elsewhere"
    """Someone else bound it first: forget our assumption, the watch brings the truth."""
    GONE = "gone"
    """The pod (or that incarnation of it) no longer exists."""
    ERROR = "error"
    """Anything else: forget, back off, retry."""


@dataclass(frozen=True)
class BindOutcome:
    result: BindResult
    detail: str = ""
    node: str | None = None


@dataclass(frozen=True)
class PodRef:
    namespace: str
    name: str
    uid: str


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def api_now() -> str:
    """Now as the API's timestamps (a condition's ``lastTransitionTime``)."""
    return _now()


class KubeWriter:
    """Rate-limited writes of one scheduler instance."""

    def __init__(
        self,
        api: client.ApiClient,
        *,
        component: str,
        instance: str,
        limiter: TokenBucket,
        report_limiter: TokenBucket | None = None,
    ) -> None:
        """``limiter`` paces bindings (and the read a 409 needs); ``report_limiter`` paces
        events and status patches, each at the client QPS: a burst of FailedScheduling
        events or PodGroup status writes never makes a binding wait for a token."""
        self._api = api
        self._core = client.CoreV1Api(api)
        self._objects = client.CustomObjectsApi(api)
        self._post = JsonPoster(api)
        self._component = component
        self._instance = instance
        self.limiter = limiter
        self.report_limiter = report_limiter or TokenBucket(limiter.qps, limiter.burst)

    def reconfigure(self, qps: float, burst: int) -> None:
        self.limiter.reconfigure(qps, burst)
        self.report_limiter.reconfigure(qps, burst)

    async def open_connections(self, count: int) -> int:
        """See :meth:`JsonPoster.open_connections`: the writes' pool, opened ahead."""
        return await self._post.open_connections(count)

    async def bind(
        self, pod: PodRef, node: str, annotations: dict[str, str] | None = None
    ) -> BindOutcome:
        """POST pods/binding with the pod's uid as precondition; classify the answer."""
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": pod.name, "namespace": pod.namespace, "uid": pod.uid},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        if annotations:
            body["metadata"]["annotations"] = annotations
        await self.limiter.acquire()
        try:
            await self._post(f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}/binding", body)
            return BindOutcome(BindResult.BOUND, node=node)
        except client.ApiException as exc:
            if exc.status == 404:
                return BindOutcome(BindResult.GONE, _reason(exc))
            if exc.status == 409:
                return await self._after_conflict(pod, node, exc)
            return BindOutcome(BindResult.ERROR, f"{exc.status}: {_reason(exc)}")
        except CONNECTION_ERRORS as exc:
            # ClientError: e.g. ServerDisconnected, an API server stopping mid-request (it
            # is no OSError); the binding may have landed, which the retry's 409 tells.
            return BindOutcome(BindResult.ERROR, _lost(exc))

    async def _after_conflict(
        self, pod: PodRef, node: str, exc: client.ApiException
    ) -> BindOutcome:
        """409: already bound (maybe by our own earlier, lost-reply try), or a new uid."""
        try:
            await self.limiter.acquire()
            current = await self._core.read_namespaced_pod(pod.name, pod.namespace)
        except client.ApiException as again:
            if again.status == 404:
                return BindOutcome(BindResult.GONE, _reason(again))
            return BindOutcome(BindResult.ERROR, f"{again.status}: {_reason(again)}")
        except CONNECTION_ERRORS as lost:  # the retry's read tells it next time
            return BindOutcome(BindResult.ERROR, f"409, then reading the pod: {_lost(lost)}")
        if current.metadata.uid != pod.uid:
            return BindOutcome(BindResult.GONE, "pod was recreated")
        bound_to = current.spec.node_name
        if bound_to == node:
            return BindOutcome(BindResult.BOUND, "already bound here", node=node)
        if bound_to:
            return BindOutcome(BindResult.BOUND_ELSEWHERE, f"bound to {bound_to}", node=bound_to)
        return BindOutcome(BindResult.ERROR, f"409: {_reason(exc)}")

    async def event(
        self,
        pod: PodRef,
        *,
        reason: str,
        message: str,
        warning: bool = False,
        action: str = "Scheduling",
        trace_id: str | None = None,
        kind: str = "Pod",
        api_version: str = "v1",
    ) -> None:
        """A core/v1 Event on the pod (or, with ``kind``, another namespaced object such as
        a PodGroup), as kube-scheduler records Scheduled/FailedScheduling."""
        now = _now()
        meta: dict[str, Any] = {
            "name": f"{pod.name}.{time.time_ns():x}",  # as client-go names them
            "namespace": pod.namespace,
        }
        if trace_id:
            meta["annotations"] = {TRACE_ANNOTATION: trace_id}
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": meta,
            "involvedObject": {
                "apiVersion": api_version,
                "kind": kind,
                "namespace": pod.namespace,
                "name": pod.name,
                "uid": pod.uid,
            },
            "reason": reason,
            "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "action": action,
            "source": {"component": self._component},
            "reportingComponent": self._component,
            "reportingInstance": self._instance,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        await self.report_limiter.acquire()
        try:
            await self._post(f"/api/v1/namespaces/{pod.namespace}/events", body)
        except client.ApiException as exc:
            if exc.status != 404:  # namespace being deleted: nobody will read it
                raise

    async def podgroup_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        """Merge-patch a PodGroup's status subresource; a PodGroup that is gone is ignored."""
        await self._patch_custom_status(
            (PODGROUP_GROUP, PODGROUP_VERSION, PODGROUP_PLURAL), namespace, name, status
        )

    async def upstream_podgroup_status(
        self, namespace: str, name: str, status: Mapping[str, Any]
    ) -> None:
        """Merge-patch a ``scheduling.k8s.io`` PodGroup's status (its conditions); a group
        that is gone is ignored."""
        await self._patch_custom_status(
            (UPSTREAM_GROUP, UPSTREAM_VERSION, UPSTREAM_PLURAL), namespace, name, status
        )

    async def elasticquota_status(
        self, namespace: str, name: str, status: Mapping[str, Any]
    ) -> None:
        """Merge-patch an ElasticQuota's status subresource (``status.used``); a quota that
        is gone is ignored."""
        await self._patch_custom_status(
            (QUOTA_GROUP, QUOTA_VERSION, QUOTA_PLURAL), namespace, name, status
        )

    async def _patch_custom_status(
        self,
        resource: tuple[str, str, str],
        namespace: str,
        name: str,
        status: Mapping[str, Any],
    ) -> None:
        """A namespaced custom object's status, merge-patched under the report limiter
        (status is bookkeeping: it waits behind bindings); 404 means the object is gone."""
        group, version, plural = resource
        await self.report_limiter.acquire()
        try:
            # The generated signature lacks _content_type; the method accepts it.
            patch = cast(Any, self._objects).patch_namespaced_custom_object_status
            resp = await patch(
                group,
                version,
                namespace,
                plural,
                name,
                {"status": status},
                _preload_content=False,
                _content_type="application/merge-patch+json",
            )
            await _release_checked(resp)
        except client.ApiException as exc:
            if exc.status != 404:
                raise

    async def patch_volume(self, patch: VolumePatch) -> str | None:
        """VolumeBinding's PreBind write: merge-patch a PV (claimRef) or a PVC (the
        selected-node annotation). The patch carries the object's resourceVersion, so a
        stale view is a 409, as kube's Update is. None on success, else why it failed."""
        await self.limiter.acquire()
        what = f"{patch.kind} {patch.namespace + '/' if patch.namespace else ''}{patch.name}"
        core = cast(Any, self._core)  # the generated signatures lack _content_type
        try:
            if patch.kind == PERSISTENT_VOLUME:
                resp = await core.patch_persistent_volume(
                    patch.name,
                    patch.body,
                    _preload_content=False,
                    _content_type="application/merge-patch+json",
                )
            else:
                resp = await core.patch_namespaced_persistent_volume_claim(
                    patch.name,
                    patch.namespace,
                    patch.body,
                    _preload_content=False,
                    _content_type="application/merge-patch+json",
                )
            await _release_checked(resp)
        except client.ApiException as exc:
            return f"updating {what}: {exc.status} {_reason(exc)}"
        except CONNECTION_ERRORS as exc:  # the next attempt reads the object afresh
            return f"updating {what}: {_lost(exc)}"
        return None

    async def write_claim(
        self, write: ClaimWrite, *, pod_name: str, pod_uid: str
    ) -> tuple[dict[str, Any] | None, str | None]:
        """DynamicResources' PreBind write of one ResourceClaim (see
        :func:`scheduler.control.dra.write_claim`), paced like the bindings. A lost
        connection is a failure like the API's (the binding path undoes and requeues)."""
        await self.limiter.acquire()
        try:
            return await write_claim(self._api, write, pod_name=pod_name, pod_uid=pod_uid)
        except CONNECTION_ERRORS as exc:
            return None, f"writing resourceclaim {write.namespace}/{write.name}: {_lost(exc)}"

    async def create_claim(
        self, body: Mapping[str, Any], *, pod_uid: str
    ) -> tuple[dict[str, Any] | None, str | None]:
        """PreBind's creation of the claim for a pod's extended resources
        (:func:`scheduler.control.dra.create_claim`). When the connection is lost the claim
        may have been made all the same: the pod's claims are looked up and deleted, so that
        none is left behind (if that fails too, the next attempt finds and deletes it)."""
        await self.limiter.acquire()
        try:
            return await create_claim(self._api, body)
        except CONNECTION_ERRORS as exc:
            failed = f"creating the claim for extended resources: {_lost(exc)}"
        namespace = str(body["metadata"]["namespace"])
        try:
            await self.limiter.acquire()
            for made in await find_extended_claims(self._api, namespace, pod_uid):
                meta = made["metadata"]
                await self.limiter.acquire()
                await delete_claim(self._api, namespace, meta["name"], meta["uid"])
        except (*CONNECTION_ERRORS, client.ApiException) as exc:
            failed += f"; looking for the claim it may have made: {exc}"
        return None, failed

    async def delete_claim(self, namespace: str, name: str, uid: str) -> str | None:
        """Unreserve's and PostFilter's deletion of a claim made for extended resources
        (:func:`scheduler.control.dra.delete_claim`)."""
        await self.limiter.acquire()
        try:
            return await delete_claim(self._api, namespace, name, uid)
        except CONNECTION_ERRORS as exc:
            return f"deleting resourceclaim {namespace}/{name}: {_lost(exc)}"

    async def set_extended_claim_status(self, pod: PodRef, status: Mapping[str, Any]) -> str | None:
        """PreBind's last step for extended resources: the pod's
        ``status.extendedResourceClaimStatus``. None when written, else why not."""
        try:
            if await self.patch_pod_status(pod, status):
                return None
            return f"pod {pod.namespace}/{pod.name} is gone"
        except client.ApiException as exc:
            return f"updating pod {pod.namespace}/{pod.name} status: {exc.status} {_reason(exc)}"
        except CONNECTION_ERRORS as exc:
            return f"updating pod {pod.namespace}/{pod.name} status: {_lost(exc)}"

    async def deallocate_claim(
        self, claim: ResourceClaim, *, pod_uid: str
    ) -> tuple[dict[str, Any] | None, str | None]:
        """DynamicResources' PostFilter write (:func:`scheduler.control.dra.deallocate_claim`)."""
        await self.limiter.acquire()
        try:
            return await deallocate_claim(self._api, claim, pod_uid=pod_uid)
        except CONNECTION_ERRORS as exc:
            return None, f"deallocating resourceclaim {claim.namespace}/{claim.name}: {_lost(exc)}"

    async def unreserve_claim(self, write: ClaimWrite, *, pod_uid: str) -> str | None:
        """DynamicResources' Unreserve (:func:`scheduler.control.dra.unreserve_claim`)."""
        await self.limiter.acquire()
        try:
            return await unreserve_claim(self._api, write, pod_uid=pod_uid)
        except CONNECTION_ERRORS as exc:
            return f"unreserving resourceclaim {write.namespace}/{write.name}: {_lost(exc)}"

    async def mark_unschedulable(
        self,
        pod: PodRef,
        message: str,
        *,
        reason: str = "Unschedulable",
        nominated_node: str | None = None,
    ) -> None:
        """PodScheduled=False. Reason Unschedulable (no node fits) is what cluster-autoscaler
        scales up for; SchedulerError (an internal error, an unreadable pod) is not, as in
        kube-scheduler. ``nominated_node`` (a preemption's node; ``""`` clears it) goes in
        the same patch, as kube-scheduler's ``updatePod`` writes them."""
        status: dict[str, Any] = {
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": reason,
                    "message": message,
                    "lastTransitionTime": _now(),
                }
            ]
        }
        if nominated_node is not None:
            status["nominatedNodeName"] = nominated_node or None
        await self.report_limiter.acquire()
        await self._patch_status(pod, {"status": status})

    async def patch_pod_status(self, pod: PodRef, status: Mapping[str, Any]) -> bool:
        """Strategic-merge-patch a pod's status (conditions merge by type; a None value
        removes a field). False when the pod is gone (404) or is another incarnation (409
        on the uid precondition); other failures raise."""
        await self.limiter.acquire()
        body = {"metadata": {"uid": pod.uid}, "status": dict(status)}
        try:
            await self._patch_status(pod, body, quiet=False)
        except client.ApiException as exc:
            if exc.status in (404, 409):
                return False
            raise
        return True

    async def delete_pod(self, pod: PodRef) -> bool:
        """DELETE the pod with its default grace period, precondition its uid (never a pod
        re-created under the name). False when it is gone already (404, or 409: another
        uid); other failures raise."""
        await self.limiter.acquire()
        body = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=pod.uid))
        try:
            resp = await self._core.delete_namespaced_pod(
                pod.name, pod.namespace, body=body, _preload_content=False
            )
            await _release_checked(resp)
        except client.ApiException as exc:
            if exc.status in (404, 409):
                return False
            raise
        return True

    async def _patch_status(
        self, pod: PodRef, patch: Mapping[str, Any], *, quiet: bool = True
    ) -> None:
        """PATCH pods/status (strategic merge, the client's default for a dict body);
        ``quiet``: a pod that is gone (404) is no error."""
        try:
            resp = await self._core.patch_namespaced_pod_status(
                pod.name, pod.namespace, patch, _preload_content=False
            )
            await _release_checked(resp)
        except client.ApiException as exc:
            if not quiet or exc.status != 404:
                raise


POST_TIMEOUT = aiohttp.ClientTimeout(total=60.0)
"""kube-apiserver's own default request timeout: past it the server would have answered."""


WARM_UP_TIMEOUT: Final = aiohttp.ClientTimeout(total=5.0)
"""A slow API server delays the first cycle by this much at most: the head start is not
worth more."""


class JsonPoster:
    """POST a JSON body on the ApiClient's own session (its connection pool, TLS, proxy and
    credentials, refreshed as the generated client refreshes them), without the generated
    client's per-call work: measured at ~100 of ~370 µs CPU per binding or Event, the two
    writes every pod costs. Non-2xx answers raise :class:`ApiException` as the generated
    client's do, with the body, so callers judge 404/409 the same way."""

    def __init__(self, api: client.ApiClient) -> None:
        self._api = api

    async def _options(
        self, content_type: str | None, limit: aiohttp.ClientTimeout
    ) -> dict[str, Any]:
        """Headers (credentials refreshed) and the per-request options the client's own
        calls pass: proxy, its headers, the TLS server name."""
        api = self._api
        headers: dict[str, str] = {**api.default_headers, "Accept": "application/json"}
        if content_type is not None:
            headers["Content-Type"] = content_type
        await api.update_params_for_auth(headers, [], ["BearerToken"])
        rest = api.rest_client
        options: dict[str, Any] = {"headers": headers, "timeout": limit}
        if rest.proxy:
            options["proxy"] = rest.proxy
        if rest.proxy_headers:
            options["proxy_headers"] = rest.proxy_headers
        if rest.server_hostname:
            options["server_hostname"] = rest.server_hostname
        return options

    @property
    def _session(self) -> aiohttp.ClientSession:
        session: aiohttp.ClientSession = self._api.rest_client.pool_manager
        return session

    async def __call__(self, path: str, body: Mapping[str, Any]) -> None:
        options = await self._options("application/json", POST_TIMEOUT)
        async with self._session.post(
            f"{self._api.configuration.host}{path}", data=orjson.dumps(body), **options
        ) as resp:
            data = await resp.read()  # small; read whole so the connection goes back
            if 200 <= resp.status <= 299:
                return
            exc = client.ApiException(status=resp.status, reason=str(resp.reason))
            exc.body = data
            raise exc

    async def open_connections(self, count: int) -> int:
        """Open ``count`` keep-alive connections now, with as many concurrent ``GET
        /version`` (readable by every authenticated client): a burst of bindings then finds
        them open instead of paying a TLS handshake each, on both sides, while it schedules.
        Best effort: how many answered; a failure costs only the head start."""
        url = f"{self._api.configuration.host}/version"

        async def one() -> bool:
            options = await self._options(None, WARM_UP_TIMEOUT)
            try:
                async with self._session.get(url, **options) as resp:
                    await resp.read()
                    return 200 <= resp.status <= 299
            except (aiohttp.ClientError, OSError, TimeoutError):
                return False

        done = await asyncio.gather(*(one() for _ in range(count)))
        return sum(done)


KEEPALIVE_S: Final = 60.0
"""How long our idle connections stay open. aiohttp's default, 15 s, closed them between
two bursts of bindings a few seconds of quiet apart, and each burst opened them again, a
TLS handshake each on both sides. kube-apiserver closes idle connections at 90 s; below
that, no request races the server's close."""


def keep_connections_open(api: client.ApiClient, seconds: float = KEEPALIVE_S) -> bool:
    """Set the keep-alive of the client's connection pool (the generated client builds its
    connector with aiohttp's default); False if this aiohttp has no such setting."""
    connector = cast(Any, api).rest_client.pool_manager.connector
    if not hasattr(connector, "_keepalive_timeout"):  # no public setter
        return False
    connector._keepalive_timeout = seconds
    return True


async def _release_checked(resp: Any) -> None:
    """Release a raw (``_preload_content=False``) reply, raising :class:`ApiException` for
    a non-2xx status: the generated client checks the status only when it preloads, so a
    404, 409 or 429 would otherwise read as success (a 429 from an API server that is still
    starting made a binding that never happened look done)."""
    status = int(resp.status)
    if 200 <= status <= 299:
        resp.release()
        return
    exc = client.ApiException(status=status, reason=str(resp.reason))
    exc.body = await resp.read()
    raise exc


def _reason(exc: client.ApiException) -> str:
    try:
        message: str = json.loads(exc.body or b"")["message"]
        return message
    except (TypeError, ValueError, KeyError):
        return str(exc.reason)
