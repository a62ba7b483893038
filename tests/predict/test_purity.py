"""scheduler.predict stays pure: stdlib maths, numpy and itself - no I/O, no Kubernetes."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import scheduler.predict

ALLOWED = {
    "__future__",
    "collections",
    "dataclasses",
    "enum",
    "itertools",
    "math",
    "typing",
    "zlib",
    "numpy",
    "scheduler",
}
PACKAGE = Path(scheduler.predict.__file__).parent


@pytest.mark.parametrize("path", sorted(PACKAGE.glob("*.py")), ids=lambda p: p.name)
def test_module_imports_only_pure_modules(path: Path) -> None:
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
        else:
            continue
        for name in names:
            assert name.split(".")[0] in ALLOWED, f"{path.name} imports {name}"
            if name.startswith("scheduler"):
                assert name.startswith("scheduler.predict"), f"{path.name} imports {name}"
