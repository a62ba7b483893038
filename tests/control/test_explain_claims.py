"""`lattice explain`'s claims table: per node and request, devices needed, matching, free."""

from __future__ import annotations

from typing import Any

from scheduler.control.explain import claim_rows, render_claims_table
from scheduler.core.dra.objects import DeviceClass, DeviceTaintRule, ResourceClaim, ResourceSlice
from scheduler.core.dra.state import DraState
from scheduler.core.schedule import Framework
from tests.builders import cluster, make_node, make_pod
from tests.core.dra.builders import (
    GPU_DRIVER,
    claim,
    device,
    device_class,
    exactly,
    first_available,
    request,
    resource_slice,
    taint,
    taint_rule,
)


def test_each_request_shows_matching_free_and_chosen_devices_per_node() -> None:
    dra = DraState()
    dra.set_class(DeviceClass.from_api(device_class("gpu")))
    n0 = [device("gpu-0", model="A100"), device("gpu-1", model="A100"), device("gpu-2", model="T4")]
    dra.set_slice(ResourceSlice.from_api(resource_slice("n0", n0, node="n0")))
    dra.set_slice(
        ResourceSlice.from_api(
            resource_slice(
                "n1",
                [device("gpu-0", model="A100"), *(device(f"gpu-{i}", model="T4") for i in (1, 2))],
                node="n1",
            )
        )
    )
    a100 = f'device.attributes["{GPU_DRIVER}"].model == "A100"'
    wanted: dict[str, Any] = claim(
        "want",
        request("big", exactly("gpu", a100, count=2)),
        first_available("any", ("t4", exactly("gpu", count=4)), ("one", exactly("gpu"))),
    )
    dra.set_claim(ResourceClaim.from_api(wanted))
    pod = make_pod("p", cpu="1").uid("u-p")
    pod.body["spec"]["resourceClaims"] = [{"name": "c", "resourceClaimName": "want"}]
    snapshot = cluster([make_node(f"n{i}", cpu="8", memory="16Gi") for i in range(3)])
    decision = Framework().schedule(snapshot, pod.build(), dra=dra)
    assert decision.selected == "n0"
    rows = claim_rows(decision, snapshot, pod.build(), dra)
    assert rows is not None
    assert sorted(rows) == ["n0", "n1", "n2"]
    n0_rows = {r.request: r for r in rows["n0"]}
    assert (n0_rows["big"].needed, n0_rows["big"].matching, n0_rows["big"].free) == (2, 2, 2)
    assert n0_rows["big"].chosen == [f"{GPU_DRIVER}/n0/gpu-0", f"{GPU_DRIVER}/n0/gpu-1"]
    assert n0_rows["any/one"].chosen == [f"{GPU_DRIVER}/n0/gpu-2"]
    assert n0_rows["any/t4"].chosen == []
    n1 = {r.request: r for r in rows["n1"]}
    assert (n1["big"].needed, n1["big"].matching, n1["big"].free) == (2, 1, 1)
    assert (n1["any/t4"].needed, n1["any/t4"].matching) == (4, 3)
    assert n1["any/one"].matching == 3
    assert all(r.matching == 0 for r in rows["n2"])
    table = render_claims_table(decision, rows).splitlines()
    assert table[0].startswith("Claims (per node")
    first = table[2].split()
    assert first[:4] == ["*", "n0", "default/want", "big"]
    n1_big = next(line for line in table if line.split()[:3] == ["n1", "default/want", "big"])
    assert n1_big.split()[3:6] == ["2", "1", "1"]
    assert n1_big.endswith("too few free devices")


def test_a_pod_whose_claims_are_allocated_has_no_table() -> None:
    dra = DraState()
    dra.set_class(DeviceClass.from_api(device_class("gpu")))
    results = [{"request": "gpu", "driver": GPU_DRIVER, "pool": "n0", "device": "gpu-0"}]
    dra.set_claim(
        ResourceClaim.from_api(
            claim(
                "done",
                request("gpu", exactly("gpu")),
                status={"allocation": {"devices": {"results": results}}},
            )
        )
    )
    pod = make_pod("p", cpu="1").uid("u-p")
    pod.body["spec"]["resourceClaims"] = [{"name": "c", "resourceClaimName": "done"}]
    snapshot = cluster([make_node("n0", cpu="8", memory="16Gi")])
    decision = Framework().schedule(snapshot, pod.build(), dra=dra)
    assert claim_rows(decision, snapshot, pod.build(), dra) is None


def test_tainted_devices_are_not_free_and_the_table_names_their_taints() -> None:
    dra = DraState()
    dra.set_class(DeviceClass.from_api(device_class("gpu")))
    devices = [device("gpu-0"), device("gpu-1")]
    dra.set_slice(ResourceSlice.from_api(resource_slice("n0", devices, node="n0")))
    dra.set_taint_rule(
        DeviceTaintRule.from_api(taint_rule("drain", taint("maint", "NoExecute"), selector={}))
    )
    dra.set_claim(ResourceClaim.from_api(claim("want", request("gpu", exactly("gpu")))))
    pod = make_pod("p", cpu="1").uid("u-p")
    pod.body["spec"]["resourceClaims"] = [{"name": "c", "resourceClaimName": "want"}]
    snapshot = cluster([make_node("n0", cpu="8", memory="16Gi")])
    decision = Framework().schedule(snapshot, pod.build(), dra=dra)
    assert decision.selected is None
    rows = claim_rows(decision, snapshot, pod.build(), dra)
    assert rows is not None
    (row,) = rows["n0"]
    assert (row.matching, row.free, row.tainted, row.taints) == (2, 0, 2, ["maint:NoExecute"])
    table = render_claims_table(decision, rows)
    assert table.splitlines()[-1].endswith("too few free devices (2 tainted: maint:NoExecute)")
