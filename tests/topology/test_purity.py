"""The topology core stays pure: importing it (and its benchmark) loads no client or agent."""

from __future__ import annotations

import subprocess
import sys

from tests.core.test_purity import FORBIDDEN


def test_topology_modules_import_nothing_impure() -> None:
    code = (
        "import sys\n"
        "import scheduler.core.topology, scheduler.core.plugins.topology\n"
        "import lattice_dev.core.topology_bench, scheduler.model.noderesourcetopology\n"
        f"bad = [m for m in sys.modules if m.startswith({FORBIDDEN!r})]\n"
        "print(','.join(sorted(bad)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == ""
