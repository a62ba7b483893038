"""Agent test fixtures: keep the logging configuration `lattice agent` may install local."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import structlog


@pytest.fixture(autouse=True)
def _restore_structlog() -> Iterator[None]:
    """`lattice agent` configures structlog when nobody has; do not leak that to other tests."""
    configured = structlog.is_configured()
    yield
    if not configured and structlog.is_configured():
        structlog.reset_defaults()
