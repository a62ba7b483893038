"""Build the control-plane binaries from Go modules, once per version.

The Go module under ``e2e/controlplane`` pins kube-apiserver, kube-scheduler and
etcd; kwok is installed by ``go install`` at a pinned version (its go.mod has no
replace directives). Binaries land in ``~/.cache/lattice/bin/<key>/`` where the
key names the versions and hashes the module files, so a warm run never
rebuilds and a changed pin never reuses a stale binary. A build goes to a
temporary folder and is renamed into place, under a file lock, so an
interrupted or concurrent build never leaves a half-filled cache.

helm (for the chart in ``charts/lattice``) is built the same way but on its own,
by ``go install`` into ``~/.cache/lattice/bin/helm-<version>/``: a new helm pin
builds helm alone and never the control plane.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

KUBERNETES_VERSION = "v1.34.4"
ETCD_VERSION = "v3.6.4"
KWOK_VERSION = "v0.7.0"
KWOK_MODULE = "sigs.k8s.io/kwok/cmd/kwok"
HELM_VERSION = "v3.22.0"
HELM_MODULE = "helm.sh/helm/v3"

CONTROL_PLANE_BINARIES = (
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "etcd",
    "kubectl",
)
CACHED_BINARIES = (*CONTROL_PLANE_BINARIES, "kwok")
"""What one control-plane cache folder holds."""
ALL_BINARIES = (*CACHED_BINARIES, "helm")
"""What a ``LATTICE_BIN_DIR`` folder must hold."""

Progress = Callable[[str], None]


class BuildError(RuntimeError):
    """A binary could not be built; the message says which and where the log is."""


@dataclass(frozen=True)
class Binaries:
    """Paths of the built binaries."""

    directory: Path
    helm_directory: Path | None = None
    """Where helm is, if not in ``directory`` (it has a cache folder of its own)."""

    def path(self, name: str) -> Path:
        return self.directory / name

    @property
    def kube_apiserver(self) -> Path:
        return self.path("kube-apiserver")

    @property
    def kube_controller_manager(self) -> Path:
        return self.path("kube-controller-manager")

    @property
    def kube_scheduler(self) -> Path:
        return self.path("kube-scheduler")

    @property
    def etcd(self) -> Path:
        return self.path("etcd")

    @property
    def kubectl(self) -> Path:
        return self.path("kubectl")

    @property
    def kwok(self) -> Path:
        return self.path("kwok")

    @property
    def helm(self) -> Path:
        return (self.helm_directory or self.directory) / "helm"


def cache_root() -> Path:
    """Root of Lattice's cache, outside the repo (``LATTICE_CACHE_DIR`` overrides)."""
    env = os.environ.get("LATTICE_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "lattice"


def checkout_path(*parts: str) -> Path:
    """A file of the source checkout: the devcluster and demo are developer tools that
    build from and apply files of the repository, which a wheel does not carry."""
    path = Path(__file__).resolve().parents[2].joinpath(*parts)
    if not path.exists():
        raise BuildError(
            f"{'/'.join(parts)} not found at {path}: `lattice devcluster` and `lattice demo` "
            "are developer tools that need a Lattice source checkout (clone the repository "
            "and `pip install -e .` there)"
        )
    return path


def module_dir() -> Path:
    """The Go module that pins the control plane (``LATTICE_E2E_DIR`` overrides)."""
    env = os.environ.get("LATTICE_E2E_DIR")
    path = Path(env) if env else Path(__file__).resolve().parents[2] / "e2e" / "controlplane"
    if not (path / "go.mod").is_file():
        raise BuildError(
            f"control-plane Go module not found at {path}; run from a Lattice checkout "
            "or set LATTICE_E2E_DIR"
        )
    return path


def cache_key(module: Path) -> str:
    """Versions plus a hash of the module files: a new pin means a new folder."""
    digest = hashlib.sha256()
    for rel in sorted(str(p.relative_to(module)) for p in module.rglob("*") if p.is_file()):
        digest.update(rel.encode())
        digest.update((module / rel).read_bytes())
    digest.update(KWOK_VERSION.encode())
    versions = f"k8s-{KUBERNETES_VERSION}-etcd-{ETCD_VERSION}-kwok-{KWOK_VERSION}"
    return f"{versions}-{digest.hexdigest()[:10]}"


def helm_dir() -> Path:
    """helm's cache folder: keyed by its version alone."""
    return cache_root() / "bin" / f"helm-{HELM_VERSION}"


def _print(msg: str) -> None:
    print(f"[lattice build] {msg}", file=sys.stderr, flush=True)


def _run_go(
    args: list[str], cwd: Path, env: dict[str, str], log: Path, what: str, progress: Progress
) -> None:
    """Run a go command, streaming -v package names to a log and a heartbeat to the user."""
    start = time.monotonic()
    count = 0
    with log.open("a") as out:
        out.write(f"$ {' '.join(args)}\n")
        out.flush()
        proc = subprocess.Popen(
            args, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        assert proc.stdout is not None
        stop = threading.Event()

        def heartbeat() -> None:
            while not stop.wait(30):
                progress(f"  {what}: {int(time.monotonic() - start)}s, {count} packages so far")

        beat = threading.Thread(target=heartbeat, daemon=True)
        beat.start()
        try:
            for line in proc.stdout:
                out.write(line)
                count += 1
            rc = proc.wait()
        finally:
            stop.set()
    if rc != 0:
        tail = "".join(log.read_text().splitlines(keepends=True)[-25:])
        raise BuildError(f"building {what} failed (exit {rc}); full log: {log}\n{tail}")
    progress(f"  {what}: done in {int(time.monotonic() - start)}s")


def ensure_binaries(progress: Progress = _print) -> Binaries:
    """Return built binaries, building them first if this version is not cached.

    ``LATTICE_BIN_DIR`` points at a folder of prebuilt binaries (helm included) and
    skips building.
    """
    override = os.environ.get("LATTICE_BIN_DIR")
    if override:
        bins = Binaries(Path(override))
        missing = [n for n in ALL_BINARIES if not bins.path(n).is_file()]
        if missing:
            raise BuildError(f"LATTICE_BIN_DIR={override} lacks {', '.join(missing)}")
        return bins

    module = module_dir()
    target = cache_root() / "bin" / cache_key(module)
    bins = Binaries(target, helm_directory=helm_dir())
    if not all(bins.path(n).is_file() for n in CACHED_BINARIES):
        with _build_lock(target.parent):
            if not all(bins.path(n).is_file() for n in CACHED_BINARIES):
                _build(module, target, progress)  # else another process built it meanwhile
    ensure_helm(progress)
    return bins


def ensure_helm(progress: Progress = _print) -> Path:
    """Return the path of helm, building it first if this version is not cached."""
    override = os.environ.get("LATTICE_BIN_DIR")
    if override:
        path = Path(override) / "helm"
        if not path.is_file():
            raise BuildError(f"LATTICE_BIN_DIR={override} lacks helm")
        return path
    target = helm_dir()
    path = target / "helm"
    if path.is_file():
        return path
    with _build_lock(target.parent):
        if not path.is_file():
            _build_helm(target, progress)
    return path


@contextlib.contextmanager
def _build_lock(bin_root: Path) -> Iterator[None]:
    """One build at a time per cache (two Go builds on 2 cores only slow each other)."""
    if shutil.which("go") is None:
        raise BuildError(
            "Go is needed once to build the control plane and helm; `go` is not on PATH"
        )
    bin_root.mkdir(parents=True, exist_ok=True)
    with (bin_root / ".build.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _build(module: Path, target: Path, progress: Progress) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="build-", dir=target.parent))
    log = target.parent / f"{target.name}.build.log"
    log.write_text("")
    env = {**os.environ, "GOFLAGS": "-mod=readonly -trimpath -buildvcs=false"}
    env.setdefault("GOPROXY", "https://proxy.golang.org,direct")
    stamp = " ".join(
        [
            "-s -w",
            f"-X k8s.io/component-base/version.gitVersion={KUBERNETES_VERSION}",
            "-X k8s.io/component-base/version.gitMajor=1",
            f"-X k8s.io/component-base/version.gitMinor={KUBERNETES_VERSION.split('.')[1]}",
            "-X k8s.io/component-base/version.gitTreeState=clean",
        ]
    )
    progress(
        f"building the control plane once (Kubernetes {KUBERNETES_VERSION}, "
        f"etcd {ETCD_VERSION}, kwok {KWOK_VERSION}) into {target}; a cold build takes "
        f"10-25 minutes on 2 cores, log: {log}"
    )
    started = time.monotonic()
    try:
        _run_go(["go", "mod", "download"], module, env, log, "module download", progress)
        _run_go(
            [
                "go",
                "build",
                "-v",
                "-ldflags",
                stamp,
                "-o",
                str(tmp) + "/",
                *(f"./cmd/{n}" for n in CONTROL_PLANE_BINARIES),
            ],
            module,
            env,
            log,
            ", ".join(CONTROL_PLANE_BINARIES),
            progress,
        )
        kwok_env = {**env, "GOBIN": str(tmp), "GOFLAGS": "-trimpath"}
        _run_go(
            ["go", "install", "-v", "-ldflags", "-s -w", f"{KWOK_MODULE}@{KWOK_VERSION}"],
            tmp,
            kwok_env,
            log,
            "kwok",
            progress,
        )
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    progress(f"control plane built in {int(time.monotonic() - started)}s")


def _helm_kube_minor(env: dict[str, str], log: Path) -> str:
    """The Kubernetes minor helm's own Makefile stamps in: that of the client-go it builds
    with. It is the version `helm template` and `helm lint` assume without a cluster."""
    args = ["go", "mod", "download", "-json", f"{HELM_MODULE}@{HELM_VERSION}"]
    out = subprocess.run(
        args, cwd=tempfile.gettempdir(), env=env, capture_output=True, text=True, check=False
    )
    with log.open("a") as f:
        f.write(f"$ {' '.join(args)}\n{out.stdout}{out.stderr}")
    if out.returncode != 0:
        raise BuildError(f"downloading {HELM_MODULE}@{HELM_VERSION} failed; log: {log}")
    go_mod_path = json.loads(out.stdout)["GoMod"]
    found = re.search(
        r"^\s*k8s\.io/client-go v0\.(\d+)\.", Path(go_mod_path).read_text(), re.MULTILINE
    )
    if found is None:
        raise BuildError(f"no k8s.io/client-go requirement in {go_mod_path}")
    return found.group(1)


def _build_helm(target: Path, progress: Progress) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="build-helm-", dir=target.parent))
    log = target.parent / f"{target.name}.build.log"
    log.write_text("")
    env = {**os.environ, "GOFLAGS": "-trimpath", "CGO_ENABLED": "0", "GOBIN": str(tmp)}
    env.setdefault("GOPROXY", "https://proxy.golang.org,direct")
    progress(
        f"building helm {HELM_VERSION} once into {target}; takes 2-6 minutes on 2 cores, log: {log}"
    )
    started = time.monotonic()
    try:
        minor = _helm_kube_minor(env, log)
        pkg = HELM_MODULE
        stamp = " ".join(
            [
                "-s -w",
                f"-X {pkg}/internal/version.version={HELM_VERSION}",
                f"-X {pkg}/internal/version.gitTreeState=clean",
                f"-X {pkg}/pkg/lint/rules.k8sVersionMajor=1",
                f"-X {pkg}/pkg/lint/rules.k8sVersionMinor={minor}",
                f"-X {pkg}/pkg/chartutil.k8sVersionMajor=1",
                f"-X {pkg}/pkg/chartutil.k8sVersionMinor={minor}",
            ]
        )
        _run_go(
            ["go", "install", "-v", "-ldflags", stamp, f"{HELM_MODULE}/cmd/helm@{HELM_VERSION}"],
            tmp,
            env,
            log,
            "helm",
            progress,
        )
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    progress(f"helm built in {int(time.monotonic() - started)}s")
