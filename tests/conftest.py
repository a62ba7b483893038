"""Suite-wide fixtures: one real control plane per test run, a namespace per test.

The control plane is started by the same code as `lattice devcluster`, in a
temporary state folder on free loopback ports, so a developer's own devcluster
is never touched. If it cannot start, every test that needs it errors: tests
that need Kubernetes are never skipped.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
from kubernetes_asyncio import client

from lattice_dev.devcluster import reaper
from lattice_dev.devcluster.cluster import ClusterConfig, ClusterState, DevCluster
from lattice_dev.devcluster.kube import api_client
from lattice_dev.devcluster.reaper import MARKER_ENV
from tests.e2e.differential.seeds import SEED_ENV, choose_seed, diff_runs, seed_line

SUITE_NODES = int(os.environ.get("LATTICE_TEST_NODES", "4"))
_REPORT: list[str] = []
_DIFF_SUITES: set[str] = set()
"""Differential suites collected in this run: the summary then names the seed."""


def report_line(line: str) -> None:
    """A figure a test measured, printed in the run's summary (agreement rates and the like)."""
    _REPORT.append(line)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--diff-cases",
        type=int,
        default=300,
        help="differential test: cases against kube-scheduler (default 300)",
    )
    parser.addoption(
        "--diff-seed",
        type=int,
        default=None,
        help=f"differential tests: generator seed (default: ${SEED_ENV}, else drawn per run; "
        "the seeds in tests/e2e/differential/seeds.py run too)",
    )
    parser.addoption(
        "--volume-cases",
        type=int,
        default=100,
        help="differential volume test: cases against kube-scheduler (default 100)",
    )
    parser.addoption(
        "--preempt-cases",
        type=int,
        default=100,
        help="differential preemption test: cases against kube-scheduler (default 100)",
    )


_SEED: pytest.StashKey[tuple[int, str]] = pytest.StashKey()


def pytest_configure(config: pytest.Config) -> None:
    """Draw the differential seed once per run, before collection parametrizes by it; and
    (in the run's first process, before any xdist worker) mark the run's environment and
    start the watcher that stops what the run started if the run is killed
    (:mod:`lattice_dev.devcluster.reaper`)."""
    config.stash[_SEED] = choose_seed(config.getoption("--diff-seed"), os.environ)
    if not hasattr(config, "workerinput") and MARKER_ENV not in os.environ:
        marker = uuid.uuid4().hex
        os.environ[MARKER_ENV] = marker
        reaper.spawn(marker)


def pytest_report_header(config: pytest.Config) -> str:
    return seed_line(*config.stash[_SEED])


@pytest.fixture(autouse=True)
def _structlog_left_as_found() -> Iterator[None]:
    """structlog's configuration is the process's: a test that configures it (the CLI, or
    ``capture_logs``, which leaves ``is_configured()`` true) must not change where a later
    test's log lines go, whichever file runs next (under xdist, any)."""
    configured = structlog.is_configured()
    yield
    if not configured and structlog.is_configured():
        structlog.reset_defaults()


SERIAL_DIRS = frozenset({"e2e", "devcluster", "charts"})
"""Folders whose tests start real processes (a control plane, a kubelet, an image build)."""


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by the marks set here
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark ``cluster`` every test that needs the suite's control plane or starts real
    processes of its own: ``just test`` runs the others in parallel, then these one at a
    time (two planes at once on a small machine turn timing into flakes)."""
    root = Path(__file__).parent
    for item in items:
        parts = item.path.relative_to(root).parts
        if parts[0] in SERIAL_DIRS or "control_plane" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.cluster)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """``diff_run``: the run's seed, then the module's ``DIFF_SUITE`` regressions."""
    if "diff_run" not in metafunc.fixturenames:
        return
    seed, _ = metafunc.config.stash[_SEED]
    runs = diff_runs(metafunc.module.DIFF_SUITE, seed)
    metafunc.parametrize("diff_run", runs, ids=[r.id for r in runs])
    _DIFF_SUITES.add(metafunc.module.DIFF_SUITE)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The figures tests measured, and the differential seed (so a failure can be rerun)."""
    if not _REPORT and not _DIFF_SUITES:
        return
    terminalreporter.section("lattice figures")
    if _DIFF_SUITES:
        terminalreporter.write_line(seed_line(*terminalreporter.config.stash[_SEED]))
    for line in _REPORT:
        terminalreporter.write_line(line)


class ControlPlane:
    """What a test needs to reach the suite's control plane."""

    def __init__(self, cluster: DevCluster, state: ClusterState) -> None:
        self.cluster = cluster
        self.state = state

    @property
    def kubeconfig(self) -> Path:
        return self.cluster.kubeconfig

    def kubeconfig_for(self, user: str) -> Path:
        return self.cluster.kubeconfig_for(user)


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """etcd + kube-apiserver + kube-controller-manager + kwok + kube-scheduler, once per run."""
    cluster = DevCluster(tmp_path_factory.mktemp("devcluster") / "state")
    state = cluster.up(ClusterConfig(nodes=SUITE_NODES, with_kube_scheduler=True))
    try:
        yield ControlPlane(cluster, state)
    finally:
        cluster.down()


@pytest.fixture(scope="session")
async def kube(control_plane: ControlPlane) -> AsyncIterator[client.ApiClient]:
    """An admin API client for the suite's control plane."""
    async with api_client(control_plane.kubeconfig) as api:
        yield api


@pytest.fixture
async def namespace(kube: client.ApiClient) -> AsyncIterator[str]:
    """A fresh namespace per test, deleted afterwards (its pods go with it)."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    core = client.CoreV1Api(kube)
    await core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    try:
        yield name
    finally:
        await core.delete_namespace(name)
