"""DRA objects from the watch, and DynamicResources' PreBind writes, for `lattice run`.

The watch side keeps the cache's :class:`~scheduler.core.dra.state.DraState` current from
three streams (DeviceClasses, ResourceClaims in every namespace, ResourceSlices), and a
fourth where the API server serves ``devicetaintrules`` in ``resource.k8s.io/v1`` (1.37;
the start-up discovers it). An object that does not parse is logged, dropped from the
state and listed in :attr:`DraObjects.broken`; it never stops the stream. A claim event
older than the version already held (the echo of an intermediate write, after PreBind
stored the final one) is ignored, so a written allocation never looks undone.

PreBind (:func:`write_claim`, kube's DynamicResources PreBind): for each claim of the
decision's :class:`~scheduler.core.dra.state.ClaimPlan`, read the claim, refuse if it is
being deleted or (for an allocation) got allocated meanwhile, add the
``resource.kubernetes.io/delete-protection`` finalizer (a merge patch conditional on the
version read, where kube uses an Update), then set
``status.allocation`` and append the pod to ``status.reservedFor`` with an UpdateStatus;
a 409 re-reads and retries. The written claim goes into the state at once (kube's
``AssumeClaimAfterAPICall``), which also ends the assumption.

DRA-backed extended resources (kube's ``extendeddynamicresources.go``): PreBind first
creates the claim (:func:`create_claim`), then writes it as above. Its undo, in Unreserve
after a failed binding and in PostFilter for a claim left by an earlier attempt, is
:func:`delete_claim` (the finalizer removed, then the claim deleted). A creation whose answer
was lost may still have landed: :func:`find_extended_claims` lists the pod's.

These are the API calls; the binding cycle's DynamicResources step that runs them (and
undoes them) is :mod:`~scheduler.control.dra_binding`.
"""

from __future__ import annotations

import asyncio
import copy
import datetime
import enum
import json
from collections.abc import Mapping
from typing import Any, Final, cast

from kubernetes_asyncio import client

from scheduler.core.dra.objects import (
    DELETE_PROTECTION_FINALIZER,
    EXTENDED_RESOURCE_CLAIM_ANNOTATION,
    DeviceClass,
    DeviceTaintRule,
    ResourceClaim,
    ResourceSlice,
)
from scheduler.core.dra.state import ClaimWrite, DraState
from scheduler.model.errors import InvalidObjectError

Body = Mapping[str, Any]
GROUP: Final = "resource.k8s.io"
VERSION: Final = "v1"
CONFLICT_RETRIES: Final = 5
"""client-go's ``retry.DefaultRetry`` steps, which kube's PreBind uses."""


class Kind(enum.StrEnum):
    CLASS = "deviceclass"
    CLAIM = "resourceclaim"
    SLICE = "resourceslice"
    TAINT_RULE = "devicetaintrule"


def object_key(kind: Kind, body: Body) -> str:
    meta = body.get("metadata") or {}
    name = str(meta.get("name") or "")
    if kind is Kind.CLAIM:
        return f"{meta.get('namespace') or 'default'}/{name}"
    return name


def _message(exc: client.ApiException) -> str:
    """The API server's own message (a 422 says which field), else the HTTP reason."""
    try:
        message: str = json.loads(exc.body or b"")["message"]
    except (TypeError, ValueError, KeyError):
        return str(exc.reason)
    return message


def _rv(value: str) -> int | None:
    try:
        return int(value)
    except ValueError:
        return None


class DraObjects:
    """The DraState's writer on the watch side."""

    def __init__(self, state: DraState, *, log: Any) -> None:
        self.state = state
        self.log = log
        self.broken: dict[str, str] = {}
        self._claim_changed = asyncio.Event()
        """Set (and replaced) on every ResourceClaim event: wakes PreBind's wait for
        binding conditions (:meth:`claim_change`)."""

    def upsert(self, kind: Kind, body: Body) -> None:
        key = object_key(kind, body)
        try:
            self._set(kind, body)
        except (InvalidObjectError, ValueError, TypeError) as exc:
            self.log.warning("dra_object_unreadable", pod=f"{kind}/{key}", reason=str(exc))
            self.broken[f"{kind}/{key}"] = str(exc)
            self._remove(kind, key)
        else:
            self.broken.pop(f"{kind}/{key}", None)
        self._notify(kind)

    def delete(self, kind: Kind, body: Body) -> None:
        key = object_key(kind, body)
        self.broken.pop(f"{kind}/{key}", None)
        self._remove(kind, key)
        self._notify(kind)

    def _notify(self, kind: Kind) -> None:
        if kind is Kind.CLAIM:
            self._claim_changed.set()
            self._claim_changed = asyncio.Event()

    async def claim_change(self, within: float) -> None:
        """Until some ResourceClaim changes, at most ``within`` seconds."""
        changed = self._claim_changed
        try:
            await asyncio.wait_for(changed.wait(), timeout=within)
        except TimeoutError:
            return

    def keys(self, kind: Kind) -> set[str]:
        s = self.state
        known = {
            Kind.CLASS: set(s.classes),
            Kind.CLAIM: {f"{ns}/{name}" for ns, name in s.claims},
            Kind.SLICE: set(s.slices),
            Kind.TAINT_RULE: set(s.taint_rules),
        }[kind]
        return known | {k.split("/", 1)[1] for k in self.broken if k.startswith(f"{kind}/")}

    def claim_written(self, body: Body) -> None:
        """The claim as our own write returned it (newer than anything the watch held)."""
        self.upsert(Kind.CLAIM, body)

    def _set(self, kind: Kind, body: Body) -> None:
        if kind is Kind.CLASS:
            self.state.set_class(DeviceClass.from_api(body))
        elif kind is Kind.SLICE:
            self.state.set_slice(ResourceSlice.from_api(body))
        elif kind is Kind.TAINT_RULE:
            self.state.set_taint_rule(DeviceTaintRule.from_api(body))
        else:
            claim = ResourceClaim.from_api(body)
            held = self.state.claims.get(claim.key)
            if held is not None and held.uid == claim.uid:
                new, old = _rv(claim.resource_version), _rv(held.resource_version)
                if new is not None and old is not None and new < old:
                    return
            self.state.set_claim(claim)

    def _remove(self, kind: Kind, key: str) -> None:
        if kind is Kind.CLASS:
            self.state.remove_class(key)
        elif kind is Kind.SLICE:
            self.state.remove_slice(key)
        elif kind is Kind.TAINT_RULE:
            self.state.remove_taint_rule(key)
        else:
            namespace, _, name = key.partition("/")
            self.state.remove_claim(namespace, name)


async def _patch_status(
    objects: client.CustomObjectsApi,
    namespace: str,
    name: str,
    resource_version: object,
    status: dict[str, Any],
) -> dict[str, Any]:
    """A merge patch of ``status``, conditional on the version read (409 if it moved).

    Never a PUT of the object read: its ``status.allocation`` would be sent back re-encoded
    from Python, and the API server compares opaque config parameters byte by byte, so an
    allocation another writer made (kube-scheduler, a driver, an operator) comes back as a
    change of that immutable field (422). The patch names only what this write changes.
    """
    body = {"metadata": {"resourceVersion": resource_version}, "status": status}
    written: dict[str, Any] = await cast(Any, objects).patch_namespaced_custom_object_status(
        GROUP,
        VERSION,
        namespace,
        "resourceclaims",
        name,
        body,
        _content_type="application/merge-patch+json",
    )
    return written


async def deallocate_claim(
    api: client.ApiClient, claim: ResourceClaim, *, pod_uid: str
) -> tuple[dict[str, Any] | None, str | None]:
    """kube's PostFilter write: clear ``status.allocation``, ``reservedFor`` and
    ``devices`` of a claim reserved by nobody but the pod (checked again on the fresh
    object; a 409 re-reads). (the claim as written, None) when done, (None, None) when no
    longer needed, else (None, why it failed)."""
    objects = client.CustomObjectsApi(api)
    what = f"resourceclaim {claim.namespace}/{claim.name}"
    for _ in range(CONFLICT_RETRIES):
        try:
            body: dict[str, Any] = await objects.get_namespaced_custom_object(
                GROUP, VERSION, claim.namespace, "resourceclaims", claim.name
            )
        except client.ApiException as exc:
            if exc.status == 404:
                return None, None
            return None, f"reading {what}: {exc.status} {_message(exc)}"
        status = body.get("status") or {}
        if (body.get("metadata") or {}).get("uid") != claim.uid or not status.get("allocation"):
            return None, None
        if any(r.get("uid") != pod_uid for r in status.get("reservedFor") or []):
            return None, None
        try:
            written = await _patch_status(
                objects,
                claim.namespace,
                claim.name,
                body["metadata"].get("resourceVersion"),
                dict.fromkeys(_DEALLOCATED),
            )
        except client.ApiException as exc:
            if exc.status == 409:
                continue
            return None, f"deallocating {what}: {exc.status} {_message(exc)}"
        return written, None
    return None, f"deallocating {what}: still conflicting after {CONFLICT_RETRIES} attempts"


_DEALLOCATED: Final = frozenset({"allocation", "reservedFor", "devices"})


async def unreserve_claim(api: client.ApiClient, write: ClaimWrite, *, pod_uid: str) -> str | None:
    """kube's Unreserve after a failed binding: the pod leaves ``reservedFor`` (the
    allocation stays, as in kube). None when done or nothing to do, else why it failed."""
    objects = client.CustomObjectsApi(api)
    what = f"resourceclaim {write.namespace}/{write.name}"
    for _ in range(CONFLICT_RETRIES):
        try:
            body: dict[str, Any] = await objects.get_namespaced_custom_object(
                GROUP, VERSION, write.namespace, "resourceclaims", write.name
            )
        except client.ApiException as exc:
            return None if exc.status == 404 else f"reading {what}: {exc.status} {_message(exc)}"
        status = body.get("status") or {}
        reserved = list(status.get("reservedFor") or [])
        kept = [r for r in reserved if r.get("uid") != pod_uid]
        if len(kept) == len(reserved):
            return None
        try:
            await _patch_status(
                objects,
                write.namespace,
                write.name,
                (body.get("metadata") or {}).get("resourceVersion"),
                {"reservedFor": kept or None},
            )
        except client.ApiException as exc:
            if exc.status == 409:
                continue
            return (
                None if exc.status == 404 else f"unreserving {what}: {exc.status} {_message(exc)}"
            )
        return None
    return f"unreserving {what}: still conflicting after {CONFLICT_RETRIES} attempts"


def _now() -> str:
    """A ``metav1.Time`` (RFC 3339, whole seconds, UTC) for ``allocationTimestamp``."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def write_claim(
    api: client.ApiClient, write: ClaimWrite, *, pod_name: str, pod_uid: str
) -> tuple[dict[str, Any] | None, str | None]:
    """One claim's PreBind: (the written claim, None) or (None, why it failed)."""
    objects = client.CustomObjectsApi(api)
    what = f"resourceclaim {write.namespace}/{write.name}"
    for _ in range(CONFLICT_RETRIES):
        try:
            claim: dict[str, Any] = await objects.get_namespaced_custom_object(
                GROUP, VERSION, write.namespace, "resourceclaims", write.name
            )
        except client.ApiException as exc:
            return None, f"reading {what}: {exc.status} {_message(exc)}"
        meta = claim.setdefault("metadata", {})
        if write.uid and meta.get("uid") != write.uid:
            return None, f"{what} was replaced in the meantime"
        if meta.get("deletionTimestamp") is not None:
            return None, f"{what} got deleted in the meantime"
        status = claim.get("status") or {}
        if write.allocation is not None:
            if status.get("allocation") is not None:
                return None, f"{what} got allocated elsewhere in the meantime"
            finalizers = list(meta.get("finalizers") or [])
            if DELETE_PROTECTION_FINALIZER not in finalizers:
                # A merge patch conditional on the version read (kube uses an Update; a
                # PUT of the whole object from Python re-encodes opaque parameters, which
                # the API server then refuses as a change of the immutable spec).
                patch = {
                    "metadata": {
                        "finalizers": [*finalizers, DELETE_PROTECTION_FINALIZER],
                        "resourceVersion": meta.get("resourceVersion"),
                    }
                }
                try:
                    claim = await cast(Any, objects).patch_namespaced_custom_object(
                        GROUP,
                        VERSION,
                        write.namespace,
                        "resourceclaims",
                        write.name,
                        patch,
                        _content_type="application/merge-patch+json",
                    )
                except client.ApiException as exc:
                    if exc.status == 409:
                        continue
                    return None, f"adding the finalizer to {what}: {exc.status} {_message(exc)}"
            status = claim.get("status") or {}
            change: dict[str, Any] = {"allocation": copy.deepcopy(dict(write.allocation))}
            if write.stamp:
                change["allocation"]["allocationTimestamp"] = _now()
        elif status.get("allocation") is None:
            return None, f"{what} got deallocated in the meantime"
        elif write.stamp and not status["allocation"].get("allocationTimestamp"):
            # A merge patch adds the one key; the rest of the allocation is left as written.
            change = {"allocation": {"allocationTimestamp": _now()}}
        else:
            change = {}
        reserved = list(status.get("reservedFor") or [])
        if not any(r.get("uid") == pod_uid for r in reserved):
            reserved.append({"resource": "pods", "name": pod_name, "uid": pod_uid})
        change["reservedFor"] = reserved
        try:
            written = await _patch_status(
                objects,
                write.namespace,
                write.name,
                (claim.get("metadata") or {}).get("resourceVersion"),
                change,
            )
        except client.ApiException as exc:
            if exc.status == 409:
                continue
            return None, f"updating {what} status: {exc.status} {_message(exc)}"
        return written, None
    return None, f"updating {what}: still conflicting after {CONFLICT_RETRIES} attempts"


async def create_claim(
    api: client.ApiClient, body: Body
) -> tuple[dict[str, Any] | None, str | None]:
    """POST the claim for a pod's extended resources: (the created claim, None) or (None,
    why it failed). Never retried: with a generated name, a second POST would make a second
    claim if the first landed."""
    objects = client.CustomObjectsApi(api)
    namespace = str(body["metadata"]["namespace"])
    try:
        created: dict[str, Any] = await objects.create_namespaced_custom_object(
            GROUP, VERSION, namespace, "resourceclaims", dict(body)
        )
    except client.ApiException as exc:
        return None, f"creating the claim for extended resources: {exc.status} {_message(exc)}"
    return created, None


async def find_extended_claims(
    api: client.ApiClient, namespace: str, pod_uid: str
) -> list[dict[str, Any]]:
    """The claims made for the pod's extended resources (annotated, controlled by it)."""
    objects = client.CustomObjectsApi(api)
    listed: dict[str, Any] = await objects.list_namespaced_custom_object(
        GROUP, VERSION, namespace, "resourceclaims"
    )
    out: list[dict[str, Any]] = []
    for item in listed.get("items") or []:
        meta = item.get("metadata") or {}
        if (meta.get("annotations") or {}).get(EXTENDED_RESOURCE_CLAIM_ANNOTATION) != "true":
            continue
        if any(
            o.get("uid") == pod_uid and o.get("controller") is True
            for o in meta.get("ownerReferences") or []
        ):
            out.append(item)
    return out


async def delete_claim(api: client.ApiClient, namespace: str, name: str, uid: str) -> str | None:
    """kube's ``deleteClaim``: the delete-protection finalizer removed (a merge patch
    conditional on the version read, where kube uses an Update; a 409 re-reads), then the
    claim deleted with its uid as precondition. None when done or already gone, else why
    it failed."""
    objects = client.CustomObjectsApi(api)
    what = f"resourceclaim {namespace}/{name}"
    for _ in range(CONFLICT_RETRIES):
        try:
            body: dict[str, Any] = await objects.get_namespaced_custom_object(
                GROUP, VERSION, namespace, "resourceclaims", name
            )
        except client.ApiException as exc:
            return None if exc.status == 404 else f"reading {what}: {exc.status} {_message(exc)}"
        meta = body.get("metadata") or {}
        if meta.get("uid") != uid:
            return None  # deleted already and replaced by another claim of that name
        finalizers = list(meta.get("finalizers") or [])
        if DELETE_PROTECTION_FINALIZER not in finalizers:
            break
        kept = [f for f in finalizers if f != DELETE_PROTECTION_FINALIZER]
        patch = {
            "metadata": {"finalizers": kept or None, "resourceVersion": meta.get("resourceVersion")}
        }
        try:
            await cast(Any, objects).patch_namespaced_custom_object(
                GROUP,
                VERSION,
                namespace,
                "resourceclaims",
                name,
                patch,
                _content_type="application/merge-patch+json",
            )
        except client.ApiException as exc:
            if exc.status == 409:
                continue
            if exc.status == 404:
                return None
            return f"removing the finalizer of {what}: {exc.status} {_message(exc)}"
        break
    else:
        return (
            f"removing the finalizer of {what}: still conflicting after {CONFLICT_RETRIES} attempts"
        )
    try:
        await objects.delete_namespaced_custom_object(
            GROUP,
            VERSION,
            namespace,
            "resourceclaims",
            name,
            body=client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=uid)),
        )
    except client.ApiException as exc:
        if exc.status in (404, 409):  # gone, or another claim of that name (409: uid)
            return None
        return f"deleting {what}: {exc.status} {_message(exc)}"
    return None
