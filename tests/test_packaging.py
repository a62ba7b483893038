"""What ships is what runs: the wheel, installed as a user would, and the declared deps.

Two halves:

* Static: every top-level third-party import of ``scheduler/`` is a declared runtime
  dependency and every runtime dependency is imported; ``tests/`` needs nothing beyond
  runtime + dev; dev extras that nothing imports are tools ``just test`` runs.
* Installed: the wheel is built from only what the Dockerfile copies (pyproject.toml,
  README.md, scheduler/), installed NON-editable with its dependencies from the index into
  a fresh virtualenv without system site-packages (so an undeclared dependency fails
  here), and ``lattice`` and every module of the installed package are run from a
  temporary folder, outside the checkout. The virtualenv of the dependencies is made once
  per dependency list (cached), so this takes seconds after the first run.
"""

from __future__ import annotations

import ast
import fcntl
import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import pytest

REPO: Final = Path(__file__).resolve().parents[1]
PYPROJECT: Final = tomllib.loads((REPO / "pyproject.toml").read_text())
LOCAL: Final = frozenset({"scheduler", "lattice_dev", "tests"})

IMPORT_NAMES: Final = {
    "pyyaml": "yaml",
    "kubernetes-asyncio": "kubernetes_asyncio",
    "prometheus-client": "prometheus_client",
}
"""Distributions whose import name is not their normalised name with '-' -> '_'."""

TOOLS: Final = {
    "pytest-timeout": "the `timeout` option in [tool.pytest.ini_options]",
    "pytest-xdist": "`just test` (pytest -n auto for the tests that start no process)",
    "ruff": "`just lint`",
    "mypy": "`just lint`",
    "import-linter": "`just lint` (lint-imports)",
    "types-PyYAML": "mypy's stubs for yaml",
    "types-tqdm": "mypy's stubs for tqdm",
    "rust-just": "the `just` command itself",
}
"""Dev extras that are run, not imported, and what needs each."""


def normalise(distribution: str) -> str:
    return re.sub(r"[-_.]+", "-", distribution).lower()


def requirement_name(requirement: str) -> str:
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
    assert match is not None, requirement
    return match.group(0)


def import_name(distribution: str) -> str:
    key = normalise(distribution)
    return IMPORT_NAMES.get(key, key.replace("-", "_"))


def declared(group: str | None) -> dict[str, str]:
    """Import name -> distribution, for the runtime deps (None) or an extra."""
    project = PYPROJECT["project"]
    reqs = project["dependencies"] if group is None else project["optional-dependencies"][group]
    return {import_name(requirement_name(r)): requirement_name(r) for r in reqs}


def third_party_imports(root: Path) -> dict[str, set[str]]:
    """Top-level non-stdlib, non-local modules imported anywhere under ``root`` -> files."""
    found: dict[str, set[str]] = {}
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            else:
                continue
            for module in modules:
                top = module.split(".")[0]
                if top not in sys.stdlib_module_names and top not in LOCAL:
                    found.setdefault(top, set()).add(str(path.relative_to(REPO)))
    return found


def optional_extras() -> dict[str, str]:
    """Import name -> distribution of the user-facing extras (every one but dev), e.g.
    ``plot``: imported by scheduler/ only inside the function that needs them (the wheel
    without extras imports every module, below)."""
    groups = PYPROJECT["project"]["optional-dependencies"]
    return {name: dist for g in groups if g != "dev" for name, dist in declared(g).items()}


def test_runtime_imports_are_exactly_the_declared_dependencies() -> None:
    imported = third_party_imports(REPO / "scheduler")
    runtime, optional = declared(None), optional_extras()
    undeclared = {
        name: sorted(files)
        for name, files in imported.items()
        if name not in runtime and name not in optional
    }
    unused = sorted(dist for name, dist in (runtime | optional).items() if name not in imported)
    assert undeclared == {}, "imported by scheduler/ but not in [project].dependencies"
    assert unused == [], "declared in [project].dependencies or an extra but imported nowhere"


def test_declared_names_map_to_the_right_distributions() -> None:
    """The import-name table is checked against the installed distributions' own files."""
    provided = importlib.metadata.packages_distributions()
    for group in (None, "dev"):
        for name, dist in declared(group).items():
            if dist in TOOLS:
                continue
            owners = {normalise(d) for d in provided.get(name, [])}
            assert normalise(dist) in owners, f"{dist} does not provide module {name!r}"


def test_test_imports_are_declared_and_dev_extras_are_used() -> None:
    imported = third_party_imports(REPO / "tests")
    for name, files in third_party_imports(REPO / "lattice_dev").items():
        imported.setdefault(name, set()).update(files)
    runtime, dev = declared(None), declared("dev")
    undeclared = {
        name: sorted(files)
        for name, files in imported.items()
        if name not in runtime and name not in dev
    }
    assert undeclared == {}, (
        "imported by tests/ or lattice_dev/ but declared neither at runtime nor in [dev]"
    )
    needed = set(imported) | set(third_party_imports(REPO / "scheduler"))
    unused = sorted(dist for name, dist in dev.items() if name not in needed and dist not in TOOLS)
    assert unused == [], "dev extras nothing imports and no tool needs"
    assert set(TOOLS) <= set(dev.values()), "a tool listed here is no longer a dev extra"


def test_dockerfile_ships_runtime_dependencies_only_as_non_root() -> None:
    dockerfile = (REPO / "Dockerfile").read_text()
    instructions = [ln.strip() for ln in dockerfile.splitlines() if ln.strip()[:1].isalpha()]
    assert not any("[dev]" in ln or ".[" in ln for ln in instructions)
    final_stage = dockerfile.rsplit("\nFROM ", 1)[1]
    users = [ln.split()[1] for ln in final_stage.splitlines() if ln.startswith("USER ")]
    assert users, "the final stage must set USER"
    assert users[-1].split(":")[0] not in ("0", "root")


@dataclass(frozen=True)
class Installed:
    venv: Path
    wheel: Path
    outside: Path
    """A working directory outside the checkout."""

    def run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
        env["PATH"] = f"{self.venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        env["VIRTUAL_ENV"] = str(self.venv)
        env["LATTICE_STATE_DIR"] = str(self.outside / "devcluster")  # never a developer's
        return subprocess.run(
            list(args),
            cwd=self.outside,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    @property
    def python(self) -> str:
        return str(self.venv / "bin" / "python")


def _run(args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False)


def _check(out: subprocess.CompletedProcess[str]) -> str:
    assert out.returncode == 0, f"{out.args}: exit {out.returncode}\n{out.stdout}\n{out.stderr}"
    return out.stdout


def _dependencies_venv(root: Path) -> Path:
    """A virtualenv holding exactly [project].dependencies, made once per dependency list
    and interpreter (under ``~/.cache/lattice/packaging``; older ones are removed): a
    dependency added or dropped makes a new one, so an undeclared import still fails."""
    deps = sorted(PYPROJECT["project"]["dependencies"])
    key = hashlib.sha256("\n".join([sys.version, *deps]).encode()).hexdigest()[:12]
    venv = root / f"venv-{key}"
    if (venv / "ready").is_file():
        return venv
    for old in root.glob("venv-*"):
        shutil.rmtree(old, ignore_errors=True)
    _check(_run([sys.executable, "-m", "venv", str(venv)], timeout=120))
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", *deps]
    _check(_run(pip, timeout=900))
    (venv / "ready").write_text("\n".join(deps) + "\n")
    return venv


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    """The wheel, built from a copy of what the Dockerfile copies, installed (its
    dependencies checked by pip) in a virtualenv of the declared dependencies only."""
    tmp = tmp_path_factory.mktemp("packaging")
    source = tmp / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source / name)
    shutil.copytree(
        REPO / "scheduler", source / "scheduler", ignore=shutil.ignore_patterns("__pycache__")
    )
    wheels = tmp / "wheels"
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels)]
    _check(_run([*pip_wheel, str(source)], timeout=300))
    (wheel,) = wheels.glob("lattice_scheduler-*.whl")
    root = Path.home() / ".cache" / "lattice" / "packaging"
    root.mkdir(parents=True, exist_ok=True)
    outside = tmp / "elsewhere"
    outside.mkdir()
    # One run at a time uses the shared virtualenv (another checkout's suite may be running).
    with (root / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        env = Installed(_dependencies_venv(root), wheel, outside)
        install = ["-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", str(wheel)]
        _check(env.run(env.python, *install, timeout=600))
        _check(env.run(env.python, "-m", "pip", "check"))
        yield env
        _check(env.run(env.python, "-m", "pip", "uninstall", "-q", "-y", "lattice-scheduler"))


def test_wheel_holds_the_runtime_package_only(installed: Installed) -> None:
    with zipfile.ZipFile(installed.wheel) as wheel:
        names = wheel.namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"scheduler"}  # lattice_dev (devcluster, demo, benchmarks) stays out
    dev_words = ("devcluster", "benchmarks", "demo", "bench", "naive", "oracle", "synthetic")
    dev_named = [n for n in names if any(w in Path(n).stem.split("_") for w in dev_words)]
    assert dev_named == [], "development modules in the wheel"
    shipped = {n for n in names if n.endswith(".py")}
    in_checkout = {
        str(p.relative_to(REPO)) for p in (REPO / "scheduler").rglob("*.py") if p.is_file()
    }
    assert shipped == in_checkout
    assert "scheduler/py.typed" in names


def test_installed_dependencies_are_consistent(installed: Installed) -> None:
    assert "No broken requirements" in _check(installed.run(installed.python, "-m", "pip", "check"))


def test_version(installed: Installed) -> None:
    version = _check(
        installed.run(
            installed.python,
            "-c",
            "import importlib.metadata as m; print(m.version('lattice-scheduler'))",
        )
    ).strip()
    assert version == PYPROJECT["project"]["version"]
    assert _check(installed.run("lattice", "--version")).strip() == f"lattice {version}"


@pytest.mark.parametrize(
    "command", ["run", "agent", "explain", "graph", "simulate", "selftest", "cleanup"]
)
def test_commands_start(installed: Installed, command: str) -> None:
    out = _check(installed.run("lattice", command, "--help"))
    assert out.startswith(f"usage: lattice {command}")


IMPORT_ALL: Final = """
import importlib, json, pkgutil, sys
import scheduler
failed = []
names = [
    m.name
    for m in pkgutil.walk_packages(scheduler.__path__, "scheduler.", onerror=failed.append)
]
for name in names:
    try:
        importlib.import_module(name)
    except BaseException as exc:
        failed.append(f"{name}: {type(exc).__name__}: {exc}")
print(json.dumps({"file": scheduler.__file__, "modules": ["scheduler", *names], "failed": failed}))
"""


def test_every_installed_module_imports_outside_the_checkout(installed: Installed) -> None:
    result: Mapping[str, object] = json.loads(
        _check(installed.run(installed.python, "-c", IMPORT_ALL))
    )
    assert result["failed"] == []
    assert str(result["file"]).startswith(str(installed.venv)), "imported the checkout"
    modules = result["modules"]
    assert isinstance(modules, list)
    expected = {
        ".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        for p in (REPO / "scheduler").rglob("*.py")
    }
    assert set(modules) == expected


@pytest.mark.parametrize("args", [["demo"], ["devcluster", "build"], ["devcluster", "up"]])
def test_dev_tools_say_what_they_need_without_the_checkout(
    installed: Installed, args: list[str]
) -> None:
    """From a wheel, the developer tools refuse in one line instead of a traceback."""
    out = installed.run("lattice", *args, timeout=120)
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert "Traceback" not in out.stderr
    assert "development tooling" in out.stderr, out.stderr
    assert "from a checkout" in out.stderr, out.stderr
