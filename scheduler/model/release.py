"""The Kubernetes releases Lattice mirrors, as plain numbers.

They live in the model because parsing already depends on them: the request a bound pod
holds on its node is computed the way that release's component-helpers ``PodRequests``
computes it (see :class:`scheduler.model.resources.StatusRules`). The core's profile
re-exports them (:attr:`scheduler.core.profile.Profile.kube_minor`).
"""

from __future__ import annotations

from typing import Final

OLDEST_KUBE_MINOR: Final = 35
NEWEST_KUBE_MINOR: Final = 37
"""The Kubernetes 1.x releases whose kube-scheduler a profile can mirror (the supported
window); a cluster outside it is run as the nearest of them (see scheduler.control.release)."""
DEFAULT_KUBE_MINOR: Final = NEWEST_KUBE_MINOR


def nearest_kube_minor(minor: int) -> int:
    """The supported release closest to ``minor`` (itself when supported)."""
    return min(max(minor, OLDEST_KUBE_MINOR), NEWEST_KUBE_MINOR)
