"""helm in the build cache: its own folder, keyed by its version, stamped like a release."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from lattice_dev.devcluster import build


def _fill(folder: Path, names: tuple[str, ...]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).write_text("")


def test_a_missing_helm_builds_helm_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LATTICE_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("LATTICE_BIN_DIR", raising=False)
    control_plane = tmp_path / "bin" / build.cache_key(build.module_dir())
    _fill(control_plane, build.CACHED_BINARIES)
    built: list[Path] = []

    def fake_helm_build(target: Path, progress: build.Progress) -> None:
        built.append(target)
        _fill(target, ("helm",))

    def no_control_plane_build(*_: object) -> None:
        raise AssertionError("the control plane was rebuilt for helm")

    monkeypatch.setattr(build, "_build_helm", fake_helm_build)
    monkeypatch.setattr(build, "_build", no_control_plane_build)
    bins = build.ensure_binaries(progress=lambda _: None)
    assert built == [tmp_path / "bin" / f"helm-{build.HELM_VERSION}"]
    assert bins.helm == built[0] / "helm"
    assert bins.kube_apiserver == control_plane / "kube-apiserver"
    build.ensure_binaries(progress=lambda _: None)
    assert len(built) == 1  # cached from now on


def test_bin_dir_override_must_hold_helm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LATTICE_BIN_DIR", str(tmp_path))
    with pytest.raises(build.BuildError, match="lacks helm"):
        build.ensure_helm()
    _fill(tmp_path, ("helm",))
    assert build.ensure_helm() == tmp_path / "helm"


def test_cached_helm_is_the_pinned_release(tmp_path: Path) -> None:
    helm = str(build.ensure_helm())
    version = subprocess.run(
        [helm, "version", "--template", "{{ .Version }}"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert version.stdout == build.HELM_VERSION
    # Without a cluster, helm assumes the Kubernetes of its client-go only if stamped at
    # build (as its Makefile does); unstamped it says 1.20, below the chart's kubeVersion.
    chart = tmp_path / "probe"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: probe\nversion: 0.0.1\n")
    (chart / "templates" / "v.yaml").write_text("minor: {{ .Capabilities.KubeVersion.Minor }}\n")
    out = subprocess.run(
        [helm, "template", "probe", str(chart)], capture_output=True, text=True, check=True
    )
    minor = int(out.stdout.rsplit("minor:", 1)[1].strip().strip('"'))
    assert minor >= 30
