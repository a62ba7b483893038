"""Start, check and stop the control plane's processes by pid.

A process is only signalled when its /proc cmdline still names the binary we
started, so a recycled pid never kills a stranger.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import time
from pathlib import Path

_handed_out: set[int] = set()


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A free TCP port on loopback, below the kernel's ephemeral range.

    A port the kernel hands out (bind to 0) can be taken again by any outgoing
    connection (the API server opens many to etcd) before our component binds it;
    a port below the ephemeral range is only ever taken by another listener.
    """
    low = _ephemeral_low()
    first = 20000 if low > 24000 else 10000
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(first, max(first + 1, low))
        if port in _handed_out:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:  # a crowded range
        sock.bind(("127.0.0.1", 0))
        chosen: int = sock.getsockname()[1]
        return chosen


def port_taken(log: Path) -> bool:
    """Whether a component's log says it exited because its port was in use."""
    try:
        with log.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 16384))
            return b"address already in use" in fh.read()
    except OSError:
        return False


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
