"""Pure parts of the devcluster: cache keys and node profiles."""

from __future__ import annotations

from pathlib import Path

import pytest

from lattice_dev.devcluster import build
from lattice_dev.devcluster.profiles import PROFILES, get_profile, node_name


def _module(root: Path, main: str) -> Path:
    (root / "cmd" / "x").mkdir(parents=True)
    (root / "go.mod").write_text("module example\n")
    (root / "cmd" / "x" / "main.go").write_text(main)
    return root


def test_cache_key_names_versions_and_changes_with_the_module(tmp_path: Path) -> None:
    a = build.cache_key(_module(tmp_path / "a", "package main\n"))
    b = build.cache_key(_module(tmp_path / "b", "package main\n"))
    c = build.cache_key(_module(tmp_path / "c", "package main // changed\n"))
    assert a == b
    assert a != c
    assert a.startswith(f"k8s-{build.KUBERNETES_VERSION}-etcd-{build.ETCD_VERSION}-kwok-")


def test_bin_dir_override_must_hold_every_binary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LATTICE_BIN_DIR", str(tmp_path))
    (tmp_path / "etcd").write_text("")
    with pytest.raises(build.BuildError, match="lacks kube-apiserver"):
        build.ensure_binaries()
    for name in build.ALL_BINARIES:
        (tmp_path / name).write_text("")
    assert build.ensure_binaries().kube_apiserver == tmp_path / "kube-apiserver"


def test_missing_module_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LATTICE_E2E_DIR", str(tmp_path))
    with pytest.raises(build.BuildError, match="control-plane Go module not found"):
        build.module_dir()


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_profiles_look_like_kubelet_registrations(name: str) -> None:
    body = get_profile(name).node_body(node_name(7), 7)
    assert body["metadata"]["name"] == "kwok-node-0007"
    labels = body["metadata"]["labels"]
    assert labels["kubernetes.io/hostname"] == "kwok-node-0007"
    assert labels["topology.kubernetes.io/zone"] == "zone-b"
    assert body["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"
    assert body["status"]["allocatable"] == body["status"]["capacity"]
    assert {"cpu", "memory", "pods"} <= set(body["status"]["capacity"])


def test_gpu_profile_has_gpus() -> None:
    assert get_profile("gpu-8x").capacity["nvidia.com/gpu"] == "8"
