"""The start-up sync micro-benchmark: both collector modes fill the whole cache."""

from __future__ import annotations

import pytest

from lattice_dev.benchmarks import startup


def test_both_modes_cache_every_node_and_pod_and_print_a_row_each(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert startup.main(["--nodes", "12", "--pods", "600", "--repeat", "1"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[2:]]
    assert sorted(r[1] for r in rows) == ["on", "paused"]
    assert all(float(r[2]) > 0 and float(r[3]) > 0 for r in rows)


def test_a_pod_body_is_bound_to_one_of_the_nodes() -> None:
    body = startup.pod_body(7, nodes=5)
    assert body["spec"]["nodeName"] == "kwok-node-0002"
    assert body["status"]["phase"] == "Running"
