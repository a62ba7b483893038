"""Faults between Lattice and kube-apiserver (#36): one seeded run, short enough for the suite.

`lattice run` (shipped RBAC, a token user) reaches the API server only through
:class:`~tests.e2e.faults.proxy.FaultProxy`, which for 20 s resets about a tenth of the
requests (before forwarding, after forwarding with the reply withheld, mid-flight), stalls
some, cuts answers and refuses connections for short windows, while plain, volume, DRA and
gang pods stream in; then it heals. From the API objects alone: every pod bound once, no
device twice, no claim leaked, no gang partly bound, no binding task died, and every pod
placed within kube-scheduler's 34 s of the heal. The seed is printed (``LATTICE_FAULT_SEED``
replays one); `just chaos` runs many seeds, longer, with an API server restart.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes_asyncio import client

from lattice_dev.devcluster.cluster import ClusterConfig
from tests.conftest import report_line
from tests.e2e.faults.scenario import HEADER, KUBE_BAR, Workload, row, run_seed
from tests.e2e.test_scheduler import Plane, lattice_plane

pytestmark = pytest.mark.cluster

SEED_ENV = "LATTICE_FAULT_SEED"


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    with lattice_plane(tmp_path_factory.mktemp("faults"), ClusterConfig(nodes=6)) as p:
        yield p


async def test_faults_between_lattice_and_the_api_server_lose_nothing(
    plane: Plane, api: client.ApiClient, ns: str, tmp_path: Path
) -> None:
    seed = int(os.environ.get(SEED_ENV) or random.SystemRandom().randrange(2**31))
    print(f"fault seed {seed} (replay: {SEED_ENV}={seed})")
    outcome = await run_seed(plane, api, ns, seed, Workload(), tmp_path)
    report_line(f"faults: seed {seed} ({SEED_ENV}={seed} replays it)")
    report_line("faults: " + HEADER.strip())
    report_line("faults: " + row(outcome).strip())
    detail = "\n".join([outcome.failure or "", *outcome.problems[:20]])
    assert outcome.faults.get("reset_after", 0) > 0, f"no lost reply injected: {outcome.faults}"
    assert outcome.clean, f"seed {seed}: {row(outcome)}\n{detail}"
    assert outcome.after_heal is not None
    assert outcome.after_heal <= KUBE_BAR, (
        f"seed {seed}: bound {outcome.after_heal} s after the heal (bar {KUBE_BAR} s)"
    )
