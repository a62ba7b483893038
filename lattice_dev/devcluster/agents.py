"""Simulated node agents: NodeTopology objects for fake (kwok) nodes, from the real agent code.

A kwok node has no sysfs, so ``lattice devcluster up --node-profile gpu-8x`` gives each
fake node the hardware of a committed fixture tree (``tests/agent/fixtures/two-socket-8gpu``:
two sockets, four PCIe switches, eight GPUs and four RDMA NICs). Nothing is hand-written:
the agent's reader (:func:`scheduler.agent.reader.read_node`) parses the tree and the
agent's publisher (:func:`scheduler.agent.publisher.publish_once`) creates or patches each
node's object, owned by its Node, with a status heartbeat. An end-to-end run therefore
exercises the same reader, wire format and CRD as a real node.

The tree is read once per call (the reader is deterministic, and every node gets the same
hardware) and published for every node name with bounded concurrency. This module applies
nothing else: the CRD (``crds/nodetopology.yaml``) must be in place first.

Where the fixtures are: ``$LATTICE_TOPOLOGY_FIXTURES`` (a folder of fixture trees), else the
repository's ``tests/agent/fixtures`` found next to this package, as ``build.py`` finds
``e2e/``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

from kubernetes_asyncio import client

from scheduler.agent.pci import DEFAULT_NAMING, ResourceNaming
from scheduler.agent.publisher import (
    KubernetesTopologyApi,
    SpecAction,
    TopologyApi,
    publish_once,
)
from scheduler.agent.reader import NodeReading, read_node

FIXTURES_ENV: Final = "LATTICE_TOPOLOGY_FIXTURES"
PROFILE_FIXTURES: Final = {"gpu-8x": "two-socket-8gpu"}
"""Node profile -> fixture tree whose hardware its fake nodes get."""


class FixtureError(RuntimeError):
    """The fixture tree is missing or the reader could not make sense of it."""


def fixtures_root() -> Path:
    env = os.environ.get(FIXTURES_ENV)
    if env:
        return Path(env)
    from lattice_dev.devcluster.build import checkout_path

    return checkout_path("tests", "agent", "fixtures")


def fixture_for_profile(profile: str) -> Path | None:
    """The fixture tree for a node profile, or None when its nodes have no topology."""
    name = PROFILE_FIXTURES.get(profile)
    return fixtures_root() / name if name is not None else None


def read_fixture(
    fixture_dir: Path,
    *,
    kubelet_config: Path | None = None,
    naming: ResourceNaming = DEFAULT_NAMING,
) -> NodeReading:
    """One agent reading of a fixture tree (``sys/`` and ``proc/`` inside it)."""
    sysfs, procfs = fixture_dir / "sys", fixture_dir / "proc"
    if not sysfs.is_dir():
        raise FixtureError(
            f"no fixture tree at {fixture_dir} (expected {sysfs}); set ${FIXTURES_ENV} to the "
            "folder holding tests/agent/fixtures"
        )
    reading = read_node(
        sysfs_root=sysfs, procfs_root=procfs, kubelet_config=kubelet_config, naming=naming
    )
    if not reading.topology.gpus:
        raise FixtureError(f"fixture tree {fixture_dir} has no GPUs: {list(reading.warnings)}")
    return reading


async def publish_simulated_topologies(
    api: client.ApiClient | TopologyApi,
    node_names: Iterable[str],
    fixture_dir: Path,
    *,
    kubelet_config: Path | None = None,
    naming: ResourceNaming = DEFAULT_NAMING,
    parallel: int = 16,
    now: datetime | None = None,
) -> dict[str, SpecAction]:
    """Publish the fixture tree's NodeTopology for every node; what was done to each spec.

    ``api`` is an API client (or, in tests, any :class:`TopologyApi`). ``kubelet_config``
    optionally names a KubeletConfiguration file, to simulate nodes whose kubelet runs the
    single-numa-node policy. Safe to call again: unchanged specs are left alone and only
    the status heartbeat is refreshed.
    """
    reading = await asyncio.to_thread(
        read_fixture, fixture_dir, kubelet_config=kubelet_config, naming=naming
    )
    topo_api: TopologyApi = KubernetesTopologyApi(api) if isinstance(api, client.ApiClient) else api
    stamp = now or datetime.now(UTC)
    gate = asyncio.Semaphore(parallel)

    async def one(name: str) -> tuple[str, SpecAction]:
        async with gate:
            return name, await publish_once(topo_api, name, reading, stamp)

    done = await asyncio.gather(*(one(name) for name in node_names))
    return dict(done)


async def run_simulated_agents(
    api: client.ApiClient | TopologyApi,
    node_names: Iterable[str],
    fixture_dir: Path,
    stop: asyncio.Event,
    *,
    interval_seconds: float = 60.0,
    kubelet_config: Path | None = None,
) -> None:
    """Publish now and then every interval until ``stop``, like the agents' heartbeat."""
    names = list(node_names)
    while not stop.is_set():
        await publish_simulated_topologies(api, names, fixture_dir, kubelet_config=kubelet_config)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=interval_seconds)
