"""FGD's figure, drawn with matplotlib's Agg backend."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler.sim import KUBE_DEFAULT, KUBE_MOST_ALLOCATED, plot
from scheduler.sim.replay import replay
from tests.sim.traces import small_then_whole

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_plot_writes_a_png_with_a_line_per_policy(tmp_path: Path) -> None:
    import matplotlib.image

    run = replay(small_then_whole(), [KUBE_DEFAULT, KUBE_MOST_ALLOCATED])
    out = tmp_path / "fgd.png"
    plot.plot(run, out)
    data = out.read_bytes()
    assert data.startswith(PNG_MAGIC)
    assert len(data) > 5000
    pixels = matplotlib.image.imread(out)
    assert pixels.shape[0] > 300
    assert pixels.shape[1] > 500


def test_without_matplotlib_plot_says_how_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(plot, "available", lambda: False)
    run = replay(small_then_whole(), [KUBE_DEFAULT])
    with pytest.raises(plot.PlotError, match=r"lattice-scheduler\[plot\]"):
        plot.plot(run, tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()
