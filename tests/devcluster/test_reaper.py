"""A killed test run leaves no process behind: the watcher signals every process that
carries the run's marker once the run's process is gone."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid

from lattice_dev.devcluster.reaper import MARKER_ENV, marked, spawn


def _gone(proc: subprocess.Popen[bytes], within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return True
        time.sleep(0.1)
    return False


def test_the_marked_processes_of_a_killed_run_are_stopped() -> None:
    marker = uuid.uuid4().hex
    env = {**os.environ, MARKER_ENV: marker}
    run = subprocess.Popen(["sleep", "600"])  # stands for the test run
    # A control-plane process that ignores SIGTERM (the SIGKILL after the grace period must
    # come), and a bystander without the marker.
    stubborn = subprocess.Popen(["sh", "-c", "trap '' TERM; while :; do sleep 0.2; done"], env=env)
    plain = subprocess.Popen(["sleep", "600"], env={**os.environ, MARKER_ENV: "other"})
    watcher = spawn(marker, parent=run.pid)
    watcher_status: int | None = None
    try:
        time.sleep(1.0)
        assert stubborn.pid in marked(marker)
        assert stubborn.poll() is None, "nothing is signalled while the run lives"
        run.send_signal(signal.SIGKILL)
        run.wait()
        assert _gone(stubborn, 20), "the marked process outlived the run"
        deadline = time.monotonic() + 20
        while watcher_status is None and time.monotonic() < deadline:
            pid, status = os.waitpid(watcher, os.WNOHANG)
            if pid:
                watcher_status = os.waitstatus_to_exitcode(status)
            time.sleep(0.1)
        assert watcher_status == 0, "the watcher ended cleanly after its sweep"
        assert plain.poll() is None, "an unmarked process was signalled"
    finally:
        for proc in (run, stubborn, plain):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if watcher_status is None:
            os.kill(watcher, signal.SIGKILL)
            os.waitpid(watcher, 0)
