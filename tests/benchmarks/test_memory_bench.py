"""The memory benchmark end to end at a small size: it starts its own plane, binds every
pod with `lattice run` and prints a peak RSS that is a real figure."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from lattice_dev.benchmarks.memory import main, rss_mib


def test_rss_of_this_process_is_read_from_proc() -> None:
    rss, peak = rss_mib(os.getpid())
    assert 10 < rss <= peak < 100_000


def test_a_small_run_binds_every_pod_and_prints_its_peak(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    main(
        [
            "--nodes",
            "10",
            "--existing",
            "60",
            "--pods",
            "40",
            "--state-dir",
            str(tmp_path / "p"),
            "--down",
        ]
    )
    out = capsys.readouterr().out
    assert "existing pods: 60 in" in out
    m = re.search(r"run 1: (\d+)/40 bound .* peak RSS (\d+) MiB", out)
    assert m is not None, out
    assert int(m.group(1)) == 40
    assert 50 < int(m.group(2)) < 2000  # a Python process with its cache, not a parse slip
