"""`lattice agent --once --dry-run`: the printed object parses and has the right shape."""

from __future__ import annotations

import argparse
import itertools
import json
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from scheduler.agent import runner
from scheduler.agent.load import CpuTimes, LoadSample, read_sample
from scheduler.agent.main import add_arguments, run
from scheduler.agent.sysfs import Notes
from scheduler.model.topology import API_VERSION, KIND, NodeTopology, NodeTopologyStatus
from tests.agent.crd_schema import object_schema, validate
from tests.agent.trees import BROKEN, TWO_SOCKET, roots


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser(prog="lattice agent")
    add_arguments(parser)
    code = run(parser.parse_args(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _fixture_args(name: str) -> list[str]:
    sysfs, procfs = roots(name)
    return [
        "--sysfs-root", str(sysfs), "--procfs-root", str(procfs),
        "--once", "--dry-run", "--sample-interval", "0.01",
    ]  # fmt: skip


@pytest.fixture
def ticking_stat(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fixture's /proc/stat is a photograph; make each read one more second, 30 % busy."""
    reads = itertools.count()

    def read(procfs_root: Path, notes: Notes, *, time: datetime, monotonic: float) -> LoadSample:
        sample = read_sample(procfs_root, notes, time=time, monotonic=monotonic)
        if sample.cpu is None:
            return sample
        ticks = next(reads) * 100 * sample.cpu.online_cpus
        cpu = CpuTimes(
            busy=sample.cpu.busy + ticks * 3 // 10,
            total=sample.cpu.total + ticks,
            online_cpus=sample.cpu.online_cpus,
        )
        return replace(sample, cpu=cpu)

    monkeypatch.setattr("scheduler.agent.runner.read_sample", read)


@pytest.mark.parametrize(
    ("fmt", "load"),
    [pytest.param("yaml", yaml.safe_load, id="yaml"), pytest.param("json", json.loads, id="json")],
)
@pytest.mark.usefixtures("ticking_stat")
def test_dry_run_prints_the_object(fmt: str, load: Any, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(["--node-name", "gpu-7", *_fixture_args(TWO_SOCKET), "-o", fmt], capsys)
    assert code == 0
    obj = load(out)
    assert obj["apiVersion"] == API_VERSION
    assert obj["kind"] == KIND
    assert obj["metadata"]["name"] == "gpu-7"
    assert set(obj) == {"apiVersion", "kind", "metadata", "spec", "status"}
    topology = NodeTopology.from_spec(obj["spec"])
    assert (len(topology.numa_nodes), len(topology.gpus), topology.cpu_count) == (2, 8, 96)
    status = NodeTopologyStatus.from_status(obj["status"])
    assert status.pressure is not None
    assert status.pressure.cpu is not None
    assert status.load is not None
    assert (status.load.samples, status.load.cpu_capacity_milli) == (2, 96000)
    assert status.load.cpu_used_milli == 28800
    assert status.load.mem_capacity_bytes == 1056403352 * 1024
    assert (obj["status"]["load"]["cpuPercent"], obj["status"]["load"]["memoryPercent"]) == (30, 25)
    assert "warnings" not in obj["status"]
    assert validate(obj, object_schema()) == []


def test_dry_run_of_a_still_stat_has_no_load_and_says_why(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = _run(["--node-name", "n", *_fixture_args(TWO_SOCKET), "-o", "json"], capsys)
    assert code == 0
    status = json.loads(out)["status"]
    assert "load" not in status
    assert any("did not advance" in w for w in status["warnings"])


@pytest.mark.parametrize(
    "flags",
    [
        pytest.param(["--report-interval", "0.5"], id="report-below-1s"),
        pytest.param(["--sample-interval", "0"], id="sample-zero"),
        pytest.param(["--sample-interval", "30"], id="sample-above-report"),
        pytest.param(["--interval", "0"], id="topology-zero-old-name"),
        pytest.param(["--topology-interval", "-5"], id="topology-negative"),
    ],
)
def test_bad_intervals_are_refused(flags: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(["--node-name", "n", "--once", "--dry-run", *flags], capsys)
    assert (code, out) == (2, "")
    assert "interval" in err


def test_interval_flags(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: list[runner.AgentSettings] = []

    async def publish(settings: runner.AgentSettings, *, once: bool) -> int:
        seen.append(settings)
        return 0

    monkeypatch.setattr("scheduler.agent.main._publish", publish)
    argv = ["--node-name", "n", "--interval", "120", "--report-interval", "5"]
    code, _, err = _run([*argv, "--sample-interval", "1"], capsys)
    assert code == 0
    (settings,) = seen
    assert (
        settings.topology_interval_seconds,
        settings.report_interval_seconds,
        settings.sample_interval_seconds,
    ) == (120, 5, 1)
    assert "advised minimum" in err  # 5 s reports: allowed, with a warning

    code, _, err = _run(["--node-name", "n"], capsys)
    assert (seen[-1].report_interval_seconds, seen[-1].sample_interval_seconds) == (15, 5)
    assert seen[-1].topology_interval_seconds == 60
    assert "advised minimum" not in err


def test_node_name_from_environment(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("NODE_NAME", "from-downward-api")
    code, out, _ = _run(_fixture_args(TWO_SOCKET), capsys)
    assert code == 0
    assert yaml.safe_load(out)["metadata"]["name"] == "from-downward-api"


def test_warnings_go_to_stderr_and_status(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(["--node-name", "n", *_fixture_args(BROKEN), "-o", "json"], capsys)
    assert code == 0
    obj = json.loads(out)  # stdout holds only the document
    assert any("dangling" in w for w in obj["status"]["warnings"])
    assert "dangling" in err


def test_kubelet_config_flag(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("kind: KubeletConfiguration\ntopologyManagerPolicy: restricted\n")
    argv = ["--node-name", "n", *_fixture_args(TWO_SOCKET), "--kubelet-config", str(config)]
    _, out, _ = _run(argv, capsys)
    assert yaml.safe_load(out)["spec"]["kubelet"]["topologyManagerPolicy"] == "restricted"


def test_publishing_needs_a_node_name(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    code, out, err = _run(["--once"], capsys)
    assert code == 2
    assert out == ""
    assert "no node name" in err


def test_this_machine_dry_run(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--node-name", "here", "--once", "--dry-run", "-o", "json", "--sample-interval", "0.2"]
    code, out, _ = _run(argv, capsys)
    assert code == 0
    obj = json.loads(out)
    assert obj["spec"]["summary"]["numaNodes"] >= 1
    assert obj["spec"]["summary"]["cpus"] >= 1
    load = obj["status"]["load"]  # two real samples 0.2 s apart
    assert load["samples"] == 2
    assert 0 <= load["cpu"]["usedMillicores"] <= load["cpu"]["capacityMillicores"]
    assert 0 < load["memory"]["usedBytes"] < load["memory"]["capacityBytes"]
    assert validate(obj, object_schema()) == []
