"""The differential suites' seeds: drawn per run, printed, overridable, and every seed that
once failed run too. Pure, plus pytest's own collection in a subprocess (no cluster)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e import test_differential, test_differential_preemption, test_differential_volumes
from tests.e2e.differential.seeds import (
    REGRESSIONS,
    SEED_ENV,
    SEED_LIMIT,
    DiffRun,
    choose_seed,
    diff_runs,
    failure_hint,
)

ROOT = Path(__file__).resolve().parents[2]
SUITES = ("tests/e2e/test_differential.py", "tests/e2e/test_differential_volumes.py")


def test_the_seed_is_drawn_per_run_unless_given() -> None:
    ticks = iter((1_000_000_000, 1_000_001_000))
    drawn = {choose_seed(None, {}, lambda: next(ticks))[0] for _ in range(2)}
    assert len(drawn) == 2, "two runs a microsecond apart draw two seeds"
    assert all(0 <= s < SEED_LIMIT for s in drawn)
    assert choose_seed(None, {})[1] == "drawn"
    assert choose_seed(None, {SEED_ENV: " 41 "}) == (41, SEED_ENV)
    assert choose_seed(7, {SEED_ENV: "41"}) == (7, "--diff-seed")
    with pytest.raises(ValueError, match=SEED_ENV):
        choose_seed(None, {SEED_ENV: "seven"})


def test_regressions_run_beside_the_drawn_seed() -> None:
    suites = {
        m.DIFF_SUITE
        for m in (test_differential, test_differential_preemption, test_differential_volumes)
    }
    assert suites == set(REGRESSIONS), "every suite has a regression list, and only suites"
    runs = diff_runs("volumes", 123)
    assert runs[0] == DiffRun(123)
    assert [r.seed for r in runs[1:]] == [r.seed for r in REGRESSIONS["volumes"]]
    assert all(r.cases is not None for r in runs[1:])
    again = diff_runs("volumes", REGRESSIONS["volumes"][0].seed)
    assert [r.seed for r in again].count(REGRESSIONS["volumes"][0].seed) == 1
    assert runs[0].cases_or(300) == 300
    assert runs[1].cases_or(5) == 5
    assert runs[1].cases_or(10_000) == REGRESSIONS["volumes"][0].cases
    assert "--diff-seed 123" in failure_hint(runs[0], "volumes")
    assert "seeds.py" in failure_hint(runs[0], "volumes")


def collect(env: dict[str, str]) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *SUITES],
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if k != SEED_ENV} | env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return out.stdout


def test_collection_parametrizes_by_the_seed_and_the_summary_names_it() -> None:
    first, second = collect({}), collect({})
    seeds = [
        re.findall(r"test_core_agrees_with_kube_scheduler\[seed-(\d+)\]", o)
        for o in (first, second)
    ]
    assert all(len(s) == 1 for s in seeds)
    assert seeds[0] != seeds[1], "each run draws its own seed"
    assert f"differential seed {seeds[0][0]} (drawn); rerun with --diff-seed" in first
    given = collect({SEED_ENV: "41"})
    assert "test_core_agrees_with_kube_scheduler[seed-41]" in given
    for r in REGRESSIONS["volumes"]:
        assert f"test_volume_plugins_agree_with_kube_scheduler[regression-seed-{r.seed}]" in given
    assert f"differential seed 41 ({SEED_ENV})" in given
