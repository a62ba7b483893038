"""The release Lattice mirrors: read from GET /version at start, clamped to the supported
window with a warning, and carried by every profile the running scheduler builds."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from aiohttp import web
from kubernetes_asyncio import client
from structlog.testing import capture_logs

from scheduler.config import RunConfig
from scheduler.control.app import App, mirrored_release
from scheduler.control.kubeconfig import Credentials, wait_for_api
from scheduler.control.release import Release, ServerVersion, choose_release, server_version
from scheduler.control.scheduler import Scheduler
from scheduler.control.settings import parse_spec
from scheduler.core.plugins.balanced_allocation import BalancedAllocation
from scheduler.core.profile import BALANCED_ALLOCATION
from scheduler.obs.metrics import Metrics


def version_info(git: str | None, major: str | None, minor: str | None) -> SimpleNamespace:
    """What server_version reads of a VersionInfo (whose constructor refuses missing fields)."""
    return SimpleNamespace(git_version=git, major=major, minor=minor)


@pytest.mark.parametrize(
    ("git", "major", "minor", "expected"),
    [
        pytest.param("v1.37.2", "1", "37", ServerVersion(1, 37, "v1.37.2"), id="plain"),
        pytest.param(
            "v1.36.3-gke.1200", "1", "36+", ServerVersion(1, 36, "v1.36.3-gke.1200"), id="vendor"
        ),
        pytest.param("", "1", "35+", ServerVersion(1, 35, "1.35"), id="major-minor-only"),
        pytest.param(None, "1", "34", ServerVersion(1, 34, "1.34"), id="no-git-version"),
        pytest.param("v2.0.0", "2", "0", ServerVersion(2, 0, "v2.0.0"), id="a-new-major"),
        pytest.param("devel", "1", "", None, id="unreadable"),
        pytest.param(None, None, None, None, id="empty"),
    ],
)
def test_server_version(
    git: str | None, major: str | None, minor: str | None, expected: ServerVersion | None
) -> None:
    assert server_version(version_info(git, major, minor)) == expected


@pytest.mark.parametrize(
    ("version", "minor", "warns"),
    [
        pytest.param(ServerVersion(1, 35, "v1.35.4"), 35, None, id="1.35"),
        pytest.param(ServerVersion(1, 36, "v1.36.3"), 36, None, id="1.36"),
        pytest.param(ServerVersion(1, 37, "v1.37.2"), 37, None, id="1.37"),
        pytest.param(ServerVersion(1, 34, "v1.34.4"), 35, "v1.34.4, older", id="older"),
        pytest.param(ServerVersion(1, 38, "v1.38.0"), 37, "v1.38.0, newer", id="newer"),
        pytest.param(ServerVersion(2, 0, "v2.0.0"), 37, "v2.0.0, newer", id="new-major"),
        pytest.param(ServerVersion(0, 99, "0.99"), 35, "0.99, older", id="old-major"),
        pytest.param(None, 37, "could not be read", id="unreadable"),
    ],
)
def test_choose_release(version: ServerVersion | None, minor: int, warns: str | None) -> None:
    release = choose_release(version)
    assert release.kube_minor == minor
    if warns is None:
        assert release.warning is None
    else:
        assert release.warning is not None
        assert warns in release.warning
        assert "1.35 to 1.37" in release.warning


def test_an_unsupported_release_is_a_clear_warning() -> None:
    with capture_logs() as logs:
        assert mirrored_release(ServerVersion(1, 34, "v1.34.4")) == 35
        assert mirrored_release(ServerVersion(1, 36, "v1.36.3")) == 36
    assert [(e["log_level"], e["event"]) for e in logs] == [
        ("warning", "kubernetes_release_unsupported"),
        ("info", "kubernetes_release"),
    ]
    assert logs[0]["reason"] == (
        "the API server is v1.34.4, older than the supported releases (1.35 to 1.37);"
        " behaving as kube-scheduler 1.35"
    )
    assert logs[1]["reason"] == "API server v1.36.3: behaving as kube-scheduler 1.36"
    assert Release(36, None).describe() == "behaving as kube-scheduler 1.36"


VERSION_1_35_4 = {
    "major": "1",
    "minor": "35",
    "emulationMajor": "1",
    "emulationMinor": "35",
    "minCompatibilityMajor": "1",
    "minCompatibilityMinor": "34",
    "gitVersion": "v1.35.4",
    "gitCommit": "0" * 40,
    "gitTreeState": "clean",
    "buildDate": "2026-01-01T00:00:00Z",
    "goVersion": "go1.25.0",
    "compiler": "gc",
    "platform": "linux/amd64",
}
"""A /version answer as kube-apiserver writes it (every field VersionInfo requires)."""


async def test_waiting_for_the_api_server_reads_its_version() -> None:
    async def version(request: web.Request) -> web.Response:
        return web.json_response(VERSION_1_35_4)

    app = web.Application()
    app.router.add_get("/version/", version)  # the generated client asks with the slash
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    creds = Credentials(None, "test")
    creds.configuration.host = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        async with client.ApiClient(configuration=creds.configuration) as api:
            assert await wait_for_api(api, creds, within=5) == ServerVersion(1, 35, "v1.35.4")
    finally:
        await runner.cleanup()


def test_every_spec_applied_keeps_the_release_read_at_start() -> None:
    """The release is not in the spec: a LatticeScheduler edit must not reset it."""
    app = App(RunConfig())
    app.kube_minor = 35
    app.scheduler = Scheduler(
        parse_spec({}, "lattice", kube_minor=35), writer=None, metrics=Metrics.create()
    )
    app._apply_object({"metadata": {"name": "lattice"}, "spec": {"bindConcurrency": 8}})
    settings = app.scheduler.settings
    assert (settings.bind_concurrency, settings.profile.kube_minor) == (8, 35)
    app._apply_object({"metadata": {"name": "lattice"}, "spec": {"seed": 3}})
    assert app.scheduler.settings.profile.kube_minor == 35
    scores = app.scheduler.framework.plugins.scores
    plugin = next(p for p, _ in scores if p.name == BALANCED_ALLOCATION)
    assert isinstance(plugin, BalancedAllocation)
    assert not plugin.scores_change
    assert app.scheduler.cache.kube_minor == 35  # bound pods are accounted as 1.35 does


def test_parse_spec_mirrors_the_newest_release_unless_told() -> None:
    assert parse_spec({}, "lattice").profile.kube_minor == 37
    assert parse_spec({}, "lattice", kube_minor=36).profile.kube_minor == 36
