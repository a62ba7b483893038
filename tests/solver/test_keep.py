"""The gang objective's last tier: GPUs kept usable by the request mix, per node and use."""

from __future__ import annotations

import numpy as np

from scheduler.core.gpus import SizeClass
from scheduler.solver.problem import keep_table


def test_keep_table_by_hand() -> None:
    mix = (SizeClass(1, 0.5, 0, 0), SizeClass(8, 0.5, 0, 0))
    table = keep_table(np.array([8, 3, 5]), np.array([True, True, False]), mix)
    # A whole 8-GPU node: untouched or filled keeps everything; one GPU used leaves 7 that
    # 8-GPU requests cannot use (3.5 expected GPUs lost), and so on down.
    assert table[0].tolist() == [3500, 0, 500, 1000, 1500, 2000, 2500, 3000, 3500]
    # 3 free: every GPU used there is one fewer useless to 8-GPU requests; past the free
    # count the value repeats (the capacity rule forbids those uses).
    assert table[1].tolist() == [0, 500, 1000, 1500, 1500, 1500, 1500, 1500, 1500]
    assert table[2].tolist() == [0] * 9  # not a node the objective counts
