"""/proc/stat and /proc/meminfo parsing, and the window arithmetic that makes a NodeLoad."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from scheduler.agent.load import (
    CpuTimes,
    LoadSample,
    LoadWindow,
    MemoryUse,
    cpu_interval,
    millicores,
    parse_meminfo,
    parse_stat,
    read_sample,
)
from scheduler.agent.sysfs import Notes
from tests.agent.trees import BROKEN, NO_NUMA, TWO_SOCKET, VM, roots

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
GIB = 1 << 30


# --- parsing ---------------------------------------------------------------------------------


def test_parse_stat_aggregate_line_and_online_cpus() -> None:
    times = parse_stat(
        "cpu  100 20 30 800 40 5 6 7 50 3\n"
        "cpu0 50 10 15 400 20 2 3 3 25 1\n"
        "cpu1 50 10 15 400 20 3 3 4 25 2\n"
        "intr 12345 0 0\nctxt 999\nbtime 1740830400\n"
    )
    # guest/guest_nice are inside user/nice already: not in the total
    assert times == CpuTimes(busy=100 + 20 + 30 + 5 + 6 + 7, total=1008, online_cpus=2)


def test_parse_stat_old_kernel_with_four_fields() -> None:
    assert parse_stat("cpu  10 0 5 85\ncpu0 10 0 5 85\n") == CpuTimes(15, 100, 1)


def test_parse_stat_without_per_cpu_lines() -> None:
    assert parse_stat("cpu  10 0 5 85 0 0 0 0\n").online_cpus == 0


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("", id="empty"),
        pytest.param("cpu0 1 2 3 4\nintr 5\n", id="no-aggregate"),
        pytest.param("cpu  1 2 3\n", id="too-few-fields"),
        pytest.param("cpu  1 x 3 4 5\n", id="garbage-number"),
        pytest.param("cpu  1 -2 3 4 5\n", id="negative"),
    ],
)
def test_parse_stat_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="cpu"):
        parse_stat(text)


def test_parse_meminfo() -> None:
    mem = parse_meminfo(
        "MemTotal:       16000000 kB\nMemFree:         1000000 kB\n"
        "MemAvailable:    4000000 kB\nActive(anon):     300000 kB\nHugePages_Total:       0\n"
    )
    assert mem == MemoryUse(total_bytes=16000000 * 1024, available_bytes=4000000 * 1024)
    assert mem.used_bytes == 12000000 * 1024


def test_meminfo_available_above_total_is_zero_used() -> None:
    assert MemoryUse(total_bytes=10, available_bytes=11).used_bytes == 0


@pytest.mark.parametrize(
    ("text", "match"),
    [
        pytest.param("MemTotal: 100 kB\nMemFree: 50 kB\n", "MemAvailable", id="pre-3.14"),
        pytest.param("MemAvailable: 100 kB\n", "MemTotal", id="no-total"),
        pytest.param("MemTotal: 0 kB\nMemAvailable: 0 kB\n", "MemTotal is 0", id="zero-total"),
        pytest.param("garbage\n", "MemTotal", id="garbage"),
    ],
)
def test_parse_meminfo_rejects(text: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_meminfo(text)


@pytest.mark.parametrize(("name", "cpus"), [(TWO_SOCKET, 96), (VM, 8), (NO_NUMA, 4)])
def test_read_sample_from_fixtures(name: str, cpus: int) -> None:
    notes = Notes()
    sample = read_sample(roots(name)[1], notes, time=T0, monotonic=1.0)
    assert notes.items == ()
    assert sample.cpu is not None
    assert sample.memory is not None
    assert sample.cpu.online_cpus == cpus
    assert 0 < sample.cpu.busy < sample.cpu.total
    assert 0 < sample.memory.used_bytes < sample.memory.total_bytes
    assert (sample.time, sample.monotonic) == (T0, 1.0)


def test_read_sample_from_broken_fixture_warns() -> None:
    notes = Notes()
    sample = read_sample(roots(BROKEN)[1], notes, time=T0, monotonic=0.0)
    assert (sample.cpu, sample.memory) == (None, None)
    assert any("proc/stat" in w and "not a cpu line" in w for w in notes.items), notes.items
    assert any("proc/meminfo" in w and "no MemAvailable" in w for w in notes.items), notes.items


def test_read_sample_missing_files_warns(tmp_path: Path) -> None:
    notes = Notes()
    sample = read_sample(tmp_path, notes, time=T0, monotonic=0.0)
    assert (sample.cpu, sample.memory) == (None, None)
    assert [w.split(": ")[-1] for w in notes.items] == ["missing", "missing"]


# --- window arithmetic -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("before", "after", "expected"),
    [
        pytest.param(CpuTimes(100, 1000, 4), CpuTimes(400, 2000, 4), (300, 1000), id="normal"),
        pytest.param(CpuTimes(100, 1000, 4), CpuTimes(100, 1000, 4), None, id="zero-delta"),
        pytest.param(CpuTimes(900, 9000, 4), CpuTimes(10, 100, 4), None, id="reset"),
        pytest.param(CpuTimes(500, 1000, 4), CpuTimes(400, 1100, 4), (0, 100), id="busy-back"),
        pytest.param(CpuTimes(100, 1000, 4), CpuTimes(900, 1100, 4), (100, 100), id="busy-over"),
    ],
)
def test_cpu_interval(before: CpuTimes, after: CpuTimes, expected: tuple[int, int] | None) -> None:
    assert cpu_interval(before, after) == expected


@pytest.mark.parametrize(
    ("busy", "total", "cpus", "milli"),
    [
        (300, 1000, 4, 1200),
        (0, 1000, 4, 0),
        (1000, 1000, 96, 96000),
        (1, 3, 1, 333),
        (2, 3, 1, 667),  # half up
        (1, 2000, 1, 1),  # 0.5 -> 1
    ],
)
def test_millicores(busy: int, total: int, cpus: int, milli: int) -> None:
    assert millicores(busy, total, cpus) == milli


class Samples:
    """Builds samples of a 4-CPU, 16 GiB machine one second of ticks (USER_HZ 100) apart."""

    CPUS = 4

    def __init__(self) -> None:
        self.t = 0.0
        self.busy = 0
        self.total = 0

    def next(
        self,
        utilisation: float = 0.5,
        *,
        seconds: float = 5.0,
        used_gib: int | None = 4,
        cpu: bool = True,
    ) -> LoadSample:
        self.t += seconds
        ticks = round(seconds * 100 * self.CPUS)
        self.total += ticks
        self.busy += round(ticks * utilisation)
        return LoadSample(
            time=T0 + timedelta(seconds=self.t),
            monotonic=self.t,
            cpu=CpuTimes(self.busy, self.total, self.CPUS) if cpu else None,
            memory=MemoryUse(16 * GIB, (16 - used_gib) * GIB) if used_gib is not None else None,
        )


def test_first_window_of_two_samples() -> None:
    s, window = Samples(), LoadWindow()
    window.add(s.next(0.0))
    window.add(first := s.next(0.25))
    load, warnings = window.take()
    assert warnings == ()
    assert load is not None
    assert (load.samples, load.window_seconds, load.sample_time) == (2, 5.0, first.time)
    assert (load.cpu_used_milli, load.cpu_capacity_milli) == (1000, 4000)
    assert load.cpu_peak_milli is None  # one interval: the peak is the mean
    assert (load.mem_used_bytes, load.mem_capacity_bytes) == (4 * GIB, 16 * GIB)
    assert load.to_spec()["cpuPercent"] == 25


def test_windows_chain_without_gaps_mean_and_peak() -> None:
    s, window = Samples(), LoadWindow()
    window.add(s.next())
    window.add(s.next())
    window.take()
    for utilisation, used in [(0.1, 5), (0.7, 6), (0.4, 3)]:
        window.add(s.next(utilisation, used_gib=used))
    load, _ = window.take()
    assert load is not None
    assert (load.samples, load.window_seconds) == (3, 15.0)  # measured from the previous end
    assert load.cpu_used_milli == 1600  # (0.1 + 0.7 + 0.4) / 3 of 4000
    assert load.cpu_peak_milli == 2800
    assert load.mem_used_bytes == 3 * GIB  # the latest, not the mean
    assert window.pending == 0


def test_uneven_intervals_weigh_by_time() -> None:
    s, window = Samples(), LoadWindow()
    window.add(s.next())
    window.add(s.next(1.0, seconds=3))
    window.add(s.next(0.0, seconds=1))
    load, _ = window.take()
    assert load is not None
    assert load.cpu_used_milli == 3000  # 3 s of 100 % and 1 s of 0 %
    assert load.window_seconds == 4.0


def test_counter_reset_mid_window_is_skipped_never_negative() -> None:
    s, window = Samples(), LoadWindow()
    window.add(s.next())
    window.add(s.next(0.5))
    s.busy, s.total = 0, 0  # e.g. a restored checkpoint: counters start over
    window.add(s.next(0.9))
    window.add(s.next(0.9))
    load, _ = window.take()
    assert load is not None
    assert load.cpu_used_milli == 2800  # (0.5 x 2000 + 0.9 x 2000) / 4000 of 4000
    assert load.cpu_peak_milli == 3600
    assert load.cpu_used_milli >= 0


def test_counters_that_never_advance_give_no_load_and_say_so() -> None:
    window = LoadWindow()
    still = LoadSample(T0, 0.0, CpuTimes(10, 100, 4), MemoryUse(GIB, GIB // 2))
    window.add(still)
    window.add(LoadSample(T0, 5.0, CpuTimes(10, 100, 4), MemoryUse(GIB, GIB // 2)))
    load, warnings = window.take()
    assert load is None
    assert any("did not advance" in w for w in warnings)


def test_one_sample_gives_no_load_quietly() -> None:
    window = LoadWindow()
    window.add(Samples().next())
    assert window.take() == (None, ())
    assert window.take() == (None, ())  # and an empty window neither


def test_memory_from_the_latest_sample_that_had_it() -> None:
    s, window = Samples(), LoadWindow()
    window.add(s.next(used_gib=2))
    window.add(s.next(used_gib=None))
    load, _ = window.take()
    assert load is not None
    assert load.mem_used_bytes == 2 * GIB


def test_no_memory_no_load() -> None:
    s, window = Samples(), LoadWindow()
    window.add(s.next(used_gib=None))
    window.add(s.next(used_gib=None))
    assert window.take()[0] is None


def test_cpu_missing_in_one_sample_bridges_the_gap() -> None:
    s, window = Samples(), LoadWindow()
    window.add(s.next(0.5))
    window.add(s.next(0.5, cpu=False))
    window.add(s.next(0.5))
    load, _ = window.take()
    assert load is not None
    assert load.cpu_used_milli == 2000
    assert load.cpu_peak_milli is None  # one usable interval


def test_fallback_cpus_when_stat_lists_none() -> None:
    window = LoadWindow()
    window.add(LoadSample(T0, 0.0, CpuTimes(0, 0, 0), MemoryUse(GIB, GIB)))
    window.add(LoadSample(T0, 5.0, CpuTimes(500, 1000, 0), MemoryUse(GIB, GIB)))
    load, _ = window.take(fallback_cpus=2)
    assert load is not None
    assert (load.cpu_used_milli, load.cpu_capacity_milli) == (1000, 2000)
    window.add(LoadSample(T0, 10.0, CpuTimes(600, 2000, 0), MemoryUse(GIB, GIB)))
    load, warnings = window.take()
    assert load is None
    assert any("no cpuN lines" in w for w in warnings)


def test_warnings_belong_to_their_window(tmp_path: Path) -> None:
    window = LoadWindow()
    window.add(read_sample(tmp_path, window.notes, time=T0, monotonic=0.0))
    assert window.take()[1] != ()
    assert window.take()[1] == ()
