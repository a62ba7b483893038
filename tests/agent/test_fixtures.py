"""The committed fixture trees are exactly what make_fixtures.py generates."""

from __future__ import annotations

import os
from pathlib import Path

from tests.agent import make_fixtures
from tests.agent.trees import ALL, FIXTURES


def _snapshot(root: Path) -> dict[str, str]:
    """Relative path -> file contents, or '-> target' for symlinks; empty dirs are errors."""
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        if not dirnames and not filenames:
            out[str(here.relative_to(root))] = "EMPTY DIRECTORY (git would drop it)"
        for name in [*dirnames, *filenames]:
            path = here / name
            rel = str(path.relative_to(root))
            if path.is_symlink():
                out[rel] = "-> " + os.readlink(path)
            elif path.is_file():
                out[rel] = path.read_text()
    return out


def test_fixtures_are_current(tmp_path: Path) -> None:
    make_fixtures.generate(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(ALL)
    for name in ALL:
        assert _snapshot(FIXTURES / name) == _snapshot(tmp_path / name), (
            f"fixture {name} is stale: run python tests/agent/make_fixtures.py"
        )


def test_bus_links_are_relative_like_the_kernel() -> None:
    bus = FIXTURES / "two-socket-8gpu" / "sys" / "bus" / "pci" / "devices"
    links = sorted(bus.iterdir())
    assert len(links) > 40
    for link in links:
        target = os.readlink(link)
        assert target.startswith("../../../devices/pci"), target
        assert target.endswith("/" + link.name)
        assert link.resolve().is_dir()
