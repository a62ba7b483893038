"""crds/nodetopology.yaml: shape of the CRD, and agreement with what the agent writes."""

from __future__ import annotations

import copy
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from scheduler.agent.resource import node_topology_object
from scheduler.model.topology import API_VERSION, GROUP, KIND, PLURAL, VERSION, NodeLoad
from tests.agent.crd_schema import load_crd, object_schema, validate
from tests.agent.trees import ALL, TWO_SOCKET, read_fixture

NOW = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
LOAD = NodeLoad(
    sample_time=NOW - timedelta(microseconds=250_001),
    window_seconds=15.000004,
    samples=3,
    cpu_used_milli=41_250,
    cpu_capacity_milli=96_000,
    cpu_peak_milli=60_000,
    mem_used_bytes=300 << 30,
    mem_capacity_bytes=1007 << 30,
)


def _object(name: str) -> dict[str, Any]:
    reading = replace(read_fixture(name), load=LOAD)
    return dict(node_topology_object("node-a", reading.topology, reading.status(NOW), node_uid="u"))


def test_crd_identity() -> None:
    crd = load_crd()
    assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
    assert crd["kind"] == "CustomResourceDefinition"
    assert crd["metadata"]["name"] == f"{PLURAL}.{GROUP}"
    spec = crd["spec"]
    assert (spec["group"], spec["scope"]) == (GROUP, "Cluster")
    assert spec["names"]["kind"] == KIND
    assert spec["names"]["plural"] == PLURAL
    assert "ntopo" in spec["names"]["shortNames"]
    (version,) = spec["versions"]
    assert (version["name"], version["served"], version["storage"]) == (VERSION, True, True)
    assert version["subresources"] == {"status": {}}
    assert f"{GROUP}/{VERSION}" == API_VERSION


def _no_defaults(schema: Any) -> list[str]:
    if isinstance(schema, dict):
        found = ["default"] if "default" in schema else []
        return found + [x for v in schema.values() for x in _no_defaults(v)]
    if isinstance(schema, list):
        return [x for v in schema for x in _no_defaults(v)]
    return []


def test_schema_is_structural_and_has_no_defaults() -> None:
    """Every node typed (structural); no defaults, so the agent's spec comparison holds."""

    def untyped(schema: dict[str, Any], path: str) -> list[str]:
        out = [] if "type" in schema else [path]
        for key, sub in schema.get("properties", {}).items():
            out += untyped(sub, f"{path}.{key}")
        if "items" in schema:
            out += untyped(schema["items"], f"{path}[]")
        return out

    schema = object_schema()
    assert untyped(schema, "") == []
    assert _no_defaults(schema) == []
    assert "$ref" not in str(schema)


def test_printer_columns_point_at_real_fields() -> None:
    (version,) = load_crd()["spec"]["versions"]
    obj = _object(TWO_SOCKET)
    obj["metadata"]["creationTimestamp"] = "2025-03-01T11:00:00Z"
    values = {}
    for column in version["additionalPrinterColumns"]:
        value: Any = obj
        for key in column["jsonPath"].lstrip(".").split("."):
            value = value[key]
        values[column["name"]] = value
    assert values == {
        "NUMA": 2,
        "CPUs": 96,
        "GPUs": 8,
        "NICs": 5,
        "Switches": 4,
        "CPU%": 43,
        "Mem%": 30,
        "Last-Report": "2025-03-01T12:00:00Z",
        "Age": "2025-03-01T11:00:00Z",
    }


@pytest.mark.parametrize("name", ALL)
def test_agent_objects_fit_the_schema(name: str) -> None:
    obj = _object(name)
    assert obj["status"]["load"]["sampleTime"] == "2025-03-01T11:59:59.749999Z"
    assert validate(obj, object_schema()) == []


@pytest.mark.parametrize(
    "load",
    [
        pytest.param(replace(LOAD, cpu_peak_milli=None), id="no-peak"),
        pytest.param(
            replace(LOAD, cpu_used_milli=96_000, cpu_peak_milli=96_000, mem_used_bytes=1007 << 30),
            id="full",
        ),
        pytest.param(
            replace(LOAD, cpu_used_milli=0, mem_used_bytes=0, window_seconds=0), id="idle"
        ),
    ],
)
def test_extreme_loads_fit_the_schema(load: NodeLoad) -> None:
    reading = replace(read_fixture(TWO_SOCKET), load=load)
    obj = node_topology_object("n", reading.topology, reading.status(NOW))
    assert validate(dict(obj), object_schema()) == []


def test_load_schema_declares_every_field() -> None:
    """Every key NodeLoad writes is in the schema and every schema key is written."""
    load_schema = object_schema()["properties"]["status"]["properties"]["load"]
    spec = LOAD.to_spec()
    assert set(load_schema["properties"]) == set(spec)
    assert set(load_schema["required"]) == set(spec)
    properties = load_schema["properties"]
    assert set(properties["cpu"]["properties"]) == set(spec["cpu"])
    assert set(properties["memory"]["properties"]) == set(spec["memory"])


def _mutated(path: str, value: Any) -> dict[str, Any]:
    obj = copy.deepcopy(_object(TWO_SOCKET))
    target: Any = obj
    *parents, last = path.split(".")
    for key in parents:
        target = target[int(key)] if isinstance(target, list) else target[key]
    target[last] = value
    return obj


@pytest.mark.parametrize(
    ("path", "value"),
    [
        pytest.param("spec.numaNodes", [], id="no-numa-nodes"),
        pytest.param("spec.numaNodes.0.id", -1, id="negative-numa-id"),
        pytest.param("spec.numaNodes.0.cpus", "0-3;5", id="bad-cpulist"),
        pytest.param("spec.numaNodes.0.memoryBytes", "512Gi", id="memory-as-quantity"),
        pytest.param("spec.numaNodes.0.distances", [10, 999], id="distance-out-of-range"),
        pytest.param("spec.pcie.devices.0.class", "tpu", id="unknown-class"),
        pytest.param("spec.pcie.devices.0.address", "00:00.0", id="short-address"),
        pytest.param("spec.pcie.devices.0.vendorId", "10de", id="vendor-without-0x"),
        pytest.param("spec.pcie.devices.0.numaNode", -1, id="numa-minus-one"),
        pytest.param("spec.pcie.devices.3.resourceName", "GPU", id="bad-resource-name"),
        pytest.param("spec.pcie.switches.0.id", "pci0000:17", id="switch-named-like-rc"),
        pytest.param("spec.pcie.rootComplexes.0.id", "0000:00", id="bad-root-complex"),
        pytest.param("spec.kubelet", {"topologyManagerPolicy": "strict"}, id="bad-policy"),
        pytest.param("spec.surprise", 1, id="unknown-field"),
        pytest.param("status.lastReportTime", 5, id="time-not-string"),
        pytest.param("status.pressure.cpu.some.avg10", 101, id="psi-over-100"),
        pytest.param("status.load.cpuPercent", 101, id="cpu-percent-over-100"),
        pytest.param("status.load.memoryPercent", -1, id="memory-percent-negative"),
        pytest.param("status.load.cpu.usedMillicores", -5, id="negative-cpu"),
        pytest.param("status.load.cpu.capacityMillicores", 0, id="zero-cpu-capacity"),
        pytest.param("status.load.memory.capacityBytes", 0, id="zero-memory-capacity"),
        pytest.param("status.load.memory.usedBytes", "12Gi", id="memory-as-quantity"),
        pytest.param("status.load.sampleTime", 1740830400, id="sample-time-not-string"),
        pytest.param("status.load.windowSeconds", -1.0, id="negative-window"),
        pytest.param("status.load.samples", 2.5, id="fractional-samples"),
        pytest.param("status.load.memory", {"usedBytes": 1}, id="memory-without-capacity"),
        pytest.param("status.load.loadAverage", 1.5, id="unknown-load-field"),
    ],
)
def test_schema_rejects_garbage(path: str, value: Any) -> None:
    assert validate(_mutated(path, value), object_schema()) != []
