"""DraObjects: the watch side of DRA; stale claim echoes never undo a written allocation."""

from __future__ import annotations

from typing import Any

import structlog

from scheduler.control.dra import DraObjects, Kind
from scheduler.core.dra.objects import DeviceId
from scheduler.core.dra.state import DraState
from tests.core.dra.builders import (
    GPU_DRIVER,
    claim,
    device,
    device_class,
    exactly,
    request,
    resource_slice,
    taint,
    taint_rule,
)

LOG = structlog.get_logger("test")


def versioned(rv: str, *, allocated: bool) -> dict[str, Any]:
    status = None
    if allocated:
        results = [{"request": "gpu", "driver": GPU_DRIVER, "pool": "n1", "device": "gpu-0"}]
        status = {"allocation": {"devices": {"results": results}}}
    body = claim("c", request("gpu", exactly("gpu")), status=status)
    body["metadata"]["resourceVersion"] = rv
    return body


def test_an_older_claim_version_is_ignored() -> None:
    objects = DraObjects(DraState(), log=LOG)
    objects.claim_written(versioned("12", allocated=True))
    objects.upsert(Kind.CLAIM, versioned("11", allocated=False))  # the finalizer write's echo
    assert objects.state.allocated_devices() == {DeviceId(GPU_DRIVER, "n1", "gpu-0")}
    objects.upsert(Kind.CLAIM, versioned("13", allocated=False))  # deallocated later
    assert objects.state.allocated_devices() == frozenset()


def test_unreadable_objects_are_dropped_and_listed() -> None:
    objects = DraObjects(DraState(), log=LOG)
    objects.upsert(Kind.SLICE, resource_slice("s", [device("gpu-0")], node="n1"))
    objects.upsert(Kind.CLASS, device_class("gpu"))
    assert objects.keys(Kind.SLICE) == {"s"}
    bad = resource_slice(
        "s", [{"name": "gpu-0", "capacity": {"memory": {"value": "lots"}}}], node="n1"
    )
    objects.upsert(Kind.SLICE, bad)
    assert "s" not in objects.state.slices
    assert set(objects.broken) == {"resourceslice/s"}
    assert objects.keys(Kind.SLICE) == {"s"}  # a re-list still reconciles it
    objects.delete(Kind.SLICE, bad)
    assert objects.broken == {}
    assert objects.keys(Kind.CLASS) == {"gpu"}


def test_taint_rules_are_kept_reconciled_and_applied() -> None:
    objects = DraObjects(DraState(), log=LOG)
    objects.upsert(Kind.SLICE, resource_slice("s", [device("gpu-0")], node="n1"))
    objects.upsert(Kind.TAINT_RULE, taint_rule("r", taint("k"), selector={"device": "gpu-0"}))
    assert objects.keys(Kind.TAINT_RULE) == {"r"}
    (pool,) = objects.state.slice_index().pools("n1", {})
    assert [str(t) for t in pool.slices[0].devices[0].taints] == ["k:NoSchedule"]
    objects.upsert(Kind.TAINT_RULE, taint_rule("bad", {"key": 7}))
    assert set(objects.broken) == {"devicetaintrule/bad"}
    assert objects.keys(Kind.TAINT_RULE) == {"r", "bad"}
    objects.delete(Kind.TAINT_RULE, taint_rule("r", taint("k")))
    (pool,) = objects.state.slice_index().pools("n1", {})
    assert pool.slices[0].devices[0].taints == ()
