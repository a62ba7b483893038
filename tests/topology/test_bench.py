"""The placement benchmark runs, and its headline holds on a small stream."""

from __future__ import annotations

import pytest

from lattice_dev.core import topology_bench as bench
from tests.topology.support import two_socket


def test_small_stream_lattice_aligns_and_keeps_whole_nodes() -> None:
    arrivals = bench.stream(300, 6, 0.8, seed=3)
    lattice = bench.run("lattice", two_socket(), arrivals, 6, lattice=True)
    kube = bench.run("kube", two_socket(), arrivals, 6, lattice=False)
    small = (1, 2, 4)
    assert sum(lattice.aligned[k] for k in small) == sum(lattice.placed[k] for k in small)
    assert sum(kube.aligned[k] for k in small) < sum(kube.placed[k] for k in small)
    assert lattice.placed[8] > kube.placed[8]
    assert sum(lattice.numa_rejects[k] for k in small) < sum(kube.numa_rejects[k] for k in small)


def test_main_prints_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    bench.main(["--nodes", "2", "--pods", "40"])
    out = capsys.readouterr().out
    assert "aligned (1-4 GPU pods)" in out
    assert "8-GPU admissible" in out
