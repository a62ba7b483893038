"""What a pod asks of the topology: GPUs, NICs, pinned CPUs and the alignment annotation."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from scheduler.core.profile import GpuAlignment, TopologyArgs
from scheduler.core.topology.request import InvalidTopologyRequest, TopologyRequest
from scheduler.model.pod import Pod
from tests.topology.support import annotate, gpu_pod

_names = itertools.count()


def container(
    cpu: str | None, memory: str | None = "1Gi", *, limits: bool = True, **extra: Any
) -> dict[str, Any]:
    requests = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v is not None}
    body: dict[str, Any] = {"name": f"c{next(_names)}", "resources": {"requests": requests}}
    if limits:
        body["resources"]["limits"] = dict(requests)
    body.update(extra)
    return body


def pod(containers: list[dict[str, Any]], inits: list[dict[str, Any]] | None = None) -> Pod:
    spec: dict[str, Any] = {"containers": containers}
    if inits:
        spec["initContainers"] = list(inits)
    return Pod.from_api({"metadata": {"name": "p"}, "spec": spec})


@pytest.mark.parametrize(
    ("containers", "inits", "want"),
    [
        pytest.param([container("4")], [], 4, id="guaranteed-whole"),
        pytest.param([container("4"), container("2")], [], 6, id="two-containers"),
        pytest.param([container("4"), container("500m")], [], 4, id="fractional-shares"),
        pytest.param([container("4", limits=False)], [], 0, id="burstable"),
        pytest.param([container("4", memory=None)], [], 0, id="no-memory-limit"),
        pytest.param([container("2")], [container("6")], 6, id="init-peak"),
        pytest.param(
            [container("2")],
            [container("1", restartPolicy="Always"), container("4")],
            5,
            id="sidecar-held-during-init",
        ),
        pytest.param([container("2")], [container("1", limits=False)], 0, id="init-burstable"),
    ],
)
def test_exclusive_cpus(
    containers: list[dict[str, Any]], inits: list[dict[str, Any]], want: int
) -> None:
    assert pod(containers, inits).exclusive_cpus == want


def test_annotations_are_parsed() -> None:
    built = annotate(gpu_pod("p", 1), "example.com/x", "y").build()
    assert built.annotations == {"example.com/x": "y"}


ARGS = TopologyArgs()


@pytest.mark.parametrize(
    ("builder", "want"),
    [
        pytest.param(gpu_pod("p", 2), TopologyRequest(gpus=2), id="gpus"),
        pytest.param(gpu_pod("p", 2, nic=True), TopologyRequest(gpus=2, nics=1), id="nic"),
        pytest.param(
            gpu_pod("p", 2, rdma_annotation=True),
            TopologyRequest(gpus=2, nics=1, shared_nic=True),
            id="annotated-nic",
        ),
        pytest.param(
            gpu_pod("p", 1, nic=True, rdma_annotation=True),
            TopologyRequest(gpus=1, nics=1),
            id="resource-wins",
        ),
        pytest.param(
            gpu_pod("p", 4, alignment="Strict"),
            TopologyRequest(gpus=4, alignment=GpuAlignment.STRICT),
            id="strict",
        ),
        pytest.param(
            gpu_pod("p", 0, cpu="8", guaranteed=True), TopologyRequest(cpus=8), id="pinned"
        ),
        pytest.param(
            annotate(gpu_pod("p", 1), "lattice.dev/rdma", "false"),
            TopologyRequest(gpus=1),
            id="rdma-false",
        ),
    ],
)
def test_request_from_pod(builder: Any, want: TopologyRequest) -> None:
    assert TopologyRequest.from_pod(builder.build(), ARGS) == want


@pytest.mark.parametrize(
    ("key", "value"),
    [
        pytest.param("lattice.dev/gpu-alignment", "exact", id="alignment"),
        pytest.param("lattice.dev/rdma", "please", id="rdma"),
    ],
)
def test_invalid_annotations(key: str, value: str) -> None:
    with pytest.raises(InvalidTopologyRequest, match=key):
        TopologyRequest.from_pod(annotate(gpu_pod("p", 1), key, value).build(), ARGS)


def test_default_alignment_comes_from_the_profile() -> None:
    strict = TopologyArgs(default_alignment=GpuAlignment.STRICT)
    assert TopologyRequest.from_pod(gpu_pod("p", 1).build(), strict).alignment is (
        GpuAlignment.STRICT
    )
