"""`lattice simulate --gangs --topology`: the real command on a small cluster, its table and
JSON, and its refusals."""

from __future__ import annotations

import json

import pytest

from scheduler.cli import main
from scheduler.sim.topology import COLUMNS, KUBE_TAS, KUEUE, LATTICE, POLICIES

_ARGV = [
    "simulate",
    "--gangs",
    "--topology",
    "2x2x2x8",
    "--max-gangs",
    "12",
    "--mean-run",
    "500",
    "--load",
    "1.5",
    "--seeds",
    "1",
    "2",
    "--no-progress",
]


def test_table_and_json_agree(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(_ARGV) == 0
    header, columns, *lines = capsys.readouterr().out.splitlines()
    assert header.startswith("topology 2x2x2x8 (64 GPUs): 12 gangs a seed, load 1.5")
    assert columns.split() == " ".join(COLUMNS).split()
    rows = [line.split() for line in lines]
    assert [r[:2] for r in rows[:8]] == [[s, p] for s in ("1", "2") for p in POLICIES]
    assert [r[:2] for r in rows[8:]] == [["mean", p] for p in POLICIES]
    assert main([*_ARGV, "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["topology"], doc["gpus"], doc["gangs"]) == ("2x2x2x8", 64, 12)
    results = [p for run in doc["runs"] for p in run["policies"]]
    assert len(results) == 8
    for result, row in zip(results, rows, strict=False):
        gangs = result["gangs"]
        assert row[1] == result["policy"]
        assert row[2] == f"{gangs['admitted']}/{gangs['arrived']}"
        assert gangs["arrived"] == 12
        assert gangs["admitted"] + gangs["givenUp"] == 12
        assert sum(a for a, _ in result["admittedByKind"].values()) == gangs["admitted"]
        assert result["recheckFailed"] == 0
        assert 0 <= result["allocatedGpuPercentTimeAvg"] <= 100
        at_fewest = result["preferredAtFewestPercent"]
        assert at_fewest is None or 0 <= at_fewest <= 100
        assert (at_fewest == 100) == (
            at_fewest is not None and result["preferredDomainsExcess"] == 0
        )


def test_policies_and_mix_are_chosen(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [*_ARGV, "--topology-policies", KUEUE, KUBE_TAS, "--topology-mix", "required-rack=1"]
    assert main([*argv, "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["mix"] == {"required-rack": 1.0}
    for run in doc["runs"]:
        assert [p["policy"] for p in run["policies"]] == [KUEUE, KUBE_TAS]
        for p in run["policies"]:
            assert set(p["admittedByKind"]) == {"required-rack"}
            assert p["preferredDomainsSpanned"] is None  # no gang has a preferred level
    assert LATTICE not in {p["policy"] for run in doc["runs"] for p in run["policies"]}


@pytest.mark.parametrize(
    ("argv", "message", "code"),
    [
        (["simulate", "--topology", "2x2x2x8"], "--topology goes with --gangs", 2),
        ([*_ARGV, "--churn", "1.2"], "--gangs --topology does not take --churn", 2),
        (
            ["simulate", "--gangs", "--topology", "2x2x8"],
            "topology must be BLOCKSxRACKSxNODESxGPUS, got '2x2x8'",
            1,
        ),
        ([*_ARGV, "--topology-mix", "slices"], "--topology-mix: KIND=WEIGHT expected", 1),
        ([*_ARGV, "--topology-mix", "big=1"], "mix: weights >= 0 of", 1),
    ],
)
def test_refusals(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str, code: int
) -> None:
    assert main(argv) == code
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(f"lattice simulate: {message}")
