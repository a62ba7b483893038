"""Which seeds the differential suites run: one drawn per test run, and every seed that
once found a disagreement.

A fixed seed checks the same few hundred cases on every run, so a new disagreement is
found only by whoever changes the seed. The seed is drawn per run instead (from the
clock; ``--diff-seed N`` or ``LATTICE_DIFF_SEED=N`` fixes it), printed in the report's
header and summary so a failure can be reproduced, and each seed that once failed stays
in :data:`REGRESSIONS`, run on every run beside the drawn one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

SEED_ENV: Final = "LATTICE_DIFF_SEED"
SEED_LIMIT: Final = 1 << 31


@dataclass(frozen=True)
class Regression:
    """A seed that once failed, with the cases it took to reach the failure."""

    seed: int
    cases: int
    why: str


REGRESSIONS: Final[Mapping[str, tuple[Regression, ...]]] = {
    "core": (),
    "preemption": (),
    "volumes": (
        Regression(
            2,
            300,
            "4/300 attach-limit disagreements: kube-scheduler's pod assumed for a claim it "
            "chose to provision stayed counted on its node (fixed in the harness)",
        ),
    ),
}
"""Per differential suite (a module's ``DIFF_SUITE``): add the seed of every failure here,
with the cases it needs, when it is fixed. ``just test`` runs each at most the suite's
option count (volumes 100: seed 2's first 100 cases); ``just test-diff`` runs them whole."""


@dataclass(frozen=True)
class DiffRun:
    """One run of a differential suite: a seed, and its case count (None: the option's)."""

    seed: int
    cases: int | None = None
    why: str = ""

    @property
    def id(self) -> str:
        return f"regression-seed-{self.seed}" if self.why else f"seed-{self.seed}"

    def cases_or(self, option: int) -> int:
        """The option's count; a regression's own, at most the option's (``just test-diff``
        raises the options so each regression runs whole)."""
        return option if self.cases is None else min(self.cases, option)


def choose_seed(
    option: int | None,
    env: Mapping[str, str],
    clock: Callable[[], int] = time.time_ns,
) -> tuple[int, str]:
    """The run's seed and where it came from: the option, the environment, else drawn."""
    if option is not None:
        return option, "--diff-seed"
    raw = env.get(SEED_ENV, "").strip()
    if raw:
        try:
            return int(raw), SEED_ENV
        except ValueError:
            raise ValueError(f"{SEED_ENV}={raw!r} is not an integer") from None
    return clock() // 1000 % SEED_LIMIT, "drawn"


def diff_runs(suite: str, seed: int) -> list[DiffRun]:
    """The drawn (or given) seed, then the suite's regressions other than it."""
    runs = [DiffRun(seed)]
    runs.extend(DiffRun(r.seed, r.cases, r.why) for r in REGRESSIONS[suite] if r.seed != seed)
    return runs


def seed_line(seed: int, source: str) -> str:
    """The report's line for the run's seed: how to run these cases again."""
    return (
        f"differential seed {seed} ({source}); rerun with --diff-seed {seed} or {SEED_ENV}={seed}"
    )


def failure_hint(run: DiffRun, suite: str) -> str:
    """Appended to a differential failure: how to reproduce it and keep it."""
    if run.why:
        return f"regression seed {run.seed} of {suite!r} fails again ({run.why})"
    return (
        f"reproduce with --diff-seed {run.seed}; once fixed, add Regression({run.seed}, "
        f"<cases>, ...) to REGRESSIONS[{suite!r}] in tests/e2e/differential/seeds.py"
    )
