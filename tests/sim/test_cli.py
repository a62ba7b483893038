"""`lattice simulate`: flags, the table, JSON, the plot and one-line refusals."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from scheduler.cli import main
from scheduler.sim import POLICY_NAMES, plot
from tests.sim.traces import DEFAULT_HEADER, node_item, pod_item, tiny, write_csv, write_dump


def simulate(*args: str | Path) -> int:
    return main(["simulate", *(str(a) for a in args), "--no-progress"])


def test_help_lists_the_flags() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "scheduler.cli", "simulate", "--help"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    assert out.startswith("usage: lattice simulate")
    for flag in ("--nodes", "--tasks", "--dump", "--until-demand", "--deletions", "--policies"):
        assert flag in out
    for flag in ("--seed", "--plot", "--output", "--no-progress"):
        assert flag in out


def test_run_on_the_tiny_trace_prints_the_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes, tasks = tiny(tmp_path)
    assert simulate("--nodes", nodes, "--tasks", tasks) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[0].startswith("tasks: 3 nodes, 18 GPUs; 5 of 5 tasks arrived (15 GPUs asked")
    assert "1 GPU-sharing tasks skipped" in lines[0]
    assert lines[1].split() == [
        "policy",
        "unallocated",
        "GPU",
        "%",
        "GPU",
        "tasks",
        "multi-GPU",
        "CPU-only",
        "ms/task",
    ]
    rows = {line.split()[0]: line.split()[1:] for line in lines[2:]}
    assert list(rows) == list(POLICY_NAMES)
    # Spreading puts the 1-GPU task on a big node, so everything fits (15 of 18 GPUs);
    # packing puts it on the small T4 node, where the T4-only 2-GPU task then has no room.
    assert rows["kube-default"][:4] == ["16.67", "4/4", "3/3", "1/1"]
    assert rows["kube-mostallocated"][:4] == ["27.78", "3/4", "2/3", "1/1"]
    assert len(rows["lattice"]) == 5
    assert err == ""


def test_json_output_has_the_curves(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes, tasks = tiny(tmp_path)
    code = simulate(
        "--nodes",
        nodes,
        "--tasks",
        tasks,
        "-o",
        "json",
        "--policies",
        "kube-default",
        "--until-demand",
        "50",
        "--seed",
        "4",
        "--deletions",
    )
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["gpus"], doc["skipped"], doc["seed"], doc["deletions"]) == (18, 1, 4, True)
    assert doc["untilDemandPercent"] == 50
    (policy,) = doc["policies"]
    assert policy["policy"] == "kube-default"
    # 1 + 2 + 0 + 8 GPUs reach 50 % of 18 with the fourth task.
    assert policy["gpuTasks"] == {"arrived": 3, "placed": 3}
    assert policy["cpuTasks"] == {"arrived": 1, "placed": 1}
    assert policy["curve"][0] == [0.0, 100.0]
    assert policy["curve"][-1][0] == 61.0


def test_plot_writes_a_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes, tasks = tiny(tmp_path)
    out = tmp_path / "fgd.png"
    assert simulate("--nodes", nodes, "--tasks", tasks, "--plot", out) == 0
    assert out.read_bytes().startswith(b"\x89PNG")
    assert out.stat().st_size > 5000
    assert "kube-mostallocated" in capsys.readouterr().out


def test_dump_is_replayed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dump = write_dump(
        tmp_path / "cluster.json",
        [
            node_item("n1", gpus=8),
            node_item("n2", gpus=8),
            pod_item("existing", node="n1", gpus=4, phase="Running"),
            pod_item("new", gpus=8),
        ],
    )
    assert simulate("--dump", dump, "-o", "json", "--until-demand", "200") == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["trace"] == "cluster"
    for policy in doc["policies"]:
        assert policy["gpuTasks"] == {"arrived": 1, "placed": 1}
        assert policy["unallocatedGpuPercent"] == 25.0
        assert policy["curve"][0] == [0.0, 75.0]


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--nodes", "N"], 2, "give --nodes and --tasks"),
        (["--dump", "D", "--nodes", "N"], 2, "give either --dump or --nodes and --tasks"),
        (["--dump", "absent.json"], 1, "absent.json: cannot read"),
        (["--nodes", "N", "--tasks", "BAD"], 1, "bad.csv:3: column 'num_gpu': not an integer"),
        (["--nodes", "N", "--tasks", "T", "--deletions", "--tasks", "MULTI"], 1, "creation times"),
    ],
)
def test_refusals_are_one_line_without_traceback(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    code: int,
    message: str,
) -> None:
    nodes, tasks = tiny(tmp_path)
    bad = write_csv(tmp_path / "bad.csv", DEFAULT_HEADER, ["t,1,1,0,0,,,,,,", "u,1,1,two,0,,,,,,"])
    multi = write_csv(
        tmp_path / "multi.csv", "name,cpu_milli,memory_mib,num_gpu,gpu_milli", ["t,1,1,1,1000"]
    )
    paths = {"N": nodes, "T": tasks, "BAD": bad, "MULTI": multi, "D": tmp_path / "d.json"}
    argv = [str(paths.get(a, tmp_path / a if a.endswith(".json") else a)) for a in args]
    assert simulate(*argv) == code
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("lattice simulate: ")
    assert message in err
    assert err.count("\n") == 1
    assert "Traceback" not in err


def test_a_plot_that_cannot_be_written_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes, tasks = tiny(tmp_path)
    for target in (tmp_path / "missing" / "fgd.png", tmp_path / "fgd.unknown"):
        assert simulate("--nodes", nodes, "--tasks", tasks, "--plot", target) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"lattice simulate: cannot write {target}: ")
        assert err.count("\n") == 1


def test_bad_flags_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--until-demand", "0"], ["--policies", "fifo"], ["-o", "yaml"]):
        with pytest.raises(SystemExit) as info:
            simulate(*argv)
        assert info.value.code == 2
        assert "lattice simulate: error:" in capsys.readouterr().err


def test_plot_without_matplotlib_refuses_before_the_replay(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(plot, "available", lambda: False)
    nodes, tasks = tiny(tmp_path)
    assert simulate("--nodes", nodes, "--tasks", tasks, "--plot", tmp_path / "x.png") == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert "lattice-scheduler[plot]" in err


def test_churn_replays_the_tasks_with_waiting_and_reports_waits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes, tasks = tiny(tmp_path)  # the default-format tiny list has creation/deletion times
    argv = ("--nodes", nodes, "--tasks", tasks, "--durations", tasks, "--churn", "1.5")
    assert simulate(*argv, "--repeat", "3", "-o", "json") == 0
    out = json.loads(capsys.readouterr().out)
    assert out["deletions"] is True
    assert out["wait"] is True
    assert out["arrived"] == 3 * 5  # the list cycled three times, no demand limit
    for policy in out["policies"]:
        assert (
            sum(len(w) for w in policy["waits"].values()) + sum(policy["stillWaiting"].values())
            == policy["gpuTasks"]["arrived"] + policy["cpuTasks"]["arrived"]
        )
        assert policy["allocatedGpuPercentOverTime"] > 0
    assert simulate("--nodes", nodes, "--tasks", tasks, "--churn", "1.5") == 2
    assert "--durations" in capsys.readouterr().err
