"""The Kubernetes release Lattice mirrors: the API server's, read once at start.

kube-scheduler's scores change between releases (BalancedAllocation in 1.36), and a
cluster's kube-scheduler runs the control plane's release, so Lattice asks the API server
(GET /version, which every authenticated client may read) and scores as that release's
kube-scheduler does. The release is fixed for the life of the process: an upgraded control
plane restarts its schedulers anyway, and a profile that changed mid-run would make
decisions of one run disagree for no reason a user can see.

``gitVersion`` (``v1.37.2``, ``v1.36.3-gke.1200``) is read first: it is the binary's
release, which is what decides the code paths; ``major``/``minor`` (``"1"``, ``"37+"`` on some
managed clusters) are the fallback. A release outside the supported window, or one that
cannot be read, is run as the nearest supported one (the newest when unreadable), with a
warning that says so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from scheduler.core.profile import (
    DEFAULT_KUBE_MINOR,
    NEWEST_KUBE_MINOR,
    OLDEST_KUBE_MINOR,
    nearest_kube_minor,
)

_GIT_VERSION: Final = re.compile(r"v?(\d+)\.(\d+)(?:\.|$)")
_NUMBER: Final = re.compile(r"(\d+)")


@dataclass(frozen=True, slots=True)
class ServerVersion:
    """What /version said, reduced to what decides behaviour."""

    major: int
    minor: int
    text: str
    """How the server put it (``gitVersion``, else ``major.minor``), for messages."""


@dataclass(frozen=True, slots=True)
class Release:
    """The release Lattice mirrors, and a warning when it is not the server's own."""

    kube_minor: int
    warning: str | None

    def describe(self) -> str:
        return f"behaving as kube-scheduler 1.{self.kube_minor}"


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def server_version(info: object) -> ServerVersion | None:
    """Parse the answer of GET /version (a kubernetes_asyncio ``VersionInfo`` or anything with
    its attribute names); None when neither form of the version can be read."""
    git = _text(getattr(info, "git_version", None)).strip()
    found = _GIT_VERSION.match(git)
    if found is not None:
        return ServerVersion(int(found[1]), int(found[2]), git)
    major = _NUMBER.match(_text(getattr(info, "major", None)).strip())
    minor = _NUMBER.match(_text(getattr(info, "minor", None)).strip())
    if major is None or minor is None:
        return None
    return ServerVersion(int(major[1]), int(minor[1]), f"{major[1]}.{minor[1]}")


def choose_release(version: ServerVersion | None) -> Release:
    """The supported release to mirror for a server of ``version``."""
    supported = f"1.{OLDEST_KUBE_MINOR} to 1.{NEWEST_KUBE_MINOR}"
    if version is None:
        return Release(
            DEFAULT_KUBE_MINOR,
            f"the API server's version could not be read; supported releases are {supported}",
        )
    if version.major != 1:
        minor = NEWEST_KUBE_MINOR if version.major > 1 else OLDEST_KUBE_MINOR
    else:
        minor = nearest_kube_minor(version.minor)
    if version.major == 1 and minor == version.minor:
        return Release(minor, None)
    side = "newer" if (version.major, version.minor) > (1, NEWEST_KUBE_MINOR) else "older"
    return Release(
        minor,
        f"the API server is {version.text}, {side} than the supported releases ({supported})",
    )
