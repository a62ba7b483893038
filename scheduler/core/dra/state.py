"""The DRA objects of the cluster as the controller last saw them, plus Lattice's own
in-flight allocations (kube's assume cache and ``SignalClaimPendingAllocation``).

State machine of one claim's allocation, as seen from here::

    unallocated --assume(plan)--> pending (devices count as used; other pods wait)
    pending --set_claim(allocated)--> allocated (the write came back; pending dropped)
    pending --forget(claim)--> unallocated (binding failed before the write)

A pod's DRA-backed extended resources (DRAExtendedResource) add a claim the scheduler
makes itself: it is planned under a placeholder key (:func:`placeholder_key`, never a valid
claim name), assumed like the others, created with its allocation in PreBind, and then
tracked under its real name; the placeholder's assumption ends once the created claim is in
the state. :meth:`DraState.extended_class` maps extended resource names to the classes that
serve them, :meth:`DraState.extended_claim` finds the claim made for a pod.

The devices in use are those of every written allocation (adminAccess results excluded,
as kube's allocated-device tracker does) plus every pending one. Results with a ``shareID``
(DRAConsumableCapacity, 1.36+) do not take their device: they are shares, whose
``consumedCapacity`` is summed per device (:meth:`DraState.shared_capacity`), written and
pending alike, as kube's ``GatherAllocatedState`` adds in-flight claims to the informer's.
The set is recounted from the claims when they change, not per cycle. Slices are indexed
once per change too (:class:`~scheduler.core.dra.allocator.SliceIndex`), and the CEL
compiler lives as long as the state, so expressions compile once per process.

DeviceTaintRules are kept beside the slices and applied when the index is built, as
kube-scheduler's slice tracker patches its slices: each rule's taint is appended to the
devices its selector names (rules by name, so the result does not depend on event order).
A rule's change rebuilds the index and drops the memo, like a slice's.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from scheduler.core.dra.allocator import Allocator, AllocStats, Pool, SliceIndex
from scheduler.core.dra.cel import SelectorCompiler
from scheduler.core.dra.objects import (
    DeviceClass,
    DeviceId,
    DeviceTaintRule,
    ResourceClaim,
    ResourceSlice,
    Share,
    allocation_usage,
)
from scheduler.model.names import DEVICE_CLASS_RESOURCE_PREFIX
from scheduler.model.release import DEFAULT_KUBE_MINOR

ClaimKey = tuple[str, str]
SPEC_LIMIT = 10_000
"""Distinct claim specs the memo numbers before it starts again."""
PLACEHOLDER: Final = "<extended-resources>"
"""kube's in-memory name of the claim not created yet (not a valid object name)."""


def placeholder_key(namespace: str, pod_uid: str) -> ClaimKey:
    """The key a pod's extended-resource claim is planned and assumed under until it is
    created: kube's placeholder name made unique per pod (kube keys in-flight allocations
    by a random uid instead)."""
    return (namespace, f"{PLACEHOLDER}{pod_uid}")


@dataclass(frozen=True, slots=True)
class ExtendedClaim:
    """The claim for a pod's DRA-backed extended resources, which PreBind creates."""

    body: Mapping[str, Any]
    """The ResourceClaim to create (``generateName``, owned by the pod, annotated)."""
    mappings: tuple[Mapping[str, str], ...]
    """``status.extendedResourceClaimStatus.requestMappings`` of the pod."""


@dataclass(frozen=True, slots=True)
class ClaimWrite:
    """One claim PreBind must update before the binding."""

    namespace: str
    name: str
    uid: str
    allocation: Mapping[str, Any] | None
    """The allocation to write (None: the claim is already allocated, only reserve it)."""
    create: ExtendedClaim | None = None
    """Set for the claim of the pod's extended resources: created first (``name`` is then
    the placeholder of :func:`placeholder_key`)."""
    stamp: bool = False
    """Set ``status.allocation.allocationTimestamp`` where the allocation has none, as
    kube-scheduler 1.36+ does when it reserves a claim (DRADeviceBindingConditions and
    DRAResourceClaimDeviceStatus on by default; binding timeouts count from it)."""


@dataclass(frozen=True, slots=True)
class ClaimPlan:
    """What DynamicResources chose for the selected node: the writes, in pod claim order."""

    pod_name: str
    pod_uid: str
    writes: tuple[ClaimWrite, ...] = field(default=())

    @property
    def allocations(self) -> tuple[ClaimWrite, ...]:
        return tuple(w for w in self.writes if w.allocation is not None)


@dataclass(frozen=True, slots=True)
class Hold:
    """What the planned allocations of nominated pods hold during one decision
    (:meth:`DraState.hold_for_nominated`): devices taken whole, and shares of
    multi-allocatable devices (the capacity they consume)."""

    devices: frozenset[DeviceId] = frozenset()
    shares: tuple[Share, ...] = ()

    def __or__(self, other: Hold) -> Hold:
        return Hold(self.devices | other.devices, self.shares + other.shares)

    def __bool__(self) -> bool:
        return bool(self.devices or self.shares)

    def key(self) -> tuple[object, ...]:
        """Hashable, for memo keys."""
        return (self.devices, share_key(self.shares))


def share_key(shares: Iterable[Share]) -> tuple[tuple[DeviceId, tuple[tuple[str, int], ...]], ...]:
    """Shares as a hashable, ordered value."""
    return tuple(sorted((s.device, tuple(sorted(s.consumed.items()))) for s in shares))


class DraState:
    def __init__(self) -> None:
        self.classes: dict[str, DeviceClass] = {}
        self.claims: dict[ClaimKey, ResourceClaim] = {}
        self.slices: dict[str, ResourceSlice] = {}
        self.taint_rules: dict[str, DeviceTaintRule] = {}
        self.compiler = SelectorCompiler()
        self._index: SliceIndex | None = None
        self._used: Counter[DeviceId] = Counter()
        self._pending: dict[ClaimKey, tuple[str, list[DeviceId], list[Share]]] = {}
        """Claim -> (pod uid it was allocated for, devices, shares), until the write is
        seen."""
        self._shares: Counter[DeviceId] = Counter()
        """Shares per multi-allocatable device (written and pending)."""
        self._consumed: dict[DeviceId, Counter[str]] = {}
        """Capacity the shares of each device consume, summed, in nanounits."""
        self._shared_view: dict[DeviceId, dict[str, int]] | None = None
        self._versions: dict[tuple[str, str], int] = {}
        """Per (driver, pool): bumped whenever a device of the pool is taken or freed."""
        self._nominated: frozenset[DeviceId] = frozenset()
        """Devices held for nominated pods during one decision (:meth:`hold_for_nominated`)."""
        self._nominated_shares: tuple[Share, ...] = ()
        """Shares held for nominated pods during one decision, likewise."""
        self._nominated_pools: dict[tuple[str, str], tuple[object, ...]] = {}
        """The same, by (driver, pool): device names and shares, for the memo key
        (:meth:`node_key`)."""
        self.memo: dict[tuple[object, ...], object] = {}
        self.generation = 0
        """Bumped whenever the memo is invalidated (not merely trimmed): a device search
        that ran off the loop under another generation is dropped, not remembered."""
        self._spec_ids: dict[object, int] = {}
        self._by_resource: dict[str, DeviceClass] | None = None
        """Extended resource name -> the class serving it (built on first use after a
        class changed)."""
        self._extended_claims: dict[str, set[ClaimKey]] = {}
        """Pod uid -> its claims annotated as made for its extended resources."""
        self.stats = AllocStats()
        """Allocator time of every cycle on this state (the controller observes the
        difference per attempt)."""
        """DynamicResources' per-node outcomes, keyed by the node's pools and their
        versions and the claims' specs (:meth:`node_key`); cleared when a class or slice
        changes. A pod's cycle then runs the allocator only on nodes whose devices changed
        since a pod with the same claims was filtered: placing one pod changes one node."""

    def _invalidate(self) -> None:
        """A class, slice, taint rule or the spec numbering changed: every memo entry may
        be wrong now, and so may any device search still running off the loop."""
        self.memo.clear()
        self.generation += 1

    # ------------------------------------------------------------------ objects
    def set_class(self, cls: DeviceClass) -> None:
        self.classes[cls.name] = cls
        self._by_resource = None
        self._invalidate()

    def remove_class(self, name: str) -> None:
        self.classes.pop(name, None)
        self._by_resource = None
        self._invalidate()

    def extended_class(self, resource: str) -> DeviceClass | None:
        """The DeviceClass serving an extended resource name, or None (kube's extended
        resource cache): a class's ``spec.extendedResourceName`` and its implicit
        ``deviceclass.resource.kubernetes.io/<name>``. Of classes naming one resource the
        newest serves it, the lower name on a tie (``DeviceClassSpec`` documents this;
        kube's cache applies it as events arrive, here it is decided from all classes)."""
        if self._by_resource is None:
            self._by_resource = classes_by_resource(self.classes.values())
        return self._by_resource.get(resource)

    def extended_claim(self, pod_uid: str, pod_name: str) -> ResourceClaim | None:
        """The claim made for the pod's extended resources in an earlier cycle (annotated,
        controlled by the pod), or None; the lowest name if there are several."""
        keys = self._extended_claims.get(pod_uid)
        if not keys:
            return None
        for key in sorted(keys):
            claim = self.claims[key]
            if claim.controller_name == pod_name:
                return claim
        return None

    def set_slice(self, resource_slice: ResourceSlice) -> None:
        self.slices[resource_slice.name] = resource_slice
        self._index = None
        self._invalidate()

    def remove_slice(self, name: str) -> None:
        if self.slices.pop(name, None) is not None:
            self._index = None
            self._invalidate()

    def set_taint_rule(self, rule: DeviceTaintRule) -> None:
        self.taint_rules[rule.name] = rule
        self._index = None
        self._invalidate()

    def remove_taint_rule(self, name: str) -> None:
        if self.taint_rules.pop(name, None) is not None:
            self._index = None
            self._invalidate()

    def set_claim(self, claim: ResourceClaim) -> None:
        old = self.claims.get(claim.key)
        self._uncount(old)
        self._unindex(old)
        self.claims[claim.key] = claim
        if claim.extended_resources and claim.controller_uid:
            self._extended_claims.setdefault(claim.controller_uid, set()).add(claim.key)
        self._take(claim.allocated_devices())
        self._take_shares(claim.allocated_shares())
        if claim.allocation is not None:
            self._drop_pending(claim.key)

    def remove_claim(self, namespace: str, name: str) -> None:
        key = (namespace, name)
        old = self.claims.pop(key, None)
        self._uncount(old)
        self._unindex(old)
        self._drop_pending(key)

    def _unindex(self, claim: ResourceClaim | None) -> None:
        if claim is None or not claim.extended_resources:
            return
        keys = self._extended_claims.get(claim.controller_uid)
        if keys is not None:
            keys.discard(claim.key)
            if not keys:
                del self._extended_claims[claim.controller_uid]

    def _uncount(self, claim: ResourceClaim | None) -> None:
        if claim is not None:
            self._release(claim.allocated_devices())
            self._release_shares(claim.allocated_shares())

    def _take_shares(self, shares: list[Share]) -> None:
        if not shares:
            return
        self._shared_view = None
        self._touch([s.device for s in shares])
        for share in shares:
            self._shares[share.device] += 1
            self._consumed.setdefault(share.device, Counter()).update(share.consumed)

    def _release_shares(self, shares: list[Share]) -> None:
        if not shares:
            return
        self._shared_view = None
        self._touch([s.device for s in shares])
        for share in shares:
            left = self._shares[share.device] - 1
            if left > 0:
                self._shares[share.device] = left
                self._consumed[share.device].subtract(share.consumed)
            else:
                del self._shares[share.device]
                self._consumed.pop(share.device, None)

    def _take(self, devices: list[DeviceId]) -> None:
        self._used.update(devices)
        self._touch(devices)

    def _touch(self, devices: list[DeviceId]) -> None:
        versions = self._versions
        for d in devices:
            key = (d.driver, d.pool)
            versions[key] = versions.get(key, 0) + 1

    def _release(self, devices: list[DeviceId]) -> None:
        self._touch(devices)
        for device in devices:
            left = self._used[device] - 1
            if left > 0:
                self._used[device] = left
            else:
                del self._used[device]

    # ------------------------------------------------------------------ assume
    def assume(self, plan: ClaimPlan) -> None:
        """kube's Reserve: the plan's new allocations count as used until written or
        forgotten."""
        for write in plan.allocations:
            key = (write.namespace, write.name)
            self._drop_pending(key)
            devices, shares = allocation_usage(write.allocation)
            self._pending[key] = (plan.pod_uid, devices, shares)
            self._take(devices)
            self._take_shares(shares)

    def forget(self, plan: ClaimPlan) -> None:
        """kube's Unreserve for allocations not yet written."""
        for write in plan.allocations:
            key = (write.namespace, write.name)
            pending = self._pending.get(key)
            if pending is not None and pending[0] == plan.pod_uid:
                self._drop_pending(key)

    def _drop_pending(self, key: ClaimKey) -> None:
        pending = self._pending.pop(key, None)
        if pending is not None:
            self._release(pending[1])
            self._release_shares(pending[2])

    def pending_for(self, key: ClaimKey) -> str | None:
        """The pod uid a claim is being allocated for, or None."""
        pending = self._pending.get(key)
        return None if pending is None else pending[0]

    # ------------------------------------------------------------- preemption
    def held_by(self, pod_uid: str) -> list[DeviceId]:
        """The devices only this pod holds: its claims reserved for it alone, and its
        allocations not yet written. Its eviction frees them (kube-controller-manager
        deletes a template's claim with its pod, and takes a gone pod out of
        ``reservedFor``), which is what preemption's dry run simulates."""
        out: list[DeviceId] = []
        for claim in self.claims.values():
            reserved = claim.reserved_for
            if reserved and all(r.uid == pod_uid for r in reserved):
                out += claim.allocated_devices()
        for uid, devices, _ in self._pending.values():
            if uid == pod_uid:
                out += devices
        return out

    def release(self, devices: list[DeviceId]) -> None:
        """Count ``devices`` as free (the dry run's victim is gone); undo with :meth:`hold`."""
        self._release(devices)

    def hold(self, devices: list[DeviceId]) -> None:
        self._take(devices)

    # ------------------------------------------------------------- nominations
    def hold_for_nominated(self, devices: Iterable[DeviceId], shares: Iterable[Share] = ()) -> None:
        """Count ``devices`` as in use for the decision about to run (the devices planned
        for nominated pods of at least its pod's priority, :mod:`scheduler.core.nominated`);
        an empty set ends the hold. Not a change of the ledger: no pool version moves, and
        the memo key names the held devices of each pool instead (:meth:`node_key`), so a
        decision taken again under the same hold (a deferred search's second pass) finds
        the verdicts the worker wrote, and one without it finds the ones made without.
        ``shares``: the capacity of multi-allocatable devices held likewise (added to
        :meth:`shared_capacity`)."""
        held = frozenset(devices)
        held_shares = tuple(shares)
        names: dict[tuple[str, str], set[str]] = {}
        for d in held:
            names.setdefault((d.driver, d.pool), set()).add(d.device)
        by_pool: dict[tuple[str, str], list[Share]] = {}
        for share in held_shares:
            by_pool.setdefault((share.device.driver, share.device.pool), []).append(share)
        self._nominated = held
        self._nominated_shares = held_shares
        self._nominated_pools = {
            k: (frozenset(names.get(k, ())), share_key(by_pool.get(k, ())))
            for k in names.keys() | by_pool.keys()
        }

    def held_for_nominated(self) -> frozenset[DeviceId]:
        return self._nominated

    def nominated_hold(self) -> Hold:
        """The devices and shares held for nominated pods now."""
        return Hold(self._nominated, self._nominated_shares)

    # ------------------------------------------------------------------ views
    def allocated_devices(self) -> frozenset[DeviceId]:
        """The devices in use: every allocation, written or pending, and those held for
        nominated pods during a decision."""
        if self._nominated:
            return frozenset(self._used).union(self._nominated)
        return frozenset(self._used)

    def shared_capacity(self) -> Mapping[DeviceId, Mapping[str, int]]:
        """Per multi-allocatable device with shares (written or pending): the capacity
        they consume, summed (kube's ``AggregatedCapacity``; a device whose shares consume
        nothing is here with an empty map, kube's ``AllocatedSharedDeviceIDs``). Rebuilt
        after a change only; callers must not mutate it. During a decision, the shares
        held for nominated pods are added (:meth:`hold_for_nominated`)."""
        if self._nominated_shares:
            return with_shares(self.shared_in_use(), self._nominated_shares)
        return self.shared_in_use()

    def shared_in_use(self) -> Mapping[DeviceId, Mapping[str, int]]:
        """:meth:`shared_capacity` of allocations only (no nominated pod's hold)."""
        if self._shared_view is None:
            self._shared_view = {d: dict(self._consumed.get(d, Counter())) for d in self._shares}
        return self._shared_view

    def used_devices(self) -> frozenset[DeviceId]:
        """The devices of allocations only (no nominated pod's hold)."""
        return frozenset(self._used)

    def shared_devices(self, key: ClaimKey) -> list[DeviceId]:
        """The devices of a claim's allocation that another allocation holds too."""
        claim = self.claims.get(key)
        if claim is None:
            return []
        return sorted(d for d in claim.allocated_devices() if self._used[d] > 1)

    def taken_since(self, write: ClaimWrite, pod_uid: str) -> list[DeviceId]:
        """PreBind's re-check against the freshest claims: devices of ``write``'s allocation
        that some other allocation holds now (another scheduler's, written after the
        decision). The write's own assumption, while it stands, counts once."""
        if write.allocation is None:
            return []
        own = 1 if self.pending_for((write.namespace, write.name)) == pod_uid else 0
        devices, shares = allocation_usage(write.allocation)
        taken = {d for d in devices if self._used[d] > own}
        taken.update(s.device for s in shares if self._used[s.device] > 0)
        return sorted(taken)

    def overspent(self, write: ClaimWrite) -> list[str]:
        """PreBind's re-check for partitionable devices: the counter sets (``driver/pool/
        set``) of the pools ``write`` takes counter-consuming devices from that the devices
        in use now, the write's own included once, consume more of than they hold (another
        scheduler took a partition of the same GPU after the decision). Counters are not
        tracked apart: as kube, they follow from the devices in use and the slices."""
        if write.allocation is None:
            return []
        devices, shares = allocation_usage(write.allocation)
        mine = set(devices) | {s.device for s in shares}
        used = set(self._used) | set(self._shares) | mine
        out: list[str] = []
        for driver, pool in sorted({(d.driver, d.pool) for d in mine}):
            members = [s for s in self.slices.values() if s.driver == driver and s.pool == pool]
            if not members:
                continue
            newest = max(s.generation for s in members)
            members = [s for s in members if s.generation == newest]
            sets = {c.name: c.counters for s in members for c in s.shared_counters}
            consumed: dict[str, Counter[str]] = {}
            touched = False
            for s in members:
                for d in s.devices:
                    device_id = DeviceId(driver, pool, d.name)
                    if not d.consumes or device_id not in used:
                        continue
                    touched = touched or device_id in mine
                    for use in d.consumes:
                        consumed.setdefault(use.counter_set, Counter()).update(use.counters)
            if not touched:
                continue
            out += [
                f"{driver}/{pool}/{name}"
                for name, counters in sorted(sets.items())
                if any(consumed.get(name, Counter())[c] > v for c, v in counters.items())
            ]
        return out

    def capacity_overspent(self, write: ClaimWrite, pod_uid: str) -> list[str]:
        """PreBind's re-check for shares (DRAConsumableCapacity): the capacities
        (``driver/pool/device/capacity``) of the devices ``write`` takes a share of that the
        shares in use now, the write's own counted once, consume more of than the device
        has (another scheduler took a share of the same device after the decision)."""
        if write.allocation is None:
            return []
        shares = allocation_usage(write.allocation)[1]
        if not shares:
            return []
        own = self.pending_for((write.namespace, write.name)) == pod_uid
        mine: dict[DeviceId, Counter[str]] = {}
        for share in shares:
            mine.setdefault(share.device, Counter()).update(share.consumed)
        out: list[str] = []
        for device_id, consumed in sorted(mine.items()):
            device = self.slice_index().device(device_id)
            if device is None:
                continue
            total = Counter(self._consumed.get(device_id, Counter()))
            if not own:
                total.update(consumed)
            out += [
                f"{device_id.driver}/{device_id.pool}/{device_id.device}/{name}"
                for name, capacity in sorted(device.capacity.items())
                if total[name] > capacity.nanos
            ]
        return out

    def double_allocated(self) -> list[DeviceId]:
        """Devices held by more than one allocation (two schedulers, or a race)."""
        return sorted(d for d, n in self._used.items() if n > 1)

    def spec_id(self, specs: object) -> int:
        """A small number for claim specs (hashing the specs per node would cost more than
        the lookups save)."""
        if len(self._spec_ids) >= SPEC_LIMIT:  # ids of specs no pod asks any more
            self._spec_ids.clear()
            self._invalidate()
        return self._spec_ids.setdefault(specs, len(self._spec_ids))

    def node_key(self, node: str, pools: list[Pool], claims: int) -> tuple[object, ...]:
        """The memo key of one node for one pod's claims (``claims``: their specs): what the
        allocator reads of the node (its name, its pools, the devices in use there, by
        version, and the devices held there for nominated pods)."""
        versions = self._versions
        held = self._nominated_pools
        if held:
            return (
                node,
                claims,
                tuple(
                    (p.driver, p.name, versions.get((p.driver, p.name), 0))
                    + ((names,) if (names := held.get((p.driver, p.name))) else ())
                    for p in pools
                ),
            )
        return (
            node,
            claims,
            tuple((p.driver, p.name, versions.get((p.driver, p.name), 0)) for p in pools),
        )

    def slice_index(self) -> SliceIndex:
        if self._index is None:
            rules = [self.taint_rules[name] for name in sorted(self.taint_rules)]
            slices = (self.slices[name] for name in sorted(self.slices))
            self._index = SliceIndex(s.tainted_by(rules) if rules else s for s in slices)
        return self._index

    def allocator(
        self,
        *,
        aligned: bool = False,
        compact_config: bool = True,
        kube_minor: int = DEFAULT_KUBE_MINOR,
        allocated: frozenset[DeviceId] | None = None,
        shared: Mapping[DeviceId, Mapping[str, int]] | None = None,
    ) -> Allocator:
        """``allocated``: the devices in use, if not :meth:`allocated_devices`; ``shared``:
        the capacity shares consume, if not :meth:`shared_capacity`."""
        return Allocator(
            shared=self.shared_capacity() if shared is None else shared,
            kube_minor=kube_minor,
            classes=self.classes,
            slices=self.slice_index(),
            allocated=self.allocated_devices() if allocated is None else allocated,
            compiler=self.compiler,
            aligned=aligned,
            stats=self.stats,
            compact_config=compact_config,
        )


def classes_by_resource(classes: Iterable[DeviceClass]) -> dict[str, DeviceClass]:
    """Extended resource name -> serving class (see :meth:`DraState.extended_class`)."""
    out: dict[str, DeviceClass] = {}
    named: dict[str, list[DeviceClass]] = {}
    for cls in classes:
        out[DEVICE_CLASS_RESOURCE_PREFIX + cls.name] = cls
        if cls.extended_resource_name:
            named.setdefault(cls.extended_resource_name, []).append(cls)
    for name, group in named.items():
        out[name] = min(group, key=lambda c: (-c.created, c.name))
    return out


def with_shares(
    shared: Mapping[DeviceId, Mapping[str, int]], shares: Iterable[Share]
) -> dict[DeviceId, dict[str, int]]:
    """``shared`` (capacity consumed per device) with ``shares`` added."""
    out = {d: dict(c) for d, c in shared.items()}
    for share in shares:
        consumed = out.setdefault(share.device, {})
        for name, amount in share.consumed.items():
            consumed[name] = consumed.get(name, 0) + amount
    return out


def allocation_devices(allocation: Mapping[str, Any] | None) -> list[DeviceId]:
    """The devices an allocation holds alone (no adminAccess result, no share)."""
    return allocation_usage(allocation)[0]
