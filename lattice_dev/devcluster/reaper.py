"""Stop what a test run started once the run is gone, however it ended.

Why. The harness starts control planes detached (their own session, so a CLI-started one
outlives the CLI); a test run that is killed (SIGKILL, a CI timeout, an OOM) never reaches
its fixtures' teardown, and its etcd, kube-apiserver, kwok and ``lattice run`` processes
live on, holding ports and CPU for every later run on the machine.

How. The run puts a marker in its environment (:data:`MARKER_ENV`); every process it starts
inherits it (:func:`~lattice_dev.devcluster.process.start` passes the environment on). A
small watcher process, in a session of its own, waits for the run's process to end, then
signals every process whose environment carries the marker: SIGTERM, then SIGKILL for
those still there after a grace period. A run that ended cleanly has stopped its planes
already, so the sweep finds nothing; one that did not is cleaned up within seconds.

``python -m lattice_dev.devcluster.reaper PID MARKER``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path

MARKER_ENV = "LATTICE_RUN_MARKER"
GRACE_S = 5.0
POLL_S = 0.5


def _start_time(pid: int) -> str | None:
    """Field 22 of /proc/PID/stat: tells a recycled pid from the process we watch."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    return fields[19] if len(fields) > 19 else None


def marked(marker: str) -> list[int]:
    """Pids (other than this one) whose environment carries ``MARKER_ENV=marker``."""
    needle = f"{MARKER_ENV}={marker}".encode()
    me = os.getpid()
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            out.append(int(entry.name))
    return out


def sweep(marker: str, grace_s: float = GRACE_S) -> list[int]:
    """SIGTERM every marked process, SIGKILL the ones left after ``grace_s``; the pids
    signalled."""
    victims = marked(marker)
    for pid in victims:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and marked(marker):
        _reap_children()
        time.sleep(0.1)
    for pid in marked(marker):
        _signal(pid, signal.SIGKILL)
    return victims


def _signal(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def _reap_children() -> None:
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass


def watch(parent: int, marker: str) -> None:
    """Wait for ``parent`` to end, then :func:`sweep`."""
    started = _start_time(parent)
    while started is not None and _start_time(parent) == started:
        time.sleep(POLL_S)
    sweep(marker)


def spawn(marker: str, parent: int | None = None) -> int:
    """Start the watcher for ``parent`` (default: this process) in a session of its own, so
    a Ctrl-C or a group kill of the run does not take the watcher with it; its pid. Spawned
    without a Popen object, whose finaliser would warn that the watcher outlives it."""
    env = {k: v for k, v in os.environ.items() if k != MARKER_ENV}
    argv = [sys.executable, "-m", "lattice_dev.devcluster.reaper", str(parent or os.getpid())]
    return os.posix_spawn(
        sys.executable,
        [*argv, marker],
        env,
        file_actions=[
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
            (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
            (os.POSIX_SPAWN_DUP2, 1, 2),
        ],
        setsid=True,
    )


if __name__ == "__main__":
    watch(int(sys.argv[1]), sys.argv[2])
