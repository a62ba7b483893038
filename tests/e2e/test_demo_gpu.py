"""`lattice demo`'s GPU scenes hold what they claim, on a real control plane.

The demo prints; this checks the facts it is there to show: Lattice keeps a whole node
free for an 8-GPU pod with no more fragmentation than kube-scheduler's default profile
leaves on identical nodes, a GPU+NIC pod gets both under one PCIe switch of the node's
NodeTopology, and a rack-required gang takes the rack that holds it exactly so the next,
bigger gang still finds a whole rack. kube-scheduler runs beside Lattice as in the demo.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes_asyncio import client

from lattice_dev import demo_gpu
from lattice_dev.devcluster.cluster import ClusterConfig
from lattice_dev.devcluster.kube import api_client
from tests.e2e.test_scheduler import Plane, lattice_plane


def test_the_fragmentation_figure_counts_free_gpus_the_mix_cannot_use() -> None:
    """Two nodes with 0 and 8 free GPUs waste nothing; 4 and 4 leave each node's 4 free GPUs
    unusable to the 8-GPU class (share 1/7): 8/7 expected."""
    nodes = ["a", "b"]
    packed = demo_gpu.fragmentation_of(nodes, [("a", g) for g in demo_gpu.STREAM])
    spread = demo_gpu.fragmentation_of(nodes, [("a", 1), ("b", 2), ("a", 1), ("a", 2), ("b", 1)])
    assert packed == ({"a": 0, "b": 8}, 0.0)
    free, frag = spread
    assert free == {"a": 4, "b": 5}
    # b's 5 free GPUs: unusable to the 8 class only; a's 4 likewise.
    assert frag == pytest.approx((4 + 5) * (1 / 7))


@pytest.fixture(scope="module")
def demo_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    config = ClusterConfig(nodes=0, with_kube_scheduler=True)
    with lattice_plane(tmp_path_factory.mktemp("demogpu"), config) as p:
        yield p


async def test_the_gpu_scenes_show_what_they_say(demo_plane: Plane) -> None:
    async with api_client(demo_plane.cluster.kubeconfig) as api:
        await demo_gpu.prepare(api)
        sched = demo_plane.lattice().start()
        try:
            report = await demo_gpu.run_scenes(api)
        finally:
            sched.stop()
        lines = demo_gpu.render(report)
        nodes = {n.metadata.name: n for n in (await client.CoreV1Api(api).list_node()).items}

    # The taint keeps the demo's CPU workload (its `giant` needs 64 cores and must fit
    # nowhere) off these 96-core nodes.
    for node in demo_gpu.NODES:
        taints = nodes[node.name].spec.taints or []
        assert [(t.key, t.effect) for t in taints] == [(demo_gpu.GPU, "NoSchedule")]

    lattice, kube = report.lattice, report.kube
    assert all(p.node for p in lattice.stream), lattice.stream
    assert all(p.node for p in kube.stream), kube.stream
    assert {p.node for p in lattice.stream} <= {"gpu-lattice-0", "gpu-lattice-1"}
    assert {p.node for p in kube.stream} <= {"gpu-kube-0", "gpu-kube-1"}
    assert 8 in lattice.free_gpus.values(), lattice.free_gpus  # a whole node kept free
    assert lattice.fragmentation <= kube.fragmentation
    assert lattice.big.node is not None, lattice.big.why_not

    pcie = report.pcie
    assert pcie.solo.node == pcie.pair.node == "gpu-pcie-0"
    assert len(pcie.gpu_switches) == 2, pcie
    assert len(pcie.nic_switches) == 1, pcie
    switches = {*pcie.gpu_switches.values(), *pcie.nic_switches.values()}
    assert len(switches) == 1, pcie
    assert "?" not in switches, pcie
    assert set(pcie.gpu_switches).isdisjoint(pcie.solo.devices["gpus"])  # type: ignore[index]

    racks = report.racks
    assert racks.busy.node == "gpu-rack-a-0"
    first, second = (racks.gangs[g] for g, _, _ in demo_gpu.RACK_GANGS)
    assert all(p.node for p in first + second), racks.gangs
    assert {demo_gpu.rack_of(p.node) for p in first} == {"rack-a"}  # the tight rack
    assert racks.free_after_first == {"rack-a": 0, "rack-b": 16}
    assert {demo_gpu.rack_of(p.node) for p in second} == {"rack-b"}

    text = "\n".join(lines)
    assert "then an 8-GPU pod, Lattice: gpu-lattice-" in text
    assert "rack-b 16" in text
