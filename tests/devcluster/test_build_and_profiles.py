"""Pure parts of the devcluster: cache keys and node profiles."""

from __future__ import annotations

from pathlib import Path

import pytest

from lattice_dev.devcluster import build
from lattice_dev.devcluster.profiles import PROFILES, get_profile, node_name


def _module(root: Path, main: str, old_pin: str = "v0.35.4") -> Path:
    (root / "cmd" / "x").mkdir(parents=True)
    (root / "go.mod").write_text("module example\nrequire go.etcd.io/etcd/server/v3 v3.7.0\n")
    (root / "go.sum").write_text("")
    old = root / "kubernetes-v1.35.4.mod"
    old.write_text(f"module example\nrequire go.etcd.io/etcd/server/v3 v3.6.5\n// {old_pin}\n")
    old.with_suffix(".sum").write_text("")
    (root / "cmd" / "x" / "main.go").write_text(main)
    return root


def test_cache_key_names_versions_and_changes_with_the_module(tmp_path: Path) -> None:
    a = build.cache_key(_module(tmp_path / "a", "package main\n"), build.DEFAULT_KUBERNETES)
    b = build.cache_key(_module(tmp_path / "b", "package main\n"), build.DEFAULT_KUBERNETES)
    c = build.cache_key(
        _module(tmp_path / "c", "package main // changed\n"), build.DEFAULT_KUBERNETES
    )
    assert a == b
    assert a != c
    assert a.startswith(f"k8s-{build.DEFAULT_KUBERNETES}-etcd-v3.7.0-kwok-{build.KWOK_VERSION}-")


def test_each_release_has_its_own_key_unmoved_by_another_release_pin(tmp_path: Path) -> None:
    a = _module(tmp_path / "a", "package main\n")
    b = _module(tmp_path / "b", "package main\n", old_pin="changed")
    assert build.cache_key(a, build.DEFAULT_KUBERNETES) == build.cache_key(
        b, build.DEFAULT_KUBERNETES
    )
    assert build.cache_key(a, "v1.35.4") != build.cache_key(b, "v1.35.4")
    assert build.cache_key(a, "v1.35.4").startswith("k8s-v1.35.4-etcd-v3.6.5-")
    assert build.modfile_flags(a, build.DEFAULT_KUBERNETES) == ""
    assert build.modfile_flags(a, "v1.35.4") == f" -modfile={a / 'kubernetes-v1.35.4.mod'}"


@pytest.mark.parametrize(
    ("wanted", "version"), [("1.36", "v1.36.3"), ("v1.35.4", "v1.35.4"), ("1.37.2", "v1.37.2")]
)
def test_release_names(wanted: str, version: str) -> None:
    assert build.resolve_kubernetes(wanted) == version


def test_release_defaults_to_env_then_newest(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(build.KUBERNETES_ENV, raising=False)
    assert build.kubernetes_version() == build.DEFAULT_KUBERNETES == build.SUPPORTED_KUBERNETES[-1]
    monkeypatch.setenv(build.KUBERNETES_ENV, "1.36")
    assert build.kubernetes_version() == "v1.36.3"


@pytest.mark.parametrize("wanted", ["1.34", "v1.34.4", "1.37.1", "latest"])
def test_unsupported_release_is_a_clear_error(wanted: str) -> None:
    with pytest.raises(build.BuildError, match="not a supported release"):
        build.resolve_kubernetes(wanted)


def test_every_supported_release_has_its_module_file() -> None:
    module = build.module_dir()
    for version in build.SUPPORTED_KUBERNETES:
        mod = build.modfile(module, version)
        assert f"k8s.io/kubernetes {version}" in mod.read_text()
        assert mod.with_suffix(".sum").is_file()


def test_bin_dir_override_must_hold_every_binary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LATTICE_BIN_DIR", str(tmp_path))
    (tmp_path / "etcd").write_text("")
    with pytest.raises(build.BuildError, match="lacks kube-apiserver"):
        build.ensure_binaries()
    for name in build.ALL_BINARIES:
        (tmp_path / name).write_text("")
    (tmp_path / build.KWOK_STAGES_FILE).write_text("")
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


def test_null_binder_is_keyed_apart_from_the_control_plane(tmp_path: Path) -> None:
    """The benchmark's null binder changes its own key, never the plane's (nor its kubelet's)."""
    a = _module(tmp_path / "a", "package main\n")
    before = build.cache_key(a, build.DEFAULT_KUBERNETES)
    tool = a / "cmd" / build.NULL_BINDER
    tool.mkdir()
    (tool / "main.go").write_text("package main\n")
    first = build.null_binder_key(a, build.DEFAULT_KUBERNETES)
    assert build.cache_key(a, build.DEFAULT_KUBERNETES) == before
    (tool / "main.go").write_text("package main // changed\n")
    assert build.cache_key(a, build.DEFAULT_KUBERNETES) == before
    assert build.null_binder_key(a, build.DEFAULT_KUBERNETES) != first
    assert first.startswith(f"nullbinder-{build.DEFAULT_KUBERNETES}-")
    assert build.null_binder_key(a, "v1.35.4").startswith("nullbinder-v1.35.4-")
