"""ElasticQuota admission: scheduler-plugins' CapacityScheduling rules on exact integers.

Interface (stable; the reclaim and fair-share work builds on it)
----------------------------------------------------------------
* :class:`Quota` — one ``ElasticQuota`` (``scheduling.x-k8s.io/v1alpha1``): ``namespace``,
  ``name``, ``min``, ``max``, ``used`` as resource -> int maps (cpu in millicores, the rest in
  units, as every amount of the model). A resource missing from ``min`` is 0; missing from
  ``max`` (or ``max`` absent) is unlimited. :func:`parse_quota` builds it from an API body and
  raises :class:`~scheduler.model.errors.InvalidObjectError` naming the broken field.
* :class:`QuotaSnapshot` — every quota keyed by namespace, plus the namespaces whose quota is
  broken (``invalid``: namespace -> reason). Built by :meth:`QuotaSnapshot.build` from parsed
  quotas and per-namespace usage; :meth:`QuotaSnapshot.with_used` adds a pod (assume).
* :func:`pod_request` — the vector a pod charges to its quota: the request NodeResourcesFit
  counts (extended resources and GPUs included) plus devices of its DRA claims whose
  DeviceClass maps an extended resource name (:func:`claim_request`).
* :func:`over_max`, :func:`aggregated_over_min` — the two PreFilter rules, each returning
  the first offending resource or None; :func:`admit` and :func:`admit_gang` combine them into
  a :class:`Verdict` whose message says which rule refused and by how much;
  :func:`gang_room` says how many of a gang's members fit (its quorum as one unit or none).
* :class:`QuotaContext` — what a cycle carries (``Cycle.quota``): the snapshot and the
  nominated pods whose quota room is spoken for; :func:`charged` is a pod's request with
  its claims looked up in the cluster's DRA objects.
* :func:`used_over_min`, :func:`more_than_min_with` — whether a quota borrows (reclaim's
  victim rule) and whether a preemptor's request would take its quota past ``min``; pass
  ``governed=snapshot.named()`` to read them as admission does (resources no quota names
  left out), None for upstream's reading of every resource.

Semantics (CapacityScheduling's PreFilter, ``elasticquota.go``)
---------------------------------------------------------------
A pod of a namespace with a quota is admitted while

1. ``used + request <= max`` in every resource the request names and in cpu, memory and
   ephemeral-storage (``usedOverMaxWith``), the request including the nominated pods of the
   same quota with priority at least the pod's; and
2. the use of all quotas together plus the request stays within the sum of their ``min``
   in every resource used or requested (``aggregatedUsedOverMinWith``), the request also
   including nominated pods of other quotas that do not borrow (``usedOverMin`` false).

Rule 2 is what lets a quota under its ``min`` take back what others borrowed: nobody may
grow the total past the guaranteed sum, even where nodes have room. Two deliberate
differences, both about resources a quota does not name (see docs/quotas.md): upstream reads
a missing cpu/memory/ephemeral-storage in a *set* ``max`` as 0 (Go's zero field) and refuses
every pod asking for it — here missing is unlimited for every resource, as upstream already
does for extended resources; and a resource that no quota in the cluster names in ``min`` or
``max`` is not governed by rule 2 (upstream compares it against a sum of 0 and so refuses it
everywhere — a GPU-only quota would refuse every pod that asks for a cpu).

Pure: no I/O, no clock. Every amount is an exact integer.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Final

from scheduler.core.dra.objects import EXACT_COUNT, DeviceClass, ExactRequest, ResourceClaim
from scheduler.core.dra.state import DraState
from scheduler.core.fairshare import FairShare, within_share
from scheduler.model._fields import mapping, string
from scheduler.model.errors import InvalidObjectError
from scheduler.model.names import CPU, EPHEMERAL_STORAGE, HUGEPAGES_PREFIX, MEMORY
from scheduler.model.pod import Pod
from scheduler.model.quantity import Quantity
from scheduler.model.resources import parse_resource_list, round_resources

GROUP: Final = "scheduling.x-k8s.io"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "ElasticQuota"
PLURAL: Final = "elasticquotas"

NATIVE: Final = (CPU, MEMORY, EPHEMERAL_STORAGE)
"""Resources CapacityScheduling always compares (fields of ``framework.Resource``), whether
the request names them or not."""

Vector = Mapping[str, int]
"""Integer amounts by resource name (cpu in millicores)."""

_EMPTY: Final[Vector] = MappingProxyType({})


def _frozen(values: Mapping[str, int]) -> Vector:
    return MappingProxyType(dict(sorted(values.items())))


def add(*vectors: Vector) -> dict[str, int]:
    """The sum of vectors (resources absent from one count as 0)."""
    out: dict[str, int] = {}
    for v in vectors:
        for name, amount in v.items():
            out[name] = out.get(name, 0) + amount
    return out


def subtract(a: Vector, b: Vector) -> dict[str, int]:
    """``a - b``, kept per resource even where it goes to zero (a release of ``b``)."""
    out = dict(a)
    for name, amount in b.items():
        out[name] = out.get(name, 0) - amount
    return out


@dataclass(frozen=True, slots=True)
class Quota:
    """One namespace's ElasticQuota and what its pods use now."""

    namespace: str
    name: str
    min: Vector = field(default_factory=dict)
    """Guaranteed amounts; a resource missing is 0."""
    max: Vector = field(default_factory=dict)
    """Upper bounds; a resource missing is unlimited."""
    used: Vector = field(default_factory=dict)
    """Requests of the namespace's bound and assumed pods that have not finished."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def with_used(self, used: Vector) -> Quota:
        return Quota(self.namespace, self.name, self.min, self.max, _frozen(used))


def parse_quota(body: Mapping[str, Any]) -> Quota:
    """An ``ElasticQuota`` API body as a :class:`Quota` with no usage.

    Quantities are rounded as NodeResourcesFit rounds requests (cpu up to millicores, the
    rest up to units); negative ones are refused. Raises ``InvalidObjectError``.
    """
    meta = mapping(body.get("metadata"), "metadata")
    spec = mapping(body.get("spec"), "spec")
    namespace = string(meta.get("namespace"), "metadata.namespace")
    name = string(meta.get("name"), "metadata.name")
    if not namespace:
        raise InvalidObjectError("metadata.namespace", namespace, "an ElasticQuota is namespaced")
    values = {}
    for part in ("min", "max"):
        where = f"spec.{part}"
        values[part] = _frozen(
            round_resources(parse_resource_list(spec.get(part), field=where), field=where)
        )
    return Quota(namespace, name, values["min"], values["max"])


@dataclass(frozen=True, slots=True)
class QuotaSnapshot:
    """Every quota of the cluster at one moment, keyed by namespace."""

    quotas: Mapping[str, Quota] = field(default_factory=dict)
    invalid: Mapping[str, str] = field(default_factory=dict)
    """Namespace -> why its quota could not be read: its pods are refused with that reason."""

    @classmethod
    def build(
        cls,
        bodies: Iterable[Mapping[str, Any]],
        used: Mapping[str, Vector] | None = None,
    ) -> QuotaSnapshot:
        """Parse quota bodies and attach per-namespace usage. As upstream, one quota per
        namespace counts: of several, the first by name (upstream keeps whichever its
        informer saw first). A broken one marks its namespace ``invalid``."""
        chosen: dict[str, tuple[str, Mapping[str, Any]]] = {}
        for body in bodies:
            meta = body.get("metadata")
            meta = meta if isinstance(meta, Mapping) else {}
            ns, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
            if ns not in chosen or name < chosen[ns][0]:
                chosen[ns] = (name, body)
        quotas: dict[str, Quota] = {}
        invalid: dict[str, str] = {}
        for ns, (name, body) in sorted(chosen.items()):
            try:
                quota = parse_quota(body)
            except InvalidObjectError as e:
                invalid[ns] = f"quota {ns}/{name} is invalid: {e}"
                continue
            quotas[ns] = quota.with_used((used or {}).get(ns, _EMPTY))
        return cls(MappingProxyType(quotas), MappingProxyType(invalid))

    def of(self, namespace: str) -> Quota | None:
        return self.quotas.get(namespace)

    def governs(self, namespace: str) -> bool:
        """The namespace has a quota, valid or not: its pods go through admission."""
        return namespace in self.quotas or namespace in self.invalid

    def total_min(self) -> dict[str, int]:
        return add(*(q.min for q in self.quotas.values()))

    def total_used(self) -> dict[str, int]:
        return add(*(q.used for q in self.quotas.values()))

    def named(self) -> frozenset[str]:
        """Resources some quota names in ``min`` or ``max``: those rule 2 governs."""
        return frozenset(r for q in self.quotas.values() for r in (*q.min, *q.max))

    def with_used(self, namespace: str, delta: Vector) -> QuotaSnapshot:
        """This snapshot with ``delta`` added to a namespace's usage (an assumed pod or gang;
        a negative delta releases). Namespaces without a quota are unchanged."""
        quota = self.quotas.get(namespace)
        if quota is None:
            return self
        quotas = dict(self.quotas)
        quotas[namespace] = quota.with_used(add(quota.used, delta))
        return QuotaSnapshot(MappingProxyType(quotas), self.invalid)


def claim_request(
    claims: Iterable[ResourceClaim], classes: Mapping[str, DeviceClass]
) -> dict[str, int]:
    """Devices of DRA claims, by the extended resource name their DeviceClass maps.

    An allocated claim counts its allocation's results (adminAccess ones excluded, they
    use nothing up); an unallocated one its spec: an ``ExactCount`` request's count, a
    ``firstAvailable`` request's first alternative (the one preferred). ``All`` requests
    are counted once allocated only. Classes without ``extendedResourceName`` are not
    counted (no quota could name their devices); neither are the claims the scheduler
    itself made for DRA-backed extended resources (the container requests count those).
    """
    out: dict[str, int] = {}

    def charge(exact: ExactRequest | None, amount: int) -> None:
        if exact is None:
            return
        cls = classes.get(exact.device_class)
        if cls is None or not cls.extended_resource_name:
            return
        out[cls.extended_resource_name] = out.get(cls.extended_resource_name, 0) + amount

    for claim in claims:
        if claim.extended_resources:
            continue
        by_name: dict[str, ExactRequest] = {}
        for r in claim.requests:
            if r.exactly is not None:
                by_name[r.name] = r.exactly
            for sub in r.first_available:
                by_name[f"{r.name}/{sub.name}"] = sub
        if claim.allocation is not None:
            results = mapping(claim.allocation.get("devices"), "status.allocation.devices").get(
                "results"
            )
            for result in results if isinstance(results, list) else []:
                if isinstance(result, Mapping) and result.get("adminAccess") is not True:
                    charge(by_name.get(str(result.get("request", ""))), 1)
            continue
        for r in claim.requests:
            exact = r.exactly or (r.first_available[0] if r.first_available else None)
            if exact is not None and exact.mode == EXACT_COUNT and exact.admin_access is not True:
                charge(exact, exact.count)
    return out


def pod_claims(pod: Pod, claims: Mapping[tuple[str, str], ResourceClaim]) -> list[ResourceClaim]:
    """The pod's ResourceClaims that exist (by name, or generated from a template)."""
    out: list[ResourceClaim] = []
    for ref in pod.resource_claims:
        name = pod.claim_name(ref)
        claim = claims.get((pod.namespace, name)) if name else None
        if claim is not None:
            out.append(claim)
    return out


def pod_request(pod: Pod, *, bound: bool = False, claims: Vector = _EMPTY) -> dict[str, int]:
    """What a pod charges to its quota: NodeResourcesFit's request (``bound``: what a placed
    pod holds, in-place resize honoured) plus its claims' devices (:func:`claim_request`)."""
    base = pod.resources.accounted if bound else pod.resources.requests
    return add(base, claims) if claims else dict(base)


def charged(pod: Pod, dra: DraState | None, *, bound: bool = False) -> dict[str, int]:
    """:func:`pod_request` with the pod's claims looked up in the cluster's DRA objects."""
    if dra is None or not pod.resource_claims:
        return pod_request(pod, bound=bound)
    claims = claim_request(pod_claims(pod, dra.claims), dra.classes)
    return pod_request(pod, bound=bound, claims=claims)


def _first_over(
    base: Vector, extra: Vector, limit: Vector, keys: Iterable[str], *, missing: int | None
) -> str | None:
    """The first resource (sorted) where ``base + extra > limit``; ``missing`` is the limit
    of a resource ``limit`` lacks (None: unlimited)."""
    for name in sorted(set(keys)):
        bound = limit.get(name, missing)
        if bound is not None and base.get(name, 0) + extra.get(name, 0) > bound:
            return name
    return None


def over_max(quota: Quota, request: Vector) -> str | None:
    """``usedOverMaxWith``: the first resource where ``used + request > max``, or None."""
    return _first_over(quota.used, request, quota.max, (*request, *NATIVE), missing=None)


def aggregated_over_min(snapshot: QuotaSnapshot, request: Vector) -> str | None:
    """``aggregatedUsedOverMinWith``: the first resource some quota names where the use of
    all quotas plus ``request`` exceeds the sum of their ``min``, or None."""
    total = add(snapshot.total_used(), request)
    named = snapshot.named()
    keys = [r for r in total if r in named]
    return _first_over(total, _EMPTY, snapshot.total_min(), keys, missing=0)


def _within(keys: Iterable[str], governed: frozenset[str] | None) -> list[str]:
    return [k for k in keys if governed is None or k in governed]


def used_over_min(quota: Quota, *, governed: frozenset[str] | None = None) -> bool:
    """``usedOverMin``: the quota uses more than its ``min`` somewhere (it borrows).

    ``governed``: only these resources count (pass :meth:`QuotaSnapshot.named`, as
    admission does, so a resource no quota names never makes a quota a borrower); None
    compares every resource as upstream does (cpu used under a GPU-only ``min`` borrows)."""
    keys = _within((*quota.used, *NATIVE), governed)
    return _first_over(quota.used, _EMPTY, quota.min, keys, missing=0) is not None


def more_than_min_with(
    quota: Quota, request: Vector, *, governed: frozenset[str] | None = None
) -> bool:
    """``usedOverMinWith``: ``used + request`` would exceed ``min`` in a resource of the
    request (or cpu, memory, ephemeral-storage). False means the preemptor stays within its
    guarantee and may reclaim from borrowers; True limits it to its own quota's pods.
    ``governed`` as for :func:`used_over_min`."""
    keys = _within((*request, *NATIVE), governed)
    return _first_over(quota.used, request, quota.min, keys, missing=0) is not None


class Rule(StrEnum):
    """Which rule decided; the value names it in metrics and explanations."""

    ADMITTED = "admitted"
    NO_QUOTA = "no-quota"
    MAX = "max"
    MIN = "min"
    INVALID = "invalid"


@dataclass(frozen=True, slots=True)
class Verdict:
    rule: Rule
    message: str = ""
    resource: str = ""

    @property
    def admitted(self) -> bool:
        return self.rule in (Rule.ADMITTED, Rule.NO_QUOTA)


@dataclass(frozen=True, slots=True)
class Nominated:
    """A pod nominated to a node (it preempted and waits): its room is spoken for."""

    namespace: str
    priority: int
    request: Vector
    within_share: bool = False
    """Fair share on and its quota within its fair share with it: it may have reclaimed
    from other quotas (fair share's second rule), so, like a pod of a quota within its
    min, its room counts against every quota in the sum of mins."""

    @classmethod
    def of(
        cls,
        snapshot: QuotaSnapshot,
        namespace: str,
        priority: int,
        request: Vector,
        shares: Mapping[str, FairShare] | None = None,
        capacity: Vector | None = None,
    ) -> Nominated:
        """A nominated pod of ``namespace``; ``shares`` (by namespace) and the ``capacity``
        they divide: under fair share, to tell whether its quota is within its share."""
        quota = snapshot.quotas.get(namespace)
        share = None if shares is None else shares.get(namespace)
        within = (
            quota is not None
            and share is not None
            and within_share(quota.used, request, share, capacity or {})
        )
        return cls(namespace, priority, request, within)


_BINARY: Final = (("Ei", 60), ("Pi", 50), ("Ti", 40), ("Gi", 30), ("Mi", 20), ("Ki", 10))


def format_amount(resource: str, amount: int) -> str:
    """An amount as a quantity string: cpu from millicores, bytes with a binary suffix
    where exact, counts as integers. ``Quantity.parse`` of it rounds back to ``amount``."""
    if resource == CPU:
        return str(Quantity.from_milli(amount))
    if resource in (MEMORY, EPHEMERAL_STORAGE) or resource.startswith(HUGEPAGES_PREFIX):
        for suffix, shift in _BINARY:
            if amount and amount % (1 << shift) == 0:
                return f"{amount >> shift}{suffix}"
    return str(amount)


def format_vector(vector: Vector) -> dict[str, str]:
    """A vector as an API ``ResourceList`` (what ``status.used`` holds)."""
    return {name: format_amount(name, amount) for name, amount in sorted(vector.items())}


def _nominated_totals(
    snapshot: QuotaSnapshot, namespace: str, priority: int, nominated: Iterable[Nominated]
) -> tuple[dict[str, int], dict[str, int]]:
    """Room spoken for by nominated pods: (same quota, priority >= the pod's) and, for the
    aggregate rule, those plus other quotas' nominated pods whose quota does not borrow or
    (fair share) stays within its share with them: room reclaimed for a pod stays its own
    while it waits, instead of going to the first pod admitted (the victim, recreated)."""
    same: dict[str, int] = {}
    every: dict[str, int] = {}
    governed = snapshot.named()
    for n in nominated:
        quota = snapshot.quotas.get(n.namespace)
        if quota is None:
            continue
        if n.namespace == namespace:
            if n.priority >= priority:
                same = add(same, n.request)
                every = add(every, n.request)
        elif n.within_share or not used_over_min(quota, governed=governed):
            every = add(every, n.request)
    return same, every


def admit(
    snapshot: QuotaSnapshot,
    namespace: str,
    request: Vector,
    *,
    priority: int = 0,
    nominated: Iterable[Nominated] = (),
    what: str = "pod",
) -> Verdict:
    """CapacityScheduling's PreFilter for a request of ``namespace`` (a pod, or a gang's
    sum: ``what`` names it in the message)."""
    if namespace in snapshot.invalid:
        return Verdict(Rule.INVALID, snapshot.invalid[namespace])
    quota = snapshot.quotas.get(namespace)
    if quota is None:
        return Verdict(Rule.NO_QUOTA)
    same, every = _nominated_totals(snapshot, namespace, priority, nominated)
    in_quota = add(request, same)
    resource = over_max(quota, in_quota)
    if resource is not None:
        held = f" (+{_amount(resource, same)} nominated)" if same.get(resource) else ""
        return Verdict(
            Rule.MAX,
            f"quota {quota.key}: {_amount(resource, quota.used)} of max "
            f"{_amount(resource, quota.max)} {resource} used, {what} asks "
            f"{_amount(resource, request)}{held}",
            resource,
        )
    overall = add(request, every)
    resource = aggregated_over_min(snapshot, overall)
    if resource is not None:
        held = f" (+{_amount(resource, every)} nominated)" if every.get(resource) else ""
        return Verdict(
            Rule.MIN,
            f"quota {quota.key}: all quotas use {_amount(resource, snapshot.total_used())} "
            f"of the {_amount(resource, snapshot.total_min())} {resource} their mins sum to, "
            f"{what} asks {_amount(resource, request)}{held}",
            resource,
        )
    return Verdict(Rule.ADMITTED)


def admit_gang(
    snapshot: QuotaSnapshot,
    namespace: str,
    requests: Sequence[Vector],
    *,
    priority: int = 0,
    nominated: Iterable[Nominated] = (),
) -> Verdict:
    """A gang's members of one namespace admitted as one unit: all of them fit the quota
    together, or none is admitted (a gang's quorum must not be half-charged)."""
    what = f"gang of {len(requests)}" if len(requests) != 1 else "pod"
    return admit(
        snapshot, namespace, add(*requests), priority=priority, nominated=nominated, what=what
    )


def gang_room(
    snapshot: QuotaSnapshot,
    namespace: str,
    requests: Sequence[Vector],
    need: int,
    *,
    priority: int = 0,
    nominated: Iterable[Nominated] = (),
) -> tuple[int, Verdict]:
    """How many of a gang's members (in order) its quota admits together: the quorum
    (the first ``need``) as one unit or nothing, then as many more as fit. Returns the
    count and the quorum's verdict (count 0 when refused)."""
    nominated = tuple(nominated)
    verdict = admit_gang(
        snapshot, namespace, requests[:need], priority=priority, nominated=nominated
    )
    if not verdict.admitted:
        return 0, verdict
    count = max(need, 0)
    while (
        count < len(requests)
        and admit_gang(
            snapshot, namespace, requests[: count + 1], priority=priority, nominated=nominated
        ).admitted
    ):
        count += 1
    return count, verdict


@dataclass(frozen=True, slots=True)
class QuotaContext:
    """What one cycle's CapacityScheduling PreFilter reads: the quotas as the cache has
    them now, and the nominated pods whose room is spoken for."""

    snapshot: QuotaSnapshot
    nominated: tuple[tuple[str, Nominated], ...] = ()
    """(pod uid, nominated pod) of namespaces with a quota."""

    def others(self, uid: str) -> list[Nominated]:
        """The nominated pods other than the pod being scheduled."""
        return [n for key, n in self.nominated if key != uid]


def _amount(resource: str, vector: Vector) -> str:
    return format_amount(resource, vector.get(resource, 0))
