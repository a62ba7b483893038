"""The offline bench-dra replay: every pod placed once, no device twice, and the figures
read back from the allocations it made."""

from __future__ import annotations

import pytest

from lattice_dev.benchmarks import dra_offline
from lattice_dev.benchmarks.dra import GPUS_PER_NODE, workload
from scheduler.core.profile import DEFAULT_PROFILE, kube_profile


@pytest.mark.parametrize("profile", [DEFAULT_PROFILE, kube_profile(kube_minor=37)])
def test_every_pod_is_placed_with_its_devices_once(profile: object) -> None:
    nodes, pods = 32, 40
    out = dra_offline.replay(profile, nodes, pods, seed=1)  # type: ignore[arg-type]
    shapes = workload(pods, 1)
    gpus = sum(s.gpus for s in shapes)
    assert gpus < nodes * GPUS_PER_NODE // 2  # room enough: every pod must be placed
    assert out.placed == pods
    assert out.devices == gpus + sum(s.constrained for s in shapes)  # a NIC each
    assert out.left.free_gpus == nodes * GPUS_PER_NODE - gpus
    assert out.left.free_nodes * GPUS_PER_NODE + out.left.stranded_gpus <= out.left.free_gpus


def test_the_replay_is_deterministic_and_prints_both_profiles(
    capsys: pytest.CaptureFixture[str],
) -> None:
    first = dra_offline.replay(DEFAULT_PROFILE, 16, 24, seed=3)
    assert dra_offline.replay(DEFAULT_PROFILE, 16, 24, seed=3) == first
    assert dra_offline.main(["--nodes", "16", "--pods", "24", "--seeds", "3", "4"]) == 0
    out = capsys.readouterr().out
    assert "lattice" in out
    assert "kube-1.37" in out
    assert "median over seeds" in out
