"""`lattice agent --once --dry-run`: the printed object parses and has the right shape."""

from __future__ import annotations

import argparse
import json
from typing import Any

import pytest
import yaml

from scheduler.agent.main import add_arguments, run
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
    return ["--sysfs-root", str(sysfs), "--procfs-root", str(procfs), "--once", "--dry-run"]


@pytest.mark.parametrize(
    ("fmt", "load"),
    [pytest.param("yaml", yaml.safe_load, id="yaml"), pytest.param("json", json.loads, id="json")],
)
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
    assert validate(obj, object_schema()) == []


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
    code, out, _ = _run(["--node-name", "here", "--once", "--dry-run", "-o", "json"], capsys)
    assert code == 0
    obj = json.loads(out)
    assert obj["spec"]["summary"]["numaNodes"] >= 1
    assert obj["spec"]["summary"]["cpus"] >= 1
    assert validate(obj, object_schema()) == []
