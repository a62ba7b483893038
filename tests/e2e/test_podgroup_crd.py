"""crds/podgroup.yaml on the suite's real API server.

The PodGroup is created exactly as Kubeflow's training operator sends it for a PyTorchJob
with a ``schedulingPolicy``; it must be stored unchanged, parse with ``gang_from_podgroup``,
show our printer columns, and take the status Lattice builds through the status
subresource without pruning the fields we added to upstream's schema.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client

from lattice_dev.devcluster.kube import poll
from scheduler.model.errors import InvalidObjectError
from scheduler.model.gang import GangSpec
from scheduler.model.podgroup import (
    GROUP,
    PLURAL,
    SCHEDULED_CONDITION,
    VERSION,
    format_rfc3339,
    gang_from_podgroup,
    podgroup_status,
    pruned_fields,
    status_changed,
)
from tests.conftest import ControlPlane
from tests.model.test_podgroup import training_operator_podgroup

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
CRD_FILE = REPO / "crds" / "podgroup.yaml"
CRD_NAME = f"{PLURAL}.{GROUP}"
GI = 1024**3


async def kubectl(plane: ControlPlane, *args: str) -> str:
    """The cluster's own kubectl; fails the test with its stderr."""
    process = await asyncio.create_subprocess_exec(
        str(Path(plane.state.binaries) / "kubectl"),
        f"--kubeconfig={plane.kubeconfig}",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout=120)
    assert process.returncode == 0, f"kubectl {' '.join(args)}: {err.decode()}"
    return out.decode()


async def established(kube: client.ApiClient, name: str) -> None:
    ext = client.ApiextensionsV1Api(kube)

    async def probe() -> bool:
        crd = await ext.read_custom_resource_definition(name)
        conditions = (crd.status.conditions or []) if crd.status else []
        return any(c.type == "Established" and c.status == "True" for c in conditions)

    await poll(probe, within=60)


@pytest.fixture(scope="module")
async def podgroup_crd(control_plane: ControlPlane, kube: client.ApiClient) -> None:
    """Applied once, server-side, as an operator would; left installed for later tests."""
    out = await kubectl(control_plane, "apply", "--server-side", "-f", str(CRD_FILE))
    assert f"customresourcedefinition.apiextensions.k8s.io/{CRD_NAME}" in out
    await established(kube, CRD_NAME)


def objects(kube: client.ApiClient) -> Any:
    """CustomObjectsApi typed loosely: its stubs lack ``_content_type``, which exists."""
    return client.CustomObjectsApi(kube)


def kubeflow_podgroup(namespace: str, **spec: Any) -> dict[str, Any]:
    """The training operator's PodGroup for PyTorchJob ``mnist``, in ``namespace``."""
    body = training_operator_podgroup(**spec)
    body["metadata"]["namespace"] = namespace
    return body


async def create(kube: client.ApiClient, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
    created: dict[str, Any] = await objects(kube).create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, body
    )
    return created


async def read(kube: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = await objects(kube).get_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, name
    )
    return found


async def patch_status(
    kube: client.ApiClient, namespace: str, name: str, status: object
) -> dict[str, Any]:
    patched: dict[str, Any] = await objects(kube).patch_namespaced_custom_object_status(
        GROUP,
        VERSION,
        namespace,
        PLURAL,
        name,
        {"status": status},
        _content_type="application/merge-patch+json",
    )
    return patched


@pytest.mark.usefixtures("podgroup_crd")
async def test_crd_is_served_with_its_names(kube: client.ApiClient) -> None:
    crd = await client.ApiextensionsV1Api(kube).read_custom_resource_definition(CRD_NAME)
    conditions = {c.type: c.status for c in crd.status.conditions}
    assert conditions["Established"] == conditions["NamesAccepted"] == "True"
    assert "NonStructuralSchema" not in conditions
    assert crd.status.accepted_names.short_names == ["pg", "pgs"]
    assert crd.metadata.annotations["api-approved.kubernetes.io"].endswith("/pull/50")


async def test_whole_crds_directory_applies_server_side(
    control_plane: ControlPlane, kube: client.ApiClient
) -> None:
    files = sorted((REPO / "crds").glob("*.yaml"))
    names = [yaml.safe_load(f.read_text())["metadata"]["name"] for f in files]
    assert CRD_NAME in names
    out = await kubectl(control_plane, "apply", "--server-side", "-f", str(REPO / "crds"))
    for name in names:
        assert f"customresourcedefinition.apiextensions.k8s.io/{name} serverside-applied" in out
    for name in names:
        await established(kube, name)


@pytest.mark.usefixtures("podgroup_crd")
async def test_training_operator_podgroup_round_trip(
    kube: client.ApiClient, namespace: str
) -> None:
    sent = kubeflow_podgroup(namespace)
    created = await create(kube, namespace, sent)
    stored = await read(kube, namespace, "mnist")
    assert stored == created
    assert stored["spec"] == sent["spec"]  # int-or-string quantities kept as written
    assert stored["metadata"]["annotations"] == sent["metadata"]["annotations"]
    assert stored["metadata"]["ownerReferences"] == sent["metadata"]["ownerReferences"]
    assert stored.get("status", {}) == {}  # status on create is the subresource's, reset
    assert gang_from_podgroup(stored) == GangSpec(
        namespace=namespace,
        name="mnist",
        uid=stored["metadata"]["uid"],
        min_member=4,
        min_resources={"cpu": 16_000, "memory": 64 * GI, "nvidia.com/gpu": 4},
        schedule_timeout_s=120,
        topology_key="topology.kubernetes.io/zone",
        schedule_start_time=None,
        generation=1,
    )


@pytest.mark.usefixtures("podgroup_crd")
async def test_status_subresource_keeps_everything_lattice_writes(
    control_plane: ControlPlane, kube: client.ApiClient, namespace: str
) -> None:
    await create(kube, namespace, kubeflow_podgroup(namespace))
    now = float(int(time.time()))
    start = now - 42
    status = podgroup_status(
        phase="Scheduling",
        scheduled=3,
        running=2,
        succeeded=0,
        failed=0,
        schedule_start_time=start,
        reason="Partial",
        message="3/4 members placed; 1 waits for nvidia.com/gpu",
        now=now,
        previous=None,
        observed_generation=1,
    )
    patched = await patch_status(kube, namespace, "mnist", status)
    stored = (await read(kube, namespace, "mnist"))["status"]
    assert stored == patched["status"] == dict(status)
    assert pruned_fields(status, stored) == frozenset()
    assert gang_from_podgroup(await read(kube, namespace, "mnist")).schedule_start_time == start

    # Same facts a minute later: no write needed; the transition time is kept.
    again = podgroup_status(
        phase="Scheduling",
        scheduled=3,
        running=2,
        succeeded=0,
        failed=0,
        schedule_start_time=start,
        reason="Partial",
        message="3/4 members placed; 1 waits for nvidia.com/gpu",
        now=now + 60,
        previous=stored,
        observed_generation=1,
    )
    assert not status_changed(stored, again)
    assert again["conditions"] == stored["conditions"]

    # Admitted: the condition flips (new transition time); clearing the start time works.
    admitted = podgroup_status(
        phase="Running",
        scheduled=4,
        running=4,
        succeeded=0,
        failed=0,
        schedule_start_time=None,
        reason="Admitted",
        message="4/4 members placed",
        now=now + 90,
        previous=stored,
    )
    assert status_changed(stored, admitted)
    await patch_status(kube, namespace, "mnist", admitted)
    final = (await read(kube, namespace, "mnist"))["status"]
    assert "scheduleStartTime" not in final
    assert final["phase"] == "Running"
    (condition,) = final["conditions"]
    assert condition == {
        "type": SCHEDULED_CONDITION,
        "status": "True",
        "reason": "Admitted",
        "message": "4/4 members placed",
        "lastTransitionTime": format_rfc3339(now + 90),
    }
    assert not status_changed(final, admitted)

    table = await kubectl(control_plane, "get", "pg", "-n", namespace)
    header, row = table.splitlines()
    assert header.split() == ["NAME", "PHASE", "MINMEMBER", "SCHEDULED", "RUNNING", "AGE"]
    assert row.split()[:5] == ["mnist", "Running", "4", "4", "4"]
    wide = await kubectl(control_plane, "get", CRD_NAME, "-o", "wide", "-n", namespace)
    header, row = wide.splitlines()
    columns = ["PHASE", "MINMEMBER", "SCHEDULED", "RUNNING", "SUCCEEDED", "FAILED"]
    assert header.split()[1:7] == columns
    assert row.split()[1:7] == ["Running", "4", "4", "4", "0", "0"]


@pytest.mark.usefixtures("podgroup_crd")
async def test_schema_rejects_what_upstream_rejects(kube: client.ApiClient, namespace: str) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"minMember": 0}, "spec.minMember"),
        ({"minMember": -1}, "spec.minMember"),
        ({"minResources": {"cpu": "lots"}}, "spec.minResources.cpu"),
    ]
    for i, (spec, field) in enumerate(cases):
        body = kubeflow_podgroup(namespace, **spec)
        body["metadata"]["name"] = f"bad-{i}"
        with pytest.raises(client.ApiException) as info:
            await create(kube, namespace, body)
        assert info.value.status == 422
        assert field in str(info.value.body), info.value.body

    await create(kube, namespace, kubeflow_podgroup(namespace))
    bad_condition = {"conditions": [{"type": SCHEDULED_CONDITION, "status": "Maybe"}]}
    with pytest.raises(client.ApiException) as info:
        await patch_status(kube, namespace, "mnist", bad_condition)
    assert info.value.status == 422
    assert "status.conditions[0]" in str(info.value.body)


@pytest.mark.usefixtures("podgroup_crd")
@pytest.mark.parametrize(
    ("spec", "annotations", "field"),
    [
        pytest.param({"minResources": {"cpu": "-2"}}, {}, "spec.minResources[cpu]", id="neg-cpu"),
        pytest.param(
            {"scheduleTimeoutSeconds": -5}, {}, "spec.scheduleTimeoutSeconds", id="neg-timeout"
        ),
        pytest.param(
            {},
            {"lattice.dev/gang-topology": "rack name"},
            "metadata.annotations[lattice.dev/gang-topology]",
            id="bad-topology-key",
        ),
    ],
)
async def test_stored_podgroups_the_parser_refuses(
    kube: client.ApiClient,
    namespace: str,
    spec: dict[str, Any],
    annotations: dict[str, str],
    field: str,
) -> None:
    """Upstream's schema lets these through; parsing names the field instead of guessing."""
    body = kubeflow_podgroup(namespace, **spec)
    body["metadata"]["annotations"] = annotations
    await create(kube, namespace, body)
    stored = await read(kube, namespace, "mnist")
    with pytest.raises(InvalidObjectError) as info:
        gang_from_podgroup(stored)
    assert info.value.field == field
    assert field in str(info.value)
