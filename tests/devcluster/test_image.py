"""The image users deploy, built from this checkout and run as a cluster runs it.

Built by the same code as ``just image`` (buildah on a local Debian base, cached by
content), then run with podman and runc: read-only root filesystem, no network.
A host that cannot build containers skips with one reason, except under CI, whose
machine can and must (it fails there instead).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from lattice_dev.devcluster.image import (
    Image,
    ImageError,
    ensure_image,
    prune_archives,
    run_args,
)
from scheduler import __version__

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def image() -> Image:
    try:
        return ensure_image(lambda msg: print(f"image: {msg}"))
    except ImageError as exc:
        if os.environ.get("CI") or os.geteuid() == 0:
            raise
        pytest.skip(f"cannot build container images on this host: {exc}")


def _run(
    image: Image, *args: str, entrypoint: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        run_args(image.ref, *args, entrypoint=entrypoint),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_version(image: Image) -> None:
    done = _run(image, "--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"lattice {__version__}"


def test_runs_as_65532_on_a_read_only_root(image: Image) -> None:
    config = json.loads(
        subprocess.run(
            ["podman", "image", "inspect", image.ref], capture_output=True, check=True
        ).stdout
    )[0]["Config"]
    assert config["User"] == "65532:65532"
    assert config["Entrypoint"] == ["lattice"]
    done = _run(image, "-c", "id -u; id -g; touch /opt/x", entrypoint="/bin/sh")
    lines = done.stdout.split()
    assert lines[:2] == ["65532", "65532"], done.stdout
    assert done.returncode != 0
    assert "Read-only file system" in done.stderr


@pytest.mark.parametrize("command", ["run", "agent", "explain", "simulate"])
def test_runtime_commands_start(image: Image, command: str) -> None:
    """Every runtime command imports what it needs from the image alone."""
    done = _run(image, command, "--help")
    assert done.returncode == 0, done.stderr
    assert "usage: lattice" in done.stdout


def test_solver_imports_in_the_image(image: Image) -> None:
    """CP-SAT (ortools, and through it pandas) loads and solves from the trimmed venv."""
    code = (
        "from ortools.sat.python import cp_model\n"
        "m = cp_model.CpModel(); x = m.new_int_var(0, 3, 'x'); m.maximize(x)\n"
        "s = cp_model.CpSolver(); assert s.solve(m) == cp_model.OPTIMAL\n"
        "print(s.value(x))\n"
    )
    done = _run(image, "-c", code, entrypoint="python3")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "3"


def test_dra_selectors_evaluate_in_the_image(image: Image) -> None:
    """The CEL library (a native wheel) loads from the image and judges a device."""
    code = (
        "from scheduler.core.dra.cel import SelectorCompiler\n"
        "from scheduler.core.dra.objects import Device\n"
        "d = Device.from_api({'name': 'g', 'attributes': {'model': {'string': 'A100'}}},"
        " driver='gpu.example.com', path='device')\n"
        "c = SelectorCompiler()\n"
        'print(d.matches(\'device.attributes["gpu.example.com"].model == "A100"\', c),'
        " d.matches('device.driver == \"other\"', c))\n"
    )
    done = _run(image, "-c", code, entrypoint="python3")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "False"]


def test_cached_by_content(image: Image) -> None:
    """A second build of the same checkout is the cached archive, not a rebuild."""
    before = image.archive.stat().st_mtime_ns
    again = ensure_image(lambda msg: pytest.fail(f"rebuilt on unchanged content: {msg}"))
    assert again.ref == image.ref
    assert again.archive == image.archive
    assert again.archive.stat().st_mtime_ns == before


def test_prune_keeps_the_newest_archives_and_the_current_one(tmp_path: Path) -> None:
    """A build deletes older archives (and their logs) but the newest few; the one it
    just built stays even when it is not the newest file (no image needed)."""
    keys = [f"{i:012x}" for i in range(6)]
    for i, key in enumerate(keys):
        archive = tmp_path / f"lattice-0.1.0-{key}.oci.tar"
        archive.write_bytes(b"x")
        (tmp_path / f"lattice-{key}.log").write_text("log")
        os.utime(archive, ns=(i * 10**9, i * 10**9))
    base = tmp_path / "base-bookworm-py3-0123456789.tar"
    base.write_bytes(b"b")
    current = tmp_path / f"lattice-0.1.0-{keys[0]}.oci.tar"
    pruned = prune_archives(tmp_path, current, keep=3)
    assert sorted(p.name for p in pruned) == [f"lattice-0.1.0-{k}.oci.tar" for k in keys[1:3]]
    left = sorted(p.name for p in tmp_path.iterdir())
    kept = [keys[0], *keys[3:]]
    assert left == sorted(
        [base.name]
        + [f"lattice-0.1.0-{k}.oci.tar" for k in kept]
        + [f"lattice-{k}.log" for k in kept]
    )
    assert prune_archives(tmp_path, current, keep=3) == []
