"""`lattice explain`'s GPU table: the figures GPUPlacement scored from, per feasible node."""

from __future__ import annotations

from scheduler.control.explain import gpu_figures, gpu_json, render_gpu_table, seed_gpu_demand
from scheduler.core.profile import DEFAULT_PROFILE
from scheduler.core.schedule import schedule
from scheduler.core.topology.state import TopologyState
from tests.builders import cluster, make_node, make_pod


def test_gpu_table_shows_free_gpus_and_fragmentation_before_and_after() -> None:
    nodes = [
        make_node(n, cpu="96", memory="512Gi").allocatable(**{"nvidia.com/gpu": 8})
        for n in ("whole", "one-left")
    ]
    placed = [
        (make_pod(f"u{i}", cpu="1", resources={"nvidia.com/gpu": "1"}), "one-left")
        for i in range(7)
    ]
    snapshot = cluster(nodes, placed)
    pending = make_pod("p", cpu="1", resources={"nvidia.com/gpu": "1"}).obj()
    pending["spec"]["schedulerName"] = "lattice"
    bound = [make_pod(f"u{i}", cpu="1", resources={"nvidia.com/gpu": "1"}).obj() for i in range(7)]
    for body in bound:
        body["spec"]["nodeName"] = "one-left"
    topology = TopologyState()
    seed_gpu_demand(topology, DEFAULT_PROFILE, snapshot, [*bound, pending], "lattice")
    assert topology.gpu_demand.arrivals == 8  # seven bound, one pending

    pod = make_pod("p", cpu="1", resources={"nvidia.com/gpu": "1"}).build()
    decision = schedule(snapshot, pod, topology=topology)
    assert decision.selected == "one-left"
    fig = gpu_figures(DEFAULT_PROFILE, snapshot, pod, topology)
    assert fig is not None
    table = render_gpu_table(decision, fig).splitlines()
    assert table[0].startswith("GPUs (pod asks 1;")
    assert "1 GPU " in table[0]
    first, second = table[2].split(), table[3].split()
    assert first[:3] == ["*", "one-left", "1/8"]  # fills the last GPU: fragments nothing
    assert second[:2] == ["whole", "8/8"]
    assert float(second[-1]) > 0  # seven of its GPUs become useless to 8-GPU requests
    data = gpu_json(decision, fig)
    assert data["nodes"]["one-left"]["fragmentationAfter"] == 0
    assert data["nodes"]["whole"]["freeGPUs"] == 8
    assert data["podGPUs"] == 1
