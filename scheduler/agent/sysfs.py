"""Small, forgiving file readers shared by the sysfs and procfs parsers.

sysfs is not a stable file format: attributes are missing on older kernels, unreadable
without privileges, or absent in containers that mount only part of ``/sys``. An agent that
crashes on one odd file reports nothing at all, so every read here returns ``None`` on
failure and records a human-readable warning in a :class:`Notes` collector instead of
raising. The caller decides the fallback; the warnings end up in the logs and in the
object's status.
"""

from __future__ import annotations

import errno
from pathlib import Path


class Notes:
    """Warnings gathered during one reading, in order, without duplicates."""

    def __init__(self) -> None:
        self._items: dict[str, None] = {}

    def warn(self, message: str) -> None:
        self._items.setdefault(message, None)

    @property
    def items(self) -> tuple[str, ...]:
        return tuple(self._items)


def read_text(path: Path, notes: Notes, *, missing_ok: bool = False) -> str | None:
    """The stripped contents of a small text file, or ``None`` (with a warning) if unreadable.

    ``missing_ok`` is for attributes whose absence is normal and carries meaning, so the
    caller falls back silently. EOPNOTSUPP counts as missing: it is how the kernel answers
    reads of a feature switched off at boot (``psi=0``).
    """
    try:
        return path.read_text(encoding="ascii", errors="replace").strip()
    except FileNotFoundError:
        if not missing_ok:
            notes.warn(f"{path}: missing")
        return None
    except OSError as exc:
        if exc.errno == errno.EOPNOTSUPP and missing_ok:
            return None
        notes.warn(f"{path}: unreadable ({exc.strerror or exc})")
        return None


def read_int(path: Path, notes: Notes, *, base: int = 10, missing_ok: bool = False) -> int | None:
    """An integer attribute (``base=16`` for ``0x10de``-style ids), or ``None``."""
    text = read_text(path, notes, missing_ok=missing_ok)
    if text is None:
        return None
    try:
        return int(text, base)
    except ValueError:
        notes.warn(f"{path}: not an integer: {text[:40]!r}")
        return None


def list_dir(path: Path, notes: Notes, *, missing_ok: bool = False) -> list[str]:
    """Sorted entry names of a directory; empty (with a warning) when it cannot be listed."""
    try:
        return sorted(p.name for p in path.iterdir())
    except FileNotFoundError:
        if not missing_ok:
            notes.warn(f"{path}: missing")
        return []
    except OSError as exc:
        notes.warn(f"{path}: cannot list ({exc.strerror or exc})")
        return []
