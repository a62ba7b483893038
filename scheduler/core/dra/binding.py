"""Binding conditions (DRADeviceBindingConditions, beta and on from kube 1.36): is a claim
ready for its pod to be bound?

A device may name ``bindingConditions`` (and ``bindingFailureConditions``) in its
ResourceSlice: the allocator copies them into the allocation's result for that device,
and kube-scheduler's PreBind then waits, after writing the allocation, until the driver
(or a controller) has set every binding condition True in the claim's ``status.devices``
entry for that device (same driver, pool and device). Any failure condition True fails
the binding; so does the wait outlasting ``bindingTimeout`` (DynamicResourcesArgs, 600 s
by default) counted from the allocation's ``allocationTimestamp``. A failed claim is
not available on any node on the next attempt, whose PostFilter deallocates it.

This module is kube's ``isClaimReadyForBinding`` and ``isClaimTimeout`` as pure
functions of the claim and the time (the controller's wait is in
:class:`scheduler.control.dra_binding.DynamicResources`, the step of the binding cycle).
"""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from scheduler.core.dra.objects import ResourceClaim

BINDING_TIMEOUT: Final = 600.0
"""kube's ``DynamicResourcesBindingTimeoutDefault`` (seconds)."""
FAILED: Final = "device binding failed"
"""kube's ``ErrDeviceBindingFailed``."""
TIMED_OUT: Final = "device binding timeout"
"""kube's ``ErrDeviceBindingTimeout``."""


class Readiness(enum.Enum):
    READY = "ready"
    WAITING = "waiting"
    FAILED = "failed"
    TIMED_OUT = "timed out"


@dataclass(frozen=True, slots=True)
class BindingCheck:
    readiness: Readiness
    message: str = ""
    """Why not (kube's error text), for FAILED and TIMED_OUT."""

    @property
    def unusable(self) -> bool:
        """The allocation must be given back (kube's Filter marks the claim unavailable)."""
        return self.readiness in (Readiness.FAILED, Readiness.TIMED_OUT)


def _results(allocation: Mapping[str, Any] | None) -> list[Mapping[str, Any]]:
    if allocation is None:
        return []
    devices = allocation.get("devices") or {}
    return [r for r in devices.get("results") or [] if isinstance(r, Mapping)]


def has_binding_conditions(allocation: Mapping[str, Any] | None) -> bool:
    """Whether some result of the allocation carries ``bindingConditions`` (kube's
    ``hasBindingConditions``: only then does PreBind wait)."""
    return any(r.get("bindingConditions") for r in _results(allocation))


def allocated_at(allocation: Mapping[str, Any] | None) -> float | None:
    """``allocationTimestamp`` in POSIX seconds (None: absent or unreadable)."""
    if allocation is None:
        return None
    raw = allocation.get("allocationTimestamp")
    if not isinstance(raw, str) or not raw:
        return None
    try:
        return dt.datetime.fromisoformat(raw.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _device_conditions(
    claim: ResourceClaim, result: Mapping[str, Any]
) -> list[Mapping[str, Any]] | None:
    """kube's ``getAllocatedDeviceStatus``: the conditions of the ``status.devices`` entry
    of the result's (driver, pool, device); None when there is no entry."""
    for entry in claim.device_statuses:
        if (entry.get("driver"), entry.get("pool"), entry.get("device")) == (
            result.get("driver"),
            result.get("pool"),
            result.get("device"),
        ):
            return [c for c in entry.get("conditions") or [] if isinstance(c, Mapping)]
    return None


def _find(conditions: list[Mapping[str, Any]], kind: object) -> Mapping[str, Any] | None:
    return next((c for c in conditions if c.get("type") == kind), None)


def binding_check(claim: ResourceClaim, *, now: float, timeout: float) -> BindingCheck:
    """The claim's readiness for binding at wall time ``now`` (kube's
    ``isClaimReadyForBinding``, then ``isClaimTimeout`` for a claim not ready): results
    without binding conditions are ready; one whose device has no status entry yet, or
    a binding condition not True, waits; a failure condition True fails at once. A
    waiting claim whose ``allocationTimestamp`` lies more than ``timeout`` seconds back
    has timed out. An unallocated claim waits (nothing to bind yet)."""
    allocation = claim.allocation
    if allocation is None:
        return BindingCheck(Readiness.WAITING)
    ready = True
    for result in _results(allocation):
        wanted = result.get("bindingConditions") or []
        if not wanted:
            continue
        conditions = _device_conditions(claim, result)
        if conditions is None:
            ready = False
            break
        for kind in result.get("bindingFailureConditions") or []:
            failed = _find(conditions, kind)
            if failed is not None and failed.get("status") == "True":
                return BindingCheck(
                    Readiness.FAILED,
                    f"{FAILED}: claim={claim.name}, reason={failed.get('reason', '')}, "
                    f'message="{failed.get("message", "")}"',
                )
        if any((_find(conditions, kind) or {}).get("status") != "True" for kind in wanted):
            ready = False
            break
    if ready:
        return BindingCheck(Readiness.READY)
    started = allocated_at(allocation)
    if started is not None and started + timeout < now:
        return BindingCheck(Readiness.TIMED_OUT, f"{TIMED_OUT}: claim={claim.name}")
    return BindingCheck(Readiness.WAITING)
