"""bench-dra: its pure parts (the slices, templates, pods and the leftover count)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from lattice_dev.benchmarks import dra
from lattice_dev.devcluster.profiles import KWOK_ANNOTATION


def test_gpu_slice_has_eight_gpus_on_two_pcie_roots() -> None:
    body = dra.gpu_slice("n-0", "k1")
    spec = body["spec"]
    assert body["metadata"] == {"name": "n-0-gpu", "labels": {dra.ARM_LABEL: "k1"}}
    assert spec["driver"] == dra.GPU_DRIVER
    assert spec["nodeName"] == "n-0"
    assert spec["pool"] == {"name": "n-0", "generation": 1, "resourceSliceCount": 1}
    devices = spec["devices"]
    assert [d["name"] for d in devices] == [f"gpu-{i}" for i in range(8)]
    roots = [d["attributes"][dra.PCIE_ROOT]["string"] for d in devices]
    assert roots == ["pci0000:00"] * 4 + ["pci0000:01"] * 4
    first = devices[0]
    assert first["attributes"]["cudaComputeCapability"] == {"version": "9.0.0"}
    assert {"productName", "architecture", "uuid"} <= first["attributes"].keys()
    assert first["capacity"]["memory"] == {"value": "80Gi"}
    assert len({d["attributes"]["uuid"]["string"] for d in devices}) == 8


def test_nic_slice_has_one_nic_per_root() -> None:
    spec = dra.nic_slice("n-0", "k1")["spec"]
    assert spec["driver"] == dra.NIC_DRIVER
    assert spec["pool"]["name"] == "n-0"
    assert [d["attributes"][dra.PCIE_ROOT]["string"] for d in spec["devices"]] == [
        "pci0000:00",
        "pci0000:01",
    ]


def test_device_classes_select_the_drivers() -> None:
    classes = {c["metadata"]["name"]: c for c in dra.device_classes()}
    assert classes.keys() == {"gpu", "nic"}
    (sel,) = classes["nic"]["spec"]["selectors"]
    assert sel["cel"]["expression"] == f'device.driver == "{dra.NIC_DRIVER}"'


def test_templates_per_size_and_the_constrained_ones() -> None:
    templates = {t["metadata"]["name"]: t for t in dra.claim_templates()}
    assert templates.keys() == {"gpu-1", "gpu-2", "gpu-4", "gpu-8", "gpu-1-nic", "gpu-2-nic"} | {
        "gpu-4-nic"
    }
    plain = templates["gpu-8"]["spec"]["spec"]["devices"]
    assert plain == {
        "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu", "count": 8}}]
    }
    nic = templates["gpu-4-nic"]["spec"]["spec"]["devices"]
    assert [r["name"] for r in nic["requests"]] == ["gpu", "nic"]
    assert nic["requests"][0]["exactly"]["count"] == 4
    assert nic["constraints"] == [{"requests": ["gpu", "nic"], "matchAttribute": dra.PCIE_ROOT}]
    with pytest.raises(ValueError, match="pcieRoot has 4 GPUs"):
        dra.claim_template(8, True)


def test_workload_is_seeded_and_half_constrained() -> None:
    shapes = dra.workload(2000, seed=3)
    assert shapes == dra.workload(2000, seed=3)
    assert shapes != dra.workload(2000, seed=4)
    assert sum(s.constrained for s in shapes) == 1000
    assert {s.gpus for s in shapes if s.constrained} == set(dra.CONSTRAINED_SIZES)
    assert {s.gpus for s in shapes if not s.constrained} == set(dra.GPU_SIZES)
    assert len(dra.workload(41, seed=0)) == 41


def test_pod_names_its_template_and_its_arm_nodes() -> None:
    pod = dra.pod_body("p-1", dra.PodShape(2, True), "lattice", "l1")
    spec = pod["spec"]
    assert spec["schedulerName"] == "lattice"
    assert spec["nodeSelector"] == {dra.ARM_LABEL: "l1"}
    assert spec["resourceClaims"] == [{"name": "devices", "resourceClaimTemplateName": "gpu-2-nic"}]
    assert spec["containers"][0]["resources"]["claims"] == [{"name": "devices"}]
    node = dra.kwok_node("dra-l1-0000", 0, "l1")
    assert node["metadata"]["labels"][dra.ARM_LABEL] == "l1"
    assert node["metadata"]["annotations"][KWOK_ANNOTATION] == "fake"


def _claim(*devices: tuple[str, str, str], allocated: bool = True) -> dict[str, Any]:
    if not allocated:
        return {"status": {}}
    results = [{"request": "gpu", "driver": d, "pool": p, "device": n} for d, p, n in devices]
    return {"status": {"allocation": {"devices": {"results": results}}}}


def test_allocated_devices_counts_claims_with_an_allocation() -> None:
    g = dra.GPU_DRIVER
    claims = [_claim((g, "a", "gpu-0"), (dra.NIC_DRIVER, "a", "nic-0")), _claim(allocated=False)]
    count, used = dra.allocated_devices([*claims, {}])
    assert count == 1
    assert used == {(g, "a", "gpu-0"), (dra.NIC_DRIVER, "a", "nic-0")}


def test_leftover_counts_free_gpus_on_partly_used_roots() -> None:
    g = dra.GPU_DRIVER
    used = {
        (g, "a", "gpu-0"),  # a: root 0 has 1 of 4 used -> 3 stranded
        *((g, "a", f"gpu-{i}") for i in range(4, 8)),  # a: root 1 full -> none
        (g, "b", "gpu-5"),  # b: root 1 partly used -> 3 stranded, root 0 empty
        (dra.NIC_DRIVER, "c", "nic-0"),  # a NIC alone does not use c's GPUs
    }
    left = dra.leftover(["a", "b", "c"], used)
    assert left == dra.Leftover(stranded_gpus=6, partly_used_roots=2, free_nodes=1, free_gpus=18)


def test_report_prints_each_arm_and_the_ratios() -> None:
    left = dra.Leftover(4, 2, 1, 10)
    k = dra.ArmResult(dra.KUBE, 1, 40, 40, 10.0, 2.0, 40, left)
    lat = dra.ArmResult(dra.LATTICE, 1, 40, 40, 2.0, 1.0, 40, dra.Leftover(0, 0, 3, 10))
    lines = dra.report([k, lat], nodes=20)
    assert len(lines) == 4
    assert "40/40" in lines[1]
    assert "50.00" in lines[1]
    assert lines[3] == (
        "run 1 L/K: pods/s 5.00x, CPU/pod 0.50x, claims +0, stranded GPUs -4, free nodes +2"
    )
    empty = dra.ArmResult(dra.KUBE, 2, 40, 0, 0.0, 1.0, 0, left)
    assert math.isnan(empty.pods_per_s)
    assert math.isnan(empty.cpu_ms_per_pod)
    assert "n/a" in dra.report([empty], nodes=20)[1]
