"""FGD's figure: unallocated GPU % against arrived GPU demand %, one line per policy.

matplotlib is the optional extra ``plot`` (``pip install 'lattice-scheduler[plot]'``): it is
imported only by :func:`plot`, with the Agg backend (files, no display), so the rest of
`lattice simulate` runs without it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from scheduler.sim.replay import Replay

INSTALL_HINT = "pip install 'lattice-scheduler[plot]'"


class PlotError(RuntimeError):
    """The figure cannot be drawn (matplotlib missing); the message is one line."""


def available() -> bool:
    """Whether matplotlib can be imported (checked before a long replay, not after)."""
    return importlib.util.find_spec("matplotlib") is not None


def plot(run: Replay, path: Path) -> None:
    """Write the figure of ``run`` to ``path`` (format from the suffix, e.g. ``.png``)."""
    if not available():
        raise PlotError(f"plots need matplotlib: {INSTALL_HINT}")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), layout="constrained")
    try:
        for result in run.results:
            if not result.curve:
                continue
            xs = [x for x, _ in result.curve]
            ys = [y for _, y in result.curve]
            ax.plot(xs, ys, label=result.policy, linewidth=1.6)
        ax.set_xlabel("Arrived GPU demand (% of the cluster's GPUs)")
        ax.set_ylabel("Unallocated GPUs (%)")
        ax.set_title(
            f"{run.trace or 'trace'}: {run.nodes} nodes, {run.gpus} GPUs"
            + (", with deletions" if run.config.deletions else "")
        )
        ax.set_xlim(left=0)
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        if any(r.curve for r in run.results):
            ax.legend()
        fig.savefig(path, dpi=120)
    finally:
        plt.close(fig)
