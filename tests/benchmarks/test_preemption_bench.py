"""The preemption benchmark at a tiny size: every preemptor kind gets a row, the core and the
naive oracle agree (full oracle on the small cluster, spot check on the larger one), exit 0.
No timing is asserted."""

from __future__ import annotations

import re

import pytest

from lattice_dev.benchmarks.preemption import PREEMPTOR_KINDS, build_world, main, preemptor
from scheduler.core.schedule import Framework


def test_a_tiny_run_prints_agreeing_rows(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--nodes", "12,50", "--pods", "300", "--repeat", "1", "--oracle-max-nodes", "12"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    rows = re.findall(
        r"^\s+(\d+) (.+?)\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+[\d.]+ x\s*\d+\s+(\w+)  (.*)$", out, re.M
    )
    assert {(int(n), kind.strip()) for n, kind, _, _ in rows} == {
        (n, kind) for n in (12, 50) for kind in PREEMPTOR_KINDS
    }, out
    assert all(agree == "yes" for _, _, agree, _ in rows), out
    modes = [chosen.rsplit("; oracle ", 1)[1] for *_, chosen in rows]
    assert modes.count("full") == len(PREEMPTOR_KINDS), out
    assert all(m.startswith("est: ") for m in modes if m != "full"), out
    assert "victims" in out
    assert out.rstrip().endswith("core and oracle agree")


def test_no_preemptor_fits_without_evictions() -> None:
    world = build_world(40, 200, seed=3)
    framework = Framework()
    for kind in PREEMPTOR_KINDS:
        decision = framework.schedule(world.snapshot, preemptor(kind))
        assert decision.selected is None, kind
