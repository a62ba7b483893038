"""Build Lattice's container image here, without Docker and without a registry.

No registry is reachable from this kind of machine, so the Dockerfile's ``BASE``
comes from a local build: mmdebstrap of Debian bookworm with Debian's python3.11,
imported into podman's storage. buildah then builds the repository's own, standard
Dockerfile (users with a registry build the same file on the official slim image).
Both results are cached under ``~/.cache/lattice/images/`` by content: the base by
its recipe, the image by the hash of everything the build context holds, so a warm
``just image`` is a lookup and a changed source file is a new image.

The tools (buildah, podman, mmdebstrap, runc) are Debian packages; when one is
missing and we are root on Debian, they are installed with apt, as the project's
own set-up (CI's machine starts without them).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from lattice_dev.devcluster.build import Progress, cache_root, checkout_path
from scheduler import __version__

APT_PACKAGES = ("buildah", "podman", "mmdebstrap", "runc", "uidmap", "containernetworking-plugins")
"""What the image build and the container checks need (Debian bookworm's packages)."""
TOOLS = ("buildah", "podman", "mmdebstrap", "runc")

BASE_SUITE = "bookworm"
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates", "usr-is-merged")
"""usr-is-merged satisfies init-system-helpers' ``usrmerge | usr-is-merged`` (mmdebstrap
already lays out a merged /usr), so usrmerge and the perl it needs can be purged."""
PERL_ONLY = (
    "usrmerge",
    "libfile-find-rule-perl",
    "libnumber-compare-perl",
    "libtext-glob-perl",
    "perl",
    "libperl5.36",
    "perl-modules-5.36",
)
"""What minbase installs only for usrmerge (a one-time conversion script in perl):
about 48 MB. perl-base (Essential, dpkg's own scripts) stays."""
BASE_SOURCES = (
    f"deb http://deb.debian.org/debian {BASE_SUITE} main",
    f"deb http://deb.debian.org/debian {BASE_SUITE}-updates main",
    f"deb http://deb.debian.org/debian-security {BASE_SUITE}-security main",
)
BASE_OPTIONS = (
    "--variant=minbase",
    # Documentation and translations are never read in a container.
    "--dpkgopt=path-exclude=/usr/share/doc/*",
    "--dpkgopt=path-exclude=/usr/share/man/*",
    "--dpkgopt=path-exclude=/usr/share/info/*",
    "--dpkgopt=path-exclude=/usr/share/locale/*",
    '--aptopt=Acquire::Languages "none"',
    # apt refuses if anything left still depends on one of them.
    f'--customize-hook=chroot "$1" apt-get purge -y -q {" ".join(PERL_ONLY)}',
    # debconf's backups of its own databases.
    '--customize-hook=rm -f "$1"/var/cache/debconf/*-old',
)
KEEP_ARCHIVES = 3
"""Older image archives kept besides the one just built (each is about 100 MiB)."""
REPOSITORY = "localhost/lattice"
BASE_REPOSITORY = "localhost/lattice-base"
CONTEXT_FILES = ("Dockerfile", ".dockerignore", "pyproject.toml", "README.md")
CONTEXT_DIRS = ("scheduler",)
"""The build context the Dockerfile and .dockerignore use: its content is the key."""


class ImageError(RuntimeError):
    """The image could not be built or run; the message says what to do."""


@dataclass(frozen=True)
class Image:
    """A built image: its names in podman's storage and its cached OCI archive."""

    ref: str
    tags: tuple[str, ...]
    archive: Path
    size_bytes: int
    """Uncompressed size of the image's layers, as podman reports it."""


def _print(msg: str) -> None:
    print(f"lattice image: {msg}", file=sys.stderr, flush=True)


def missing_tools() -> list[str]:
    return [tool for tool in TOOLS if shutil.which(tool) is None]


def apt_install(packages: Sequence[str], missing: Sequence[str], progress: Progress) -> None:
    """Install Debian ``packages`` for the ``missing`` tools, if we are root on Debian;
    else an error naming them (the project's own set-up: CI's machine starts bare)."""
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise ImageError(
            f"{', '.join(missing)} not found; install Debian's packages "
            f"({' '.join(packages)}) or their equivalents (as root)"
        )
    progress(f"installing {' '.join(packages)} with apt-get (missing: {', '.join(missing)})")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for args in (
        ["apt-get", "update", "-q"],
        ["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages],
    ):
        done = subprocess.run(args, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise ImageError(f"{' '.join(args[:2])} failed:\n{done.stderr[-2000:]}")


def ensure_tools(progress: Progress = _print) -> None:
    """Install the Debian packages the build needs, if missing and we may."""
    missing = missing_tools()
    if not missing:
        return
    apt_install(APT_PACKAGES, missing, progress)
    still = missing_tools()
    if still:
        raise ImageError(f"apt-get installed the packages but {', '.join(still)} is missing")


def images_dir() -> Path:
    path = cache_root() / "images"
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextlib.contextmanager
def _lock() -> Iterator[None]:
    """One build at a time per cache: two would only slow each other on 2 cores."""
    with (images_dir() / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def base_key() -> str:
    recipe = json.dumps([BASE_SUITE, BASE_PACKAGES, BASE_SOURCES, BASE_OPTIONS])
    return f"{BASE_SUITE}-py3-{hashlib.sha256(recipe.encode()).hexdigest()[:10]}"


def context_key(checkout: Path, base: str) -> str:
    """Hash of every file the build context carries, and of the base's recipe."""
    digest = hashlib.sha256(base.encode())
    files = [checkout / name for name in CONTEXT_FILES]
    for name in CONTEXT_DIRS:
        files += [
            p
            for p in (checkout / name).rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
        ]
    for path in sorted(files):
        digest.update(str(path.relative_to(checkout)).encode() + b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def _run(args: Sequence[str], what: str, log: Path | None = None) -> str:
    done = subprocess.run(list(args), capture_output=True, text=True, check=False)
    if log is not None:
        log.write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        where = f" (log: {log})" if log is not None else ""
        raise ImageError(f"{what} failed{where}:\n{(done.stdout + done.stderr)[-3000:]}")
    return done.stdout


def _in_storage(ref: str) -> bool:
    return (
        subprocess.run(
            ["podman", "image", "exists", ref], capture_output=True, check=False
        ).returncode
        == 0
    )


def prune_archives(directory: Path, current: Path, keep: int = KEEP_ARCHIVES) -> list[Path]:
    """Delete all but the ``keep`` newest image archives in ``directory`` (never
    ``current``), with their build logs; returns what was deleted."""
    archives = sorted(
        (p for p in directory.glob("lattice-*.oci.tar") if p != current),
        key=lambda p: p.stat().st_mtime_ns,
        reverse=True,
    )
    pruned = archives[keep:]
    for archive in pruned:
        key = archive.name.removesuffix(".oci.tar").rsplit("-", 1)[-1]
        archive.unlink(missing_ok=True)
        (directory / f"lattice-{key}.log").unlink(missing_ok=True)
    return pruned


def ensure_base(progress: Progress = _print) -> str:
    """The local bookworm + python3 base, built once per recipe; returns its ref."""
    key = base_key()
    ref = f"{BASE_REPOSITORY}:{key}"
    tar = images_dir() / f"base-{key}.tar"
    if not tar.is_file():
        progress(f"building the base image once (mmdebstrap {BASE_SUITE}, Debian's python3)")
        tmp = images_dir() / f".base-{key}.tmp.tar"
        _run(
            [
                "mmdebstrap",
                *BASE_OPTIONS,
                f"--include={','.join(BASE_PACKAGES)}",
                BASE_SUITE,
                str(tmp),
                *BASE_SOURCES,
            ],
            "mmdebstrap",
            images_dir() / f"base-{key}.log",
        )
        tmp.rename(tar)
    if not _in_storage(ref):
        _run(["podman", "import", "--change", 'CMD ["/bin/sh"]', str(tar), ref], "podman import")
    return ref


def _image_from_archive(ref: str, tags: tuple[str, ...], archive: Path) -> Image:
    if not _in_storage(ref):
        _run(["podman", "load", "--input", str(archive)], "podman load")
    for tag in tags:
        if tag != ref:
            _run(["podman", "tag", ref, tag], "podman tag")
    size = int(_run(["podman", "image", "inspect", "--format", "{{.Size}}", ref], "inspect"))
    return Image(ref=ref, tags=tags, archive=archive, size_bytes=size)


def ensure_image(progress: Progress = _print) -> Image:
    """Build the image (once per content) and return it, loaded into podman's storage."""
    ensure_tools(progress)
    checkout = checkout_path("Dockerfile").parent
    with _lock():
        base = ensure_base(progress)
        key = context_key(checkout, base)
        ref = f"{REPOSITORY}:{key}"
        tags = (ref, f"{REPOSITORY}:{__version__}")
        archive = images_dir() / f"lattice-{__version__}-{key}.oci.tar"
        if archive.is_file():
            return _image_from_archive(ref, tags, archive)
        progress(f"building {ref} from {checkout / 'Dockerfile'} on {base}")
        args = [
            "buildah",
            "bud",
            # No container runtime is needed to build (cgroup-hybrid hosts refuse crun).
            "--isolation=chroot",
            "--network=host",
            # The dependencies' layer (from pyproject.toml alone) is reused while only
            # scheduler/ changes: a rebuild is then the package's own install.
            "--layers=true",
            f"--build-arg=BASE={base}",
            f"--tag={ref}",
            "--file",
            str(checkout / "Dockerfile"),
        ]
        # The host's trust (a TLS-intercepting proxy's CA) and pip's download cache,
        # mounted for the build steps only: neither lands in a layer.
        host_ca = Path("/etc/ssl/certs/ca-certificates.crt")
        if host_ca.is_file():
            args.append(f"--volume={host_ca}:{host_ca}:ro")
        pip_cache = Path(os.environ.get("PIP_CACHE_DIR", Path.home() / ".cache" / "pip"))
        pip_cache.mkdir(parents=True, exist_ok=True)
        args.append(f"--volume={pip_cache}:/root/.cache/pip")
        _run([*args, str(checkout)], "buildah bud", images_dir() / f"lattice-{key}.log")
        tmp = images_dir() / f".lattice-{key}.tmp.tar"
        tmp.unlink(missing_ok=True)
        _run(
            ["podman", "save", "--format=oci-archive", "--output", str(tmp), ref],
            "podman save",
        )
        tmp.rename(archive)
        for old in prune_archives(images_dir(), archive):
            old_key = old.name.removesuffix(".oci.tar").rsplit("-", 1)[-1]
            # Its image in podman's storage too (kept if a container still uses it).
            subprocess.run(
                ["podman", "rmi", f"{REPOSITORY}:{old_key}"], capture_output=True, check=False
            )
        return _image_from_archive(ref, tags, archive)


def run_args(
    ref: str, *args: str, entrypoint: str | None = None, extra: Sequence[str] = ()
) -> list[str]:
    """``podman run`` of the image as a cluster would run it: read-only root, runc.

    rlimits are set below this process's own: a container root without
    CAP_SYS_RESOURCE (a sandboxed CI machine) cannot raise them to podman's
    rootful defaults, and runc then refuses to start the container at all.
    """
    nofile = min(resource.getrlimit(resource.RLIMIT_NOFILE)[1], 4096)
    nproc = min(resource.getrlimit(resource.RLIMIT_NPROC)[1], 4096)
    cmd = [
        "podman",
        "run",
        "--rm",
        "--runtime=runc",
        "--read-only",
        "--network=none",
        f"--ulimit=nofile={nofile}:{nofile}",
        f"--ulimit=nproc={nproc}:{nproc}",
        *extra,
    ]
    if entrypoint is not None:
        cmd.append(f"--entrypoint={entrypoint}")
    return [*cmd, ref, *args]


def main(argv: Sequence[str] | None = None) -> int:
    """``just image``: build (or find) the image and say where it is."""
    del argv
    try:
        image = ensure_image()
    except ImageError as exc:
        print(f"lattice image: {exc}", file=sys.stderr)
        return 1
    print(f"image:   {' '.join(image.tags)}")
    print(f"archive: {image.archive} ({image.archive.stat().st_size / 2**20:.0f} MiB)")
    print(f"size:    {image.size_bytes / 2**20:.0f} MiB uncompressed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
