"""Typed settings of `lattice run`: process-level flags, fixed at start-up.

What may change while running (the profile, weights, bind concurrency, QPS)
lives in the LatticeScheduler object instead; see
:mod:`scheduler.control.settings`.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from pathlib import Path


def _default_identity() -> str:
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True)
class LeaderElectionConfig:
    enabled: bool = True
    """On by default, as in kube-scheduler: two replicas must never both bind."""
    lease_name: str = "lattice-scheduler"
    lease_namespace: str = field(
        default_factory=lambda: os.environ.get("POD_NAMESPACE", "kube-system")
    )
    """Where the Lease lives: our own namespace in a cluster, kube-system for a bare run."""
    identity: str = field(default_factory=_default_identity)
    lease_duration: int = 15
    """A standby takes over at most this long after the leader stops renewing."""
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def validate(self) -> None:
        if not self.lease_duration > self.renew_deadline > 1.2 * self.retry_period >= 1.2:
            raise ValueError(
                "leader election needs lease-duration > renew-deadline > 1.2 x retry-period"
                " and retry-period >= 1s"
            )


@dataclass(frozen=True)
class RunConfig:
    kubeconfig: Path | None = None
    """None: in-cluster service account."""
    scheduler_name: str = "lattice"
    metrics_host: str = "0.0.0.0"
    metrics_port: int = 10260
    """0 picks a free port (tests)."""
    leader_election: LeaderElectionConfig = field(default_factory=LeaderElectionConfig)
    status_interval: float = 5.0
    """How often the leader writes the LatticeScheduler status (at most)."""
    shutdown_grace: float = 20.0
    """On SIGTERM: how long in-flight bindings may take before we stop anyway."""
    log_level: str = "info"

    def validate(self) -> None:
        self.leader_election.validate()
        if not 0 <= self.metrics_port <= 65535:
            raise ValueError("metrics port must be within 0..65535")
        if self.status_interval <= 0:
            raise ValueError("the status interval must be positive")
