"""The devcluster's readiness wait: a budget that grows with the node count, a
stall limit, and an error that says how far it got."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from lattice_dev.devcluster.cluster import (
    ClusterConfig,
    DevCluster,
    DevClusterError,
    ReadyPolicy,
    ReadyTracker,
    raw_node_ready,
)


def test_budget_scales_with_the_node_count() -> None:
    small = ReadyPolicy.for_config(ClusterConfig(nodes=3))
    big = ReadyPolicy.for_config(ClusterConfig(nodes=5000))
    assert small.budget_s == pytest.approx(120.3)
    assert big.budget_s == pytest.approx(620.0)
    assert big.stall_s == small.stall_s == 60.0


@pytest.mark.parametrize(
    ("elapsed", "ready", "since_new", "expected"),
    [
        pytest.param(10, 5000, 0, None, id="done"),
        pytest.param(10, 0, 10, None, id="early-none-ready"),
        pytest.param(300, 4220, 2, None, id="past-old-120s-still-growing"),
        pytest.param(
            180, 4220, 30, "4220/5000 nodes Ready after 180 s, none new for 30 s", id="stalled"
        ),
        pytest.param(45, 0, 45, "0/5000 nodes Ready after 45 s, none new for 45 s", id="none"),
        pytest.param(
            700,
            4999,
            1,
            "4999/5000 nodes Ready after 700 s (budget 620 s), last new one 1 s ago",
            id="budget",
        ),
    ],
)
def test_policy_give_up(elapsed: float, ready: int, since_new: float, expected: str | None) -> None:
    policy = ReadyPolicy(total=5000, budget_s=620, stall_s=30)
    assert policy.give_up(elapsed_s=elapsed, ready=ready, since_new_s=since_new) == expected


def test_tracker_stall_clock_follows_the_best_count() -> None:
    tracker = ReadyTracker(ReadyPolicy(total=10, budget_s=1000, stall_s=30), started=100.0)
    assert tracker.observe(110.0, 4) is None
    # A node flapping back to NotReady is neither progress nor a reset of the clock.
    assert tracker.observe(130.0, 3) is None
    assert tracker.observe(139.0, 4) is None
    assert tracker.observe(140.0, 4) == "4/10 nodes Ready after 40 s, none new for 30 s"
    assert tracker.observe(141.0, 10) is None
    assert tracker.done
    assert tracker.line(141.0) == "10/10 nodes Ready after 41 s"


@pytest.mark.parametrize(
    ("node", "ready"),
    [
        pytest.param({"status": {"conditions": [{"type": "Ready", "status": "True"}]}}, True),
        pytest.param({"status": {"conditions": [{"type": "Ready", "status": "False"}]}}, False),
        pytest.param({"status": {}}, False, id="no-conditions"),
        pytest.param(
            {
                "spec": {"taints": [{"key": "node.kubernetes.io/not-ready"}]},
                "status": {"conditions": [{"type": "Ready", "status": "True"}]},
            },
            False,
            id="not-ready-taint",
        ),
        pytest.param(
            {
                "spec": {"taints": [{"key": "dedicated"}]},
                "status": {"conditions": [{"type": "Ready", "status": "True"}]},
            },
            True,
            id="other-taint",
        ),
    ],
)
def test_raw_node_ready(node: dict[str, object], ready: bool) -> None:
    assert raw_node_ready(node) is ready


def test_up_reports_progress_and_a_short_cluster_says_how_far_it_got(tmp_path: Path) -> None:
    cluster = DevCluster(tmp_path / "state")
    lines: list[str] = []
    try:
        state = cluster.up(ClusterConfig(nodes=50), progress=lines.append)
        assert lines, "no progress reported"
        counts = [re.fullmatch(r"(\d+)/50 nodes Ready after \d+ s", ln) for ln in lines]
        assert all(counts), lines
        seen = [int(m.group(1)) for m in counts if m]
        assert seen == sorted(seen)
        assert seen[-1] == 50
        assert state.config["ready_seconds"] > 0
        # The same wait on a cluster that lacks 10 of its nodes: it stalls at 50 and says so.
        short = ClusterConfig(nodes=60, node_ready_stall=1.0)
        with pytest.raises(
            DevClusterError, match=r"^50/60 nodes Ready after \d+ s, none new for \d+ s; logs: "
        ):
            asyncio.run(cluster._wait_nodes_ready(short, None))
    finally:
        cluster.down()
