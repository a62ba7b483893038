"""`lattice simulate --gangs`: the real command on a small trace, its table and JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from scheduler.cli import main
from scheduler.sim.gangs import COLUMNS, CPSAT, GREEDY
from tests.sim.traces import DEFAULT_HEADER, MULTIGPU_HEADER, NODES_HEADER, write_csv

_SIZES = [1, 8, 2, 0, 8, 4, 1, 8, 2, 4, 8, 1, 2, 8, 0, 4, 4, 8, 2, 1, 8, 8, 2, 4, 1, 8]


def _files(tmp_path: Path) -> tuple[Path, Path, Path]:
    """Eight 8-GPU nodes and four 4-GPU ones (80 GPUs); 78 tasks, a third multi-GPU; run
    times 100..1000 s."""
    nodes = [f"big-{i},64000,262144,8,V100M32" for i in range(8)]
    nodes += [f"small-{i},32000,131072,4,V100M32" for i in range(4)]
    tasks = [
        f"t{n},{2000 * max(g, 1)},{8192 * max(g, 1)},{g},{1000 if g else 0}"
        for n, g in enumerate(_SIZES * 3)
    ]
    runs = [
        f"d{n},1000,1024,1,1000,,LS,Running,{n},{n + 100 * (n % 10 + 1)},{n}" for n in range(20)
    ]
    return (
        write_csv(tmp_path / "nodes.csv", NODES_HEADER, nodes),
        write_csv(tmp_path / "tasks.csv", MULTIGPU_HEADER, tasks),
        write_csv(tmp_path / "runs.csv", DEFAULT_HEADER, runs),
    )


def _argv(tmp_path: Path, *extra: str) -> list[str]:
    nodes, tasks, runs = _files(tmp_path)
    return [
        "simulate",
        "--gangs",
        "--nodes",
        str(nodes),
        "--tasks",
        str(tasks),
        "--durations",
        str(runs),
        "--gang-members",
        "2-4",
        "--load",
        "1.5",
        "--patience",
        "400",
        "--seeds",
        "1",
        "2",
        "--no-progress",
        *extra,
    ]


def _fraction(cell: str) -> tuple[int, int]:
    done, total = cell.split("/")
    return int(done), int(total)


def test_the_real_command_prints_both_arms_per_seed_with_consistent_numbers(
    tmp_path: Path,
) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "scheduler.cli", *_argv(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    header, columns, *lines = out.splitlines()
    assert header.startswith(
        "tasks: 12 nodes, 80 GPUs; gangs of 2-4 members (0.5 mixed, task-list order)"
    )
    assert "load 1.5, patience 400 s" in header
    assert columns.split() == " ".join(COLUMNS).split()
    rows = [dict(zip(COLUMNS, line.split(), strict=True)) for line in lines]
    assert [(r["seed"], r["arm"]) for r in rows] == [
        ("1", CPSAT),
        ("1", GREEDY),
        ("2", CPSAT),
        ("2", GREEDY),
    ]
    for cpsat, greedy in (rows[0:2], rows[2:4]):
        # Both arms replay the same stream.
        for column in ("gangs admitted", "mixed admitted", "gang GPUs admitted"):
            assert _fraction(cpsat[column])[1] == _fraction(greedy[column])[1]
        assert _fraction(cpsat["singles placed"])[1] == _fraction(greedy["singles placed"])[1]
        assert greedy["rescued"] == "0"
        assert greedy["replanned"] == "-"
    for row in rows:
        admitted, arrived = _fraction(row["gangs admitted"])
        mixed_admitted, mixed = _fraction(row["mixed admitted"])
        gpus_admitted, gpus = _fraction(row["gang GPUs admitted"])
        assert 0 < admitted <= arrived
        assert mixed_admitted <= mixed <= arrived
        assert mixed_admitted <= admitted
        assert 4 * admitted <= gpus_admitted <= gpus  # 2+ members of 2+ GPUs
        assert int(row["rescued"]) <= admitted
        placed, singles = _fraction(row["singles placed"])
        assert placed <= singles
        for column in (
            "GPUs alloc % (time avg)",
            "unalloc % (end)",
            "frag % (avg)",
            "stranded % (avg)",
            "free on partial nodes % (avg)",
        ):
            assert 0 <= float(row[column]) <= 100
        assert float(row["mean gang wait s"]) >= 0
        assert int(row["solves"]) >= 0
        assert float(row["solve s"]) >= 0


def test_json_matches_the_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(_argv(tmp_path)) == 0
    table = capsys.readouterr().out.splitlines()[2:]
    assert main(_argv(tmp_path, "-o", "json")) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["nodes"], doc["gpus"], doc["members"], doc["load"]) == (12, 80, [2, 4], 1.5)
    assert [run["seed"] for run in doc["runs"]] == [1, 2]
    arms = [arm for run in doc["runs"] for arm in run["arms"]]
    assert len(arms) == len(table)
    for arm, line in zip(arms, table, strict=True):
        row = dict(zip(COLUMNS, line.split(), strict=True))
        assert row["arm"] == arm["arm"]
        gangs = arm["gangs"]
        assert row["gangs admitted"] == f"{gangs['admitted']}/{gangs['arrived']}"
        assert gangs["admitted"] + gangs["givenUp"] == gangs["arrived"]
        assert len(arm["admittedGangs"]) == gangs["admitted"]
        assert sum(arm["statuses"].values()) == arm["solves"] == int(row["solves"])


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--churn", "1.2"], "--gangs does not take --churn"),
        (["--mixed-share", "1.5"], "--mixed-share SHARE must be in 0..1"),
    ],
)
def test_refusals(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    assert main(_argv(tmp_path, *extra)) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == f"lattice simulate: {message}\n"


def test_gangs_need_durations(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes, tasks, _ = _files(tmp_path)
    argv = ["simulate", "--gangs", "--nodes", str(nodes), "--tasks", str(tasks)]
    assert main(argv) == 2
    assert "--durations" in capsys.readouterr().err


@pytest.mark.parametrize("members", ["1-4", "5-3", "two"])
def test_bad_member_ranges_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], members: str
) -> None:
    with pytest.raises(SystemExit) as info:
        main([*_argv(tmp_path), "--gang-members", members])
    assert info.value.code == 2
    assert "--gang-members" in capsys.readouterr().err


def test_shuffle_keeps_the_gangs_and_changes_the_order(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    docs = []
    for extra in ((), ("--shuffle",)):
        assert main(_argv(tmp_path, *extra, "-o", "json")) == 0
        docs.append(json.loads(capsys.readouterr().out))
    plain, shuffled = docs
    assert (plain["shuffle"], shuffled["shuffle"]) == (False, True)
    for a, b in zip(plain["runs"], shuffled["runs"], strict=True):
        assert (a["items"], a["gangs"], a["mixedGangs"]) == (
            b["items"],
            b["gangs"],
            b["mixedGangs"],
        )
    names = [
        sorted(arm["admittedGangs"]) for doc in docs for run in doc["runs"] for arm in run["arms"]
    ]
    assert names[: len(names) // 2] != names[len(names) // 2 :]
