"""Small parsers: PSI lines, kubelet configuration, forgiving file reads."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler.agent.kubelet import read_kubelet_hints
from scheduler.agent.pressure import parse_pressure
from scheduler.agent.sysfs import Notes, read_int, read_text
from scheduler.model.topology import (
    CpuManagerPolicy,
    KubeletHints,
    MemoryManagerPolicy,
    TopologyManagerPolicy,
    TopologyManagerScope,
)


def test_parse_pressure_some_and_full() -> None:
    p = parse_pressure(
        "some avg10=66.54 avg60=61.24 avg300=42.23 total=204905145\n"
        "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
    )
    assert (p.some.avg10, p.some.avg60, p.some.avg300, p.some.total_us) == (
        66.54, 61.24, 42.23, 204905145,
    )  # fmt: skip
    assert p.full is not None
    assert p.full.total_us == 0


def test_parse_pressure_cpu_before_5_13_has_no_full_line() -> None:
    p = parse_pressure("some avg10=0.00 avg60=0.00 avg300=0.00 total=7\n")
    assert p.full is None


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("", id="empty"),
        pytest.param("full avg10=0.00 avg60=0.00 avg300=0.00 total=0", id="only-full"),
        pytest.param("some avg10=x avg60=0.00 avg300=0.00 total=0", id="garbage-number"),
        pytest.param("some avg10=0.00 avg60=0.00 total=0", id="missing-field"),
    ],
)
def test_parse_pressure_rejects(text: str) -> None:
    with pytest.raises(ValueError, match=r"PSI|some"):
        parse_pressure(text)


@pytest.mark.parametrize(
    ("config", "hints", "warning"),
    [
        pytest.param(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"
            "topologyManagerPolicy: single-numa-node\ntopologyManagerScope: pod\n"
            "cpuManagerPolicy: static\nmemoryManagerPolicy: Static\n",
            KubeletHints(
                TopologyManagerPolicy.SINGLE_NUMA_NODE,
                TopologyManagerScope.POD,
                CpuManagerPolicy.STATIC,
                MemoryManagerPolicy.STATIC,
            ),
            None,
            id="all-set",
        ),
        pytest.param(
            "kind: KubeletConfiguration\n",
            KubeletHints(
                TopologyManagerPolicy.NONE,
                TopologyManagerScope.CONTAINER,
                CpuManagerPolicy.NONE,
                MemoryManagerPolicy.NONE,
            ),
            None,
            id="kubelet-defaults",
        ),
        pytest.param(
            "kind: KubeletConfiguration\ntopologyManagerPolicy: sometimes\n",
            KubeletHints(
                None,
                TopologyManagerScope.CONTAINER,
                CpuManagerPolicy.NONE,
                MemoryManagerPolicy.NONE,
            ),
            "unknown topologyManagerPolicy",
            id="unknown-policy",
        ),
        pytest.param("kind: Pod\n", None, "not a KubeletConfiguration", id="wrong-kind"),
        pytest.param("[unclosed", None, "not YAML", id="not-yaml"),
    ],
)
def test_kubelet_hints(
    tmp_path: Path, config: str, hints: KubeletHints | None, warning: str | None
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(config)
    notes = Notes()
    assert read_kubelet_hints(path, notes) == hints
    if warning is None:
        assert notes.items == ()
    else:
        assert any(warning in w for w in notes.items), notes.items


def test_kubelet_config_missing(tmp_path: Path) -> None:
    notes = Notes()
    assert read_kubelet_hints(tmp_path / "absent.yaml", notes) is None
    assert any("missing" in w for w in notes.items)


def test_forgiving_reads(tmp_path: Path) -> None:
    notes = Notes()
    (tmp_path / "hex").write_text("0x10de\n")
    (tmp_path / "dir").mkdir()
    assert read_int(tmp_path / "hex", notes, base=16) == 0x10DE
    assert read_int(tmp_path / "hex", notes) is None
    assert read_text(tmp_path / "dir", notes) is None
    assert read_text(tmp_path / "absent", notes, missing_ok=True) is None
    assert read_text(tmp_path / "absent", notes) is None
    assert read_text(tmp_path / "absent", notes) is None  # same warning once
    assert len(notes.items) == 3
