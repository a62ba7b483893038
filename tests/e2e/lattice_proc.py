"""Run `lattice run` as a real process against a test control plane."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml


class LatticeProcess:
    """One scheduler replica; killable like a real pod."""

    def __init__(self, kubeconfig: Path, log: Path, identity: str, *extra: str) -> None:
        self.kubeconfig = kubeconfig
        self.log = log
        self.identity = identity
        self.extra = extra
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> LatticeProcess:
        args = [
            sys.executable,
            "-m",
            "scheduler.cli",
            "run",
            "--kubeconfig",
            str(self.kubeconfig),
            "--identity",
            self.identity,
            "--metrics-host",
            "127.0.0.1",
            "--metrics-port",
            "0",
            *self.extra,
        ]
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        return self

    def signal(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def wait(self, timeout: float = 60) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout=timeout)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def lines(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                try:
                    out.append(yaml.safe_load(line))
                except yaml.YAMLError:
                    continue
        return out


def least_privilege_rbac(manifest: Path, user: str, lease_namespace: str) -> list[dict[str, Any]]:
    """The manifests' RBAC objects, plus bindings of the same roles to a test user.

    The test runs the real process outside the cluster with a token user, so the
    bindings are added for that user; the roles are exactly those we ship.
    """
    docs = [d for d in yaml.safe_load_all(manifest.read_text()) if d]
    keep = [
        d
        for d in docs
        if d["kind"]
        in (
            "Namespace",
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",
            "RoleBinding",
        )
    ]
    extra = []
    for d in keep:
        if d["kind"] in ("ClusterRoleBinding", "RoleBinding"):
            twin = {
                **d,
                "metadata": {**d["metadata"], "name": d["metadata"]["name"] + "-test-user"},
                "subjects": [
                    {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}
                ],
            }
            extra.append(twin)
    assert all(
        d["metadata"].get("namespace", lease_namespace) == lease_namespace
        for d in keep
        if d["kind"] in ("Role", "RoleBinding")
    )
    return keep + extra
