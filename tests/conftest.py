"""Suite-wide fixtures: one real control plane per test run, a namespace per test.

The control plane is started by the same code as `lattice devcluster`, in a
temporary state folder on free loopback ports, so a developer's own devcluster
is never touched. If it cannot start, every test that needs it errors: tests
that need Kubernetes are never skipped.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from scheduler.devcluster.cluster import ClusterConfig, ClusterState, DevCluster
from scheduler.devcluster.kube import api_client

SUITE_NODES = int(os.environ.get("LATTICE_TEST_NODES", "4"))
_REPORT: list[str] = []


def report_line(line: str) -> None:
    """A figure a test measured, printed in the run's summary (agreement rates and the like)."""
    _REPORT.append(line)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--diff-cases",
        type=int,
        default=300,
        help="differential test: cases against kube-scheduler (default 300)",
    )
    parser.addoption(
        "--diff-seed", type=int, default=1, help="differential test: generator seed (default 1)"
    )
    parser.addoption(
        "--volume-cases",
        type=int,
        default=100,
        help="differential volume test: cases against kube-scheduler (default 100)",
    )
    parser.addoption(
        "--preempt-cases",
        type=int,
        default=200,
        help="differential preemption test: cases against kube-scheduler (default 200)",
    )


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _REPORT:
        terminalreporter.section("lattice figures")
        for line in _REPORT:
            terminalreporter.write_line(line)


class ControlPlane:
    """What a test needs to reach the suite's control plane."""

    def __init__(self, cluster: DevCluster, state: ClusterState) -> None:
        self.cluster = cluster
        self.state = state

    @property
    def kubeconfig(self) -> Path:
        return self.cluster.kubeconfig

    def kubeconfig_for(self, user: str) -> Path:
        return self.cluster.kubeconfig_for(user)


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """etcd + kube-apiserver + kube-controller-manager + kwok + kube-scheduler, once per run."""
    cluster = DevCluster(tmp_path_factory.mktemp("devcluster") / "state")
    state = cluster.up(ClusterConfig(nodes=SUITE_NODES, with_kube_scheduler=True))
    try:
        yield ControlPlane(cluster, state)
    finally:
        cluster.down()


@pytest.fixture(scope="session")
async def kube(control_plane: ControlPlane) -> AsyncIterator[client.ApiClient]:
    """An admin API client for the suite's control plane."""
    async with api_client(control_plane.kubeconfig) as api:
        yield api


@pytest.fixture
async def namespace(kube: client.ApiClient) -> AsyncIterator[str]:
    """A fresh namespace per test, deleted afterwards (its pods go with it)."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    core = client.CoreV1Api(kube)
    await core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    try:
        yield name
    finally:
        await core.delete_namespace(name)
