"""ElasticQuotas on the control side: the watched objects, each namespace's usage, and
the ``status.used`` Lattice writes back.

Theory of operation
-------------------
* **Objects.** scheduler-plugins' ``ElasticQuota`` (``scheduling.x-k8s.io/v1alpha1``) is
  watched like the PodGroup (a stream of the intake, applied by the feed). Each body is
  parsed once, when it arrives; a body that does not parse is kept as the reason its
  namespace's pods are refused (:class:`~scheduler.core.quota.QuotaSnapshot`'s
  ``invalid``), never raised into the watch. The CRD is optional: without it (404) or
  without the grant (403) the stream is an empty set and no pod is governed.
* **Usage.** :class:`NamespaceUsage` sums, per namespace, what every pod on a node holds
  (:func:`~scheduler.core.quota.pod_request` of the placed pod): the cache calls it where
  it adds a pod to or removes one from the snapshot, so it covers pods bound by anyone
  (kube-scheduler's in a quota namespace are counted as used), Lattice's assumed pods from
  the moment they are assumed, and drops finished and deleted pods exactly when the
  snapshot does. Nothing is persisted: after a restart or a failover the bound pods' list
  rebuilds it. Devices of DRA claims are added when a snapshot is taken, from the claims as
  they are then (an allocation lands after the pod is placed).
* **Snapshots.** :meth:`QuotaBook.snapshot` joins the parsed quotas with the usage: a few
  dictionary operations per quota, taken per cycle of a pod in a quota namespace only.
* **Status.** The leader writes each quota's ``status.used`` when it differs from what the
  object last showed (read from the watch, so a restart does not rewrite it), through the
  status subresource with a merge patch (resources no longer used are removed).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final, Protocol

from scheduler.core.dra.state import DraState
from scheduler.core.quota import (
    GROUP,
    PLURAL,
    VERSION,
    Quota,
    QuotaSnapshot,
    add,
    claim_request,
    format_vector,
    parse_quota,
    pod_claims,
    pod_request,
    subtract,
)
from scheduler.model.errors import InvalidObjectError
from scheduler.model.pod import Pod

__all__ = ["GROUP", "PLURAL", "VERSION", "NamespaceUsage", "QuotaBook", "StatusWriter"]

STREAM: Final = f"{PLURAL}.{GROUP}"
"""The intake stream's key."""


class NamespaceUsage:
    """Per namespace, the summed requests of the pods placed on nodes (bound or assumed)."""

    def __init__(self) -> None:
        self._used: dict[str, dict[str, int]] = {}
        self._charged: dict[str, Mapping[str, int]] = {}
        """Pod key -> what it added (removal subtracts exactly that)."""
        self._with_claims: dict[str, dict[str, Pod]] = {}
        """Namespace -> pod key -> placed pods with DRA claims (counted at snapshot time)."""

    def placed(self, pod: Pod) -> None:
        key = f"{pod.namespace}/{pod.name}"
        if key in self._charged:
            self.removed(pod)
        amount = MappingProxyType(pod_request(pod, bound=True))
        self._charged[key] = amount
        ns = self._used.setdefault(pod.namespace, {})
        for name, value in amount.items():
            ns[name] = ns.get(name, 0) + value
        if pod.resource_claims:
            self._with_claims.setdefault(pod.namespace, {})[key] = pod

    def removed(self, pod: Pod) -> None:
        key = f"{pod.namespace}/{pod.name}"
        amount = self._charged.pop(key, None)
        if amount is None:
            return
        left = {k: v for k, v in subtract(self._used.get(pod.namespace, {}), amount).items() if v}
        if left:
            self._used[pod.namespace] = left
        else:
            self._used.pop(pod.namespace, None)
        claims = self._with_claims.get(pod.namespace)
        if claims is not None:
            claims.pop(key, None)
            if not claims:
                del self._with_claims[pod.namespace]

    def of(self, namespace: str, dra: DraState | None = None) -> dict[str, int]:
        """The namespace's usage, its placed pods' DRA devices included."""
        used = dict(self._used.get(namespace, {}))
        pods = self._with_claims.get(namespace)
        if dra is not None and pods:
            for pod in pods.values():
                used = add(used, claim_request(pod_claims(pod, dra.claims), dra.classes))
        return used


class StatusWriter(Protocol):
    async def elasticquota_status(
        self, namespace: str, name: str, status: Mapping[str, Any]
    ) -> None: ...


@dataclass(frozen=True, slots=True)
class _Entry:
    namespace: str
    name: str
    quota: Quota | None
    error: str
    used_shown: Mapping[str, str]
    """``status.used`` as the object shows it."""


def _shown(body: Mapping[str, Any]) -> dict[str, str]:
    status = body.get("status")
    used = status.get("used") if isinstance(status, Mapping) else None
    if not isinstance(used, Mapping):
        return {}
    return {str(k): str(v) for k, v in used.items()}


class QuotaBook:
    """The cluster's ElasticQuotas, parsed, and the status Lattice last wrote to each."""

    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}
        self._written: dict[str, dict[str, str]] = {}
        """What this process wrote last per quota (the watch may lag behind its own write)."""
        self._namespaces: frozenset[str] | None = None

    def __len__(self) -> int:
        return len(self._entries)

    def keys(self) -> set[str]:
        return set(self._entries)

    def namespaces(self) -> frozenset[str]:
        """Namespaces with a quota (valid or not), kept between changes: read per cycle."""
        if self._namespaces is None:
            self._namespaces = frozenset(e.namespace for e in self._entries.values())
        return self._namespaces

    def upserted(self, body: Mapping[str, Any]) -> bool:
        """A quota was added or changed; True when its spec (what admission reads) changed."""
        meta = body.get("metadata") or {}
        ns, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        key = f"{ns}/{name}"
        try:
            quota: Quota | None = parse_quota(body)
            error = ""
        except InvalidObjectError as exc:
            quota, error = None, f"quota {key} is invalid: {exc}"
        old = self._entries.get(key)
        shown = _shown(body)
        if self._written.get(key, shown) != shown:
            self._written.pop(key)  # someone else wrote it since: the object's word counts
        self._entries[key] = _Entry(ns, name, quota, error, shown)
        self._namespaces = None
        return old is None or (old.quota, old.error) != (quota, error)

    def deleted(self, body: Mapping[str, Any]) -> bool:
        meta = body.get("metadata") or {}
        key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        self._written.pop(key, None)
        if self._entries.pop(key, None) is None:
            return False
        self._namespaces = None
        return True

    def snapshot(self, usage: NamespaceUsage, dra: DraState | None = None) -> QuotaSnapshot:
        """Every quota with its namespace's usage now (one quota per namespace counts: of
        several, the first by name, as :meth:`QuotaSnapshot.build` picks)."""
        quotas: dict[str, Quota] = {}
        invalid: dict[str, str] = {}
        for key in sorted(self._entries):
            e = self._entries[key]
            if e.namespace in quotas or e.namespace in invalid:
                continue
            if e.quota is None:
                invalid[e.namespace] = e.error
            else:
                quotas[e.namespace] = e.quota.with_used(usage.of(e.namespace, dra))
        return QuotaSnapshot(MappingProxyType(quotas), MappingProxyType(invalid))

    def entries(self) -> Iterable[tuple[str, str, Quota | None, str]]:
        """(namespace, name, parsed quota or None, error) of every quota, by key."""
        for key in sorted(self._entries):
            e = self._entries[key]
            yield e.namespace, e.name, e.quota, e.error

    def status_patches(self, snapshot: QuotaSnapshot) -> list[tuple[str, str, dict[str, Any]]]:
        """(namespace, name, merge patch of ``status``) of every quota whose used differs
        from what it shows; a quota that is not the one counted in its namespace, or is
        invalid, is left alone."""
        out: list[tuple[str, str, dict[str, Any]]] = []
        for key in sorted(self._entries):
            e = self._entries[key]
            quota = snapshot.quotas.get(e.namespace)
            if quota is None or quota.name != e.name:
                continue
            want = format_vector({k: v for k, v in quota.used.items() if v})
            shown = self._written.get(key, e.used_shown)
            if want == shown:
                continue
            used: dict[str, Any] = dict(want)
            for gone in shown.keys() - want.keys():
                used[gone] = None  # merge patch: remove
            out.append((e.namespace, e.name, {"used": used}))
        return out

    def wrote(self, namespace: str, name: str, patch: Mapping[str, Any]) -> None:
        used = patch.get("used") or {}
        self._written[f"{namespace}/{name}"] = {k: v for k, v in used.items() if v is not None}

    async def write_statuses(self, writer: StatusWriter, snapshot: QuotaSnapshot) -> int:
        """Write every changed ``status.used``; returns how many were written. Best effort:
        a failed write is retried on the next round (the difference is still there)."""
        written = 0
        for namespace, name, patch in self.status_patches(snapshot):
            await writer.elasticquota_status(namespace, name, patch)
            self.wrote(namespace, name, patch)
            written += 1
        return written
