"""Logging: JSON lines, the fixed vocabulary, unknown keys raised (strict) or set aside."""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Iterator
from typing import Any

import pytest
import structlog

from scheduler.obs.logging import (
    META_KEYS,
    VOCABULARY,
    UnknownLogKeyError,
    attempt_logger,
    configure,
    new_logger,
    new_trace_id,
)


def lines(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_a_line_is_json_with_the_vocabulary() -> None:
    stream = io.StringIO()
    log = new_logger(stream, strict=True)
    log.info(
        "pod_filtered",
        pod="ns/web-0",
        gang="ns/train",
        node="n1",
        plugin="NodeResourcesFit",
        trace_id=new_trace_id(),
        cycle=7,
        queue="active",
        reason="insufficient cpu",
        duration_ms=0.25,
        attempt=2,
    )
    [line] = lines(stream)
    assert set(line) == VOCABULARY | {"timestamp", "level"}
    assert list(line)[:3] == ["timestamp", "level", "event"]
    assert (line["event"], line["level"], line["cycle"], line["duration_ms"]) == (
        "pod_filtered",
        "info",
        7,
        0.25,
    )
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+Z", line["timestamp"])


def test_strict_mode_rejects_unknown_keys() -> None:
    stream = io.StringIO()
    log = new_logger(stream, strict=True)
    with pytest.raises(UnknownLogKeyError) as caught:
        log.info("pod_bound", pod="ns/a", podName="a", zone="z1")
    assert caught.value.keys == ["podName", "zone"]
    assert stream.getvalue() == "", "a rejected line is not written"


def test_lenient_mode_sets_unknown_keys_aside() -> None:
    stream = io.StringIO()
    log = new_logger(stream)
    log.warning("pod_bound", pod="ns/a", zone="z1", podName="a")
    [line] = lines(stream)
    assert line["extra"] == {"podName": "a", "zone": "z1"}
    assert line["unknown_keys"] == ["podName", "zone"]
    assert set(line) <= VOCABULARY | META_KEYS


def test_attempt_logger_binds_one_attempt() -> None:
    stream = io.StringIO()
    base = new_logger(stream, strict=True)
    first = attempt_logger(base, pod="ns/a", attempt=1, cycle=10)
    second = attempt_logger(base, pod="ns/a", attempt=2, cycle=12, trace_id="ab" * 16)
    first.info("cycle_started")
    first.info("pod_bound", node="n1")
    second.info("cycle_started")
    one, two, three = lines(stream)
    assert one["trace_id"] == two["trace_id"] != three["trace_id"] == "ab" * 16
    assert (one["pod"], one["attempt"], one["cycle"]) == ("ns/a", 1, 10)
    assert (three["attempt"], three["cycle"]) == (2, 12)


def test_trace_ids_are_w3c_shaped_and_distinct() -> None:
    ids = {new_trace_id() for _ in range(100)}
    assert len(ids) == 100
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids)


def test_exceptions_are_rendered_into_the_line() -> None:
    stream = io.StringIO()
    log = new_logger(stream, strict=True)
    try:
        raise RuntimeError("binding refused")
    except RuntimeError:
        log.exception("bind_failed", pod="ns/a")
    [line] = lines(stream)
    assert line["level"] == "error"
    assert "RuntimeError: binding refused" in line["exception"]


def test_level_filters() -> None:
    stream = io.StringIO()
    log = new_logger(stream, level=logging.WARNING, strict=True)
    log.info("quiet")
    log.warning("loud")
    assert [line["event"] for line in lines(stream)] == ["loud"]


def test_context_variables_obey_the_vocabulary_too() -> None:
    stream = io.StringIO()
    log = new_logger(stream, strict=True)
    with structlog.contextvars.bound_contextvars(cycle=3):
        log.info("in_context")
    with (
        structlog.contextvars.bound_contextvars(shard="x"),
        pytest.raises(UnknownLogKeyError),
    ):
        log.info("bad_context")
    assert lines(stream)[0]["cycle"] == 3


@pytest.fixture
def restore_structlog() -> Iterator[None]:
    yield
    structlog.reset_defaults()


@pytest.mark.usefixtures("restore_structlog")
def test_configure_installs_the_pipeline_globally() -> None:
    stream = io.StringIO()
    configure(stream, strict=True)
    log = structlog.get_logger()
    log.info("scheduler_started", reason="leader")
    with pytest.raises(UnknownLogKeyError):
        log.info("x", nope=1)
    [line] = lines(stream)
    assert (line["event"], line["reason"]) == ("scheduler_started", "leader")
