"""Build the control-plane binaries from Go modules, once per version.

The Go module under ``e2e/controlplane`` pins kube-apiserver, kube-scheduler and
etcd: its ``go.mod`` at the default release (:data:`DEFAULT_KUBERNETES`), and one
``kubernetes-<version>.mod`` (with its ``.sum``) per other supported release, built with
``go build -modfile``. ``LATTICE_KUBERNETES`` (or ``lattice devcluster up
--kubernetes``) picks the release. kwok is installed by ``go install`` at a pinned
version (its go.mod has no replace directives). Binaries land in
``~/.cache/lattice/bin/<key>/`` where the key names the versions and hashes the
sources that release builds from, so a warm run never rebuilds and a changed pin
never reuses a stale binary. A build goes to a
temporary folder and is renamed into place, under a file lock, so an
interrupted or concurrent build never leaves a half-filled cache.

helm (for the chart in ``charts/lattice``) is built the same way but on its own,
by ``go install`` into ``~/.cache/lattice/bin/helm-<version>/``: a new helm pin
builds helm alone and never the control plane.

The benchmark's null binder (``cmd/nullbinder``, client-go from the same module file) is
a tool of the benchmark, not of the plane: it builds on its own into
``~/.cache/lattice/bin/nullbinder-<version>-<hash>/`` keyed by its source and the release's
module file, and is left out of the control plane's key, so changing it never rebuilds
the plane (nor the plane's kubelet).
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

SUPPORTED_KUBERNETES = ("v1.35.4", "v1.36.3", "v1.37.2")
"""The releases Lattice supports and tests: Kubernetes' three newest minors."""
DEFAULT_KUBERNETES = "v1.37.2"
KUBERNETES_ENV = "LATTICE_KUBERNETES"
"""Picks the release of the control plane: ``1.36``, ``1.36.3`` or ``v1.36.3``."""
KWOK_VERSION = "v0.8.0"
KWOK_MODULE = "sigs.k8s.io/kwok/cmd/kwok"
KWOK_STAGES = (
    "kustomize/stage/node/fast/node-initialize.yaml",
    "kustomize/stage/node/heartbeat/node-heartbeat.yaml",
    "kustomize/stage/pod/fast/pod-ready.yaml",
    "kustomize/stage/pod/fast/pod-complete.yaml",
    "kustomize/stage/pod/fast/pod-delete.yaml",
)
"""The stages kwok v0.7 applied by itself (nodes Ready with a heartbeat, kwok keeping their
Leases; pods Running, completed, deleted); v0.8 applies none unless given them."""
KWOK_STAGES_FILE = "kwok-stages.yaml"
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
NULL_BINDER = "nullbinder"
"""The benchmark's floor (``cmd/nullbinder``): built and keyed apart from the plane."""
BENCH_TOOLS = (NULL_BINDER,)
"""Folders of ``cmd/`` that are benchmark tools, not part of the control plane's key."""

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
    def kwok_stages(self) -> Path:
        return self.path(KWOK_STAGES_FILE)

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


def resolve_kubernetes(wanted: str | None = None) -> str:
    """The supported release ``wanted`` names (``1.36``, ``1.36.3``, ``v1.36.3``), else
    ``LATTICE_KUBERNETES``'s, else the default; anything else is a clear error."""
    text = (wanted or os.environ.get(KUBERNETES_ENV) or DEFAULT_KUBERNETES).strip()
    bare = text.removeprefix("v")
    for version in SUPPORTED_KUBERNETES:
        if bare in (version[1:], version[1:].rsplit(".", 1)[0]):
            return version
    raise BuildError(
        f"Kubernetes {text!r} is not a supported release; "
        f"choose one of {', '.join(SUPPORTED_KUBERNETES)} (or its minor, e.g. 1.36)"
    )


def kubernetes_version() -> str:
    """The release this process's control plane is built at (see :func:`resolve_kubernetes`)."""
    return resolve_kubernetes()


def modfile(module: Path, version: str) -> Path:
    """The go.mod that pins ``version``: the module's own for the default release."""
    path = module / ("go.mod" if version == DEFAULT_KUBERNETES else f"kubernetes-{version}.mod")
    if not path.is_file():
        raise BuildError(f"no module file for Kubernetes {version} at {path}")
    return path


def etcd_version(module: Path, version: str) -> str:
    """The etcd a release's module pins (the one its kube-apiserver is tested with)."""
    found = re.search(
        r"go\.etcd\.io/etcd/server/v3 (v[0-9.]+)", modfile(module, version).read_text()
    )
    if found is None:
        raise BuildError(f"{modfile(module, version)} pins no go.etcd.io/etcd/server/v3")
    return found.group(1)


def cache_key(module: Path, version: str | None = None) -> str:
    """Versions plus a hash of what the release builds from (``cmd/`` and its own module
    file and sums): a new pin means a new folder, another release's pin changes nothing."""
    version = version or kubernetes_version()
    mod = modfile(module, version)
    files = [
        p
        for p in (module / "cmd").rglob("*")
        if p.is_file() and p.relative_to(module / "cmd").parts[0] not in BENCH_TOOLS
    ]
    digest = _digest(module, [*files, mod, mod.with_suffix(".sum")], KWOK_VERSION.encode())
    versions = f"k8s-{version}-etcd-{etcd_version(module, version)}-kwok-{KWOK_VERSION}"
    return f"{versions}-{digest[:10]}"


def _digest(module: Path, files: list[Path], extra: bytes = b"") -> str:
    """sha256 over the files' paths (relative to ``module``) and contents, then ``extra``."""
    digest = hashlib.sha256()
    for path in sorted(files, key=lambda p: str(p.relative_to(module))):
        digest.update(str(path.relative_to(module)).encode())
        digest.update(path.read_bytes())
    digest.update(extra)
    return digest.hexdigest()


def null_binder_key(module: Path, version: str | None = None) -> str:
    """The null binder's cache folder name: the release and a hash of its source and the
    release's module file and sums (nothing of the plane's other commands)."""
    version = version or kubernetes_version()
    mod = modfile(module, version)
    files = [p for p in (module / "cmd" / NULL_BINDER).rglob("*") if p.is_file()]
    digest = _digest(module, [*files, mod, mod.with_suffix(".sum")])
    return f"{NULL_BINDER}-{version}-{digest[:10]}"


def modfile_flags(module: Path, version: str) -> str:
    """GOFLAGS words that select ``version``'s module file (none for the default)."""
    mod = modfile(module, version)
    return "" if mod.name == "go.mod" else f" -modfile={mod}"


def version_stamp(version: str) -> str:
    """The ldflags upstream's release build sets: without them binaries say v0.0.0-master,
    and clients (kubectl, kwok, Lattice) read the server's version from there."""
    return " ".join(
        [
            "-s -w",
            f"-X k8s.io/component-base/version.gitVersion={version}",
            "-X k8s.io/component-base/version.gitMajor=1",
            f"-X k8s.io/component-base/version.gitMinor={version.split('.')[1]}",
            "-X k8s.io/component-base/version.gitTreeState=clean",
        ]
    )


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
        if not bins.kwok_stages.is_file():
            _write_kwok_stages(bins.kwok_stages)
        return bins

    module = module_dir()
    version = kubernetes_version()
    target = cache_root() / "bin" / cache_key(module, version)
    bins = Binaries(target, helm_directory=helm_dir())
    if not all(bins.path(n).is_file() for n in CACHED_BINARIES):
        with _build_lock(target.parent):
            if not all(bins.path(n).is_file() for n in CACHED_BINARIES):
                _build(module, version, target, progress)  # else another process built it
    if not bins.kwok_stages.is_file():
        with _build_lock(target.parent):
            _write_kwok_stages(bins.kwok_stages)
    ensure_helm(progress)
    return bins


def _write_kwok_stages(path: Path) -> None:
    """kwok's own stage files, from its module at the pinned version, as one config file."""
    env = {**os.environ, "GOFLAGS": "-mod=mod"}
    env.setdefault("GOPROXY", "https://proxy.golang.org,direct")
    args = ["go", "mod", "download", "-json", f"sigs.k8s.io/kwok@{KWOK_VERSION}"]
    out = subprocess.run(
        args, cwd=tempfile.gettempdir(), env=env, capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        raise BuildError(f"{' '.join(args)} failed: {out.stderr.strip()[-400:]}")
    source = Path(json.loads(out.stdout)["Dir"])
    text = "\n---\n".join((source / rel).read_text().strip() for rel in KWOK_STAGES)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text + "\n")
    tmp.rename(path)


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


def ensure_null_binder(progress: Progress = _print) -> Path:
    """The benchmark's null binder for this release, built first if not cached (seconds
    with a warm Go build cache: it is client-go alone). ``LATTICE_BIN_DIR`` may hold a
    prebuilt ``nullbinder``; without one it is built into the cache as usual."""
    override = os.environ.get("LATTICE_BIN_DIR")
    if override and (Path(override) / NULL_BINDER).is_file():
        return Path(override) / NULL_BINDER
    module = module_dir()
    version = kubernetes_version()
    target = cache_root() / "bin" / null_binder_key(module, version)
    path = target / NULL_BINDER
    if path.is_file():
        return path
    with _build_lock(target.parent):
        if path.is_file():
            return path  # another process built it
        tmp = Path(tempfile.mkdtemp(prefix="build-nullbinder-", dir=target.parent))
        log = target.parent / f"{target.name}.build.log"
        log.write_text("")
        flags = "-mod=readonly -trimpath -buildvcs=false" + modfile_flags(module, version)
        env = {**os.environ, "GOFLAGS": flags}
        env.setdefault("GOPROXY", "https://proxy.golang.org,direct")
        progress(f"building the null binder ({version}) once into {target}, log: {log}")
        try:
            _run_go(
                ["go", "build", "-v", "-ldflags", "-s -w", "-o", f"{tmp}/", f"./cmd/{NULL_BINDER}"],
                module,
                env,
                log,
                NULL_BINDER,
                progress,
            )
            if target.exists():
                shutil.rmtree(target)
            tmp.rename(target)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
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


def _build(module: Path, version: str, target: Path, progress: Progress) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="build-", dir=target.parent))
    log = target.parent / f"{target.name}.build.log"
    log.write_text("")
    flags = "-mod=readonly -trimpath -buildvcs=false" + modfile_flags(module, version)
    env = {**os.environ, "GOFLAGS": flags}
    env.setdefault("GOPROXY", "https://proxy.golang.org,direct")
    stamp = version_stamp(version)
    progress(
        f"building the control plane once (Kubernetes {version}, "
        f"etcd {etcd_version(module, version)}, kwok {KWOK_VERSION}) into {target}; "
        f"a cold build takes 10-25 minutes on 2 cores, log: {log}"
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
