"""Start, check and stop the control plane's processes by pid.

A process is only signalled when its /proc cmdline still names the binary we
started, so a recycled pid never kills a stranger.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from pathlib import Path


def free_port() -> int:
    """A free TCP port on loopback (the kernel's choice; a race is possible but rare)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def start(binary: Path, args: list[str], log: Path, env: dict[str, str] | None = None) -> int:
    """Start a detached process writing to ``log``; return its pid.

    posix_spawn rather than Popen: the process outlives this Python object (the
    CLI exits, the cluster keeps running), and we track it by pid alone.
    """
    if not binary.is_file():
        raise FileNotFoundError(f"binary not found: {binary}")
    log.parent.mkdir(parents=True, exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
    pid = os.posix_spawn(
        str(binary),
        [str(binary), *args],
        dict(os.environ) if env is None else env,
        file_actions=[
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
            (os.POSIX_SPAWN_OPEN, 1, str(log), flags, 0o644),
            (os.POSIX_SPAWN_DUP2, 1, 2),
        ],
        setsid=True,  # own session: survives the CLI that started it, and its Ctrl-C
    )
    _wait_exec(pid, str(binary))
    return pid


def _wait_exec(pid: int, argv0: str) -> None:
    """Wait until the child has exec'd and shows its own command line.

    Until the exec, /proc shows our own Python there; during it, the exe link
    changes before the new argument pages exist, so cmdline reads empty for a
    moment. A liveness check by name in either window would report a healthy
    process as gone, so wait for the new cmdline itself.
    """
    deadline = time.monotonic() + 10
    expected = argv0.encode() + b"\0"
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(expected):
                return
        except OSError:
            pass
        if _state(pid) in (None, "Z"):
            return  # it really ended: the caller's liveness check reports it with the log
        time.sleep(0.005)


def _state(pid: int) -> str | None:
    """The one-letter process state from /proc (R, S, Z ...), None if there is no such pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[-1].split()[0]


def is_running(pid: int, binary_name: str) -> bool:
    """True when ``pid`` is alive and is still the binary we started.

    ``binary_name`` is argv[0]'s base name, optionally followed by ``|`` and a
    string its command line must contain (for interpreters: ``python3|scheduler.cli``).
    """
    binary_name, _, marker = binary_name.partition("|")
    state = _state(pid)
    if state is None:
        return False
    if state == "Z":  # it has exited; only its parent has not reaped it yet
        _reap(pid)
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    argv0 = cmdline.split(b"\0", 1)[0].decode(errors="replace")
    return Path(argv0).name == binary_name and marker.encode() in cmdline


def exit_status(pid: int) -> str:
    """How a child of ours ended ("exit code 1", "killed by SIGKILL"), if we can tell."""
    try:
        got, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return "exit status unknown (already reaped)"
    if got == 0:
        return "still running"
    if os.WIFSIGNALED(status):
        return f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exit code {os.waitstatus_to_exitcode(status)}"


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def stop(pid: int, binary_name: str, timeout: float = 10.0) -> bool:
    """SIGTERM, then SIGKILL after ``timeout``; return True if it was running."""
    if not is_running(pid, binary_name):
        return False
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _reap(pid)
        if not is_running(pid, binary_name):
            return True
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)
    for _ in range(50):
        _reap(pid)
        if not is_running(pid, binary_name):
            break
        time.sleep(0.1)
    return True


def log_tail(log: Path, lines: int = 30) -> str:
    try:
        return "".join(log.read_text(errors="replace").splitlines(keepends=True)[-lines:])
    except OSError:
        return "(no log)"
