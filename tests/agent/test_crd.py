"""crds/nodetopology.yaml: shape of the CRD, and agreement with what the agent writes."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

import pytest

from scheduler.agent.resource import node_topology_object
from scheduler.model.topology import API_VERSION, GROUP, KIND, PLURAL, VERSION
from tests.agent.crd_schema import load_crd, object_schema, validate
from tests.agent.trees import ALL, TWO_SOCKET, read_fixture

NOW = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


def _object(name: str) -> dict[str, Any]:
    reading = read_fixture(name)
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
        "Last-Report": "2025-03-01T12:00:00Z",
        "Age": "2025-03-01T11:00:00Z",
    }


@pytest.mark.parametrize("name", ALL)
def test_agent_objects_fit_the_schema(name: str) -> None:
    assert validate(_object(name), object_schema()) == []


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
    ],
)
def test_schema_rejects_garbage(path: str, value: Any) -> None:
    assert validate(_mutated(path, value), object_schema()) != []
