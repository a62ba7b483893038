"""TopologyState bookkeeping: shared layouts, heartbeats, node removal."""

from __future__ import annotations

from scheduler.core.topology import TopologyState
from tests.agent.trees import TWO_SOCKET, read_fixture
from tests.topology.support import single_gpu_vm, two_socket


def test_identical_nodes_share_a_layout_and_heartbeats_keep_it() -> None:
    state = TopologyState()
    state.set_node_topology("a", two_socket())
    state.set_node_topology("b", read_fixture(TWO_SOCKET).topology)  # equal, not identical
    assert state.serial("a") == state.serial("b")
    assert state.layout("a") is state.layout("b")
    before = state.free("a", 96)
    state.set_node_topology("a", read_fixture(TWO_SOCKET).topology)  # the agent republishes
    assert state.free("a", 96) is before
    state.set_node_topology("b", single_gpu_vm())
    assert state.serial("b") != state.serial("a")


def test_removing_a_node_forgets_its_topology() -> None:
    state = TopologyState()
    state.set_node_topology("a", two_socket())
    assert state.node_names() == {"a"}
    state.remove_node("a")
    assert state.layout("a") is None
    assert not state.has_topology()
    assert state.free("a", 96) is None
