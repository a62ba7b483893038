"""`lattice graph` (scheduler.graph.cli) against the live control plane."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any, cast

import pytest
from kubernetes_asyncio import client

from scheduler.graph import cli
from tests.conftest import ControlPlane

NODE = "kwok-node-0000"


def _pod(name: str, *, node: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "schedulerName": "lattice-graph-test",  # nobody schedules it
        "containers": [{"name": "c", "image": "busybox"}],
        "affinity": {
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "labelSelector": {"matchLabels": {"app": "web"}},
                        "topologyKey": "kubernetes.io/hostname",
                    }
                ]
            }
        },
    }
    if node:
        spec["nodeName"] = node
    body = {"metadata": {"name": name, "labels": {"app": "web"}}, "spec": spec}
    return {"apiVersion": "v1", "kind": "Pod", **body}


def _args(control_plane: ControlPlane, *extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="lattice graph")
    cli.add_arguments(parser)
    return parser.parse_args(["--kubeconfig", str(control_plane.kubeconfig), *extra])


@pytest.mark.cluster
async def test_graph_of_a_live_pod(
    control_plane: ControlPlane,
    kube: client.ApiClient,
    namespace: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    core = client.CoreV1Api(kube)
    await core.create_namespaced_pod(namespace, cast(client.V1Pod, _pod("bound", node=NODE)))
    await core.create_namespaced_pod(namespace, cast(client.V1Pod, _pod("waiting")))

    assert (
        await asyncio.to_thread(cli.run, _args(control_plane, "--pod", f"{namespace}/waiting")) == 0
    )
    dot = capsys.readouterr().out
    assert dot.startswith('digraph "lattice" {')
    assert f"{namespace}/waiting (pending)" in dot
    assert f"{namespace}/bound" in dot
    assert f'[label="{NODE}", shape=box]' in dot
    assert "required-anti-affinity" in dot
    assert f"domain/kubernetes.io/hostname={NODE}" in dot

    assert await asyncio.to_thread(cli.run, _args(control_plane, "--namespace", namespace)) == 0
    assert f"{namespace}/bound" in capsys.readouterr().out

    missing = _args(control_plane, "--pod", f"{namespace}/nope")
    assert await asyncio.to_thread(cli.run, missing) == 2
    assert "not found" in capsys.readouterr().err
