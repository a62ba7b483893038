"""The core and the model stay pure: no Kubernetes client, kopf, metrics or I/O imports."""

from __future__ import annotations

import subprocess
import sys

FORBIDDEN = (
    "kubernetes_asyncio",
    "kopf",
    "prometheus_client",
    "structlog",
    "aiohttp",
    "scheduler.control",
    "scheduler.obs",
    "scheduler.agent",
)


def test_core_and_model_import_nothing_impure() -> None:
    code = (
        "import sys\n"
        "import scheduler.model, scheduler.core, lattice_dev.core.bench\n"
        "import scheduler.core.registry, lattice_dev.core.oracle.inter_pod_affinity\n"
        "import lattice_dev.core.oracle.pod_topology_spread\n"
        f"bad = [m for m in sys.modules if m.startswith({FORBIDDEN!r})]\n"
        "print(','.join(sorted(bad)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == ""
