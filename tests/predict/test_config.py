"""PredictConfig validation: every bad field is named, all at once."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from scheduler.predict import ConfigError, PredictConfig


def test_defaults_are_valid_and_filters_off() -> None:
    config = PredictConfig()
    assert config.cpu_threshold is None
    assert config.memory_threshold is None
    assert config.cpu_pressure_threshold is None
    assert config.memory_pressure_threshold is None


@pytest.mark.parametrize(
    ("field", "value"),
    [
        pytest.param("cpu_alpha", 0.0, id="alpha-zero"),
        pytest.param("memory_alpha", 1.5, id="alpha-above-one"),
        pytest.param("cpu_alpha", float("nan"), id="alpha-nan"),
        pytest.param("cpu_alpha", True, id="alpha-bool"),
        pytest.param("cpu_alpha", "0.5", id="alpha-string"),
        pytest.param("trend_beta", -0.1, id="beta-negative"),
        pytest.param("report_interval_s", 0.0, id="interval-zero"),
        pytest.param("horizon_s", -1.0, id="horizon-negative"),
        pytest.param("stale_after_s", 10.0, id="stale-below-interval"),
        pytest.param("settle_delay_s", -1.0, id="settle-negative"),
        pytest.param("max_future_skew_s", float("inf"), id="skew-inf"),
        pytest.param("cpu_request_scale", 0.0, id="scale-zero"),
        pytest.param("default_cpu_milli", -1, id="default-negative"),
        pytest.param("default_memory_bytes", 1.5, id="default-float"),
        pytest.param("inflight_min_weight", 0.0, id="min-weight-zero"),
        pytest.param("cpu_threshold", 0.0, id="threshold-zero"),
        pytest.param("memory_threshold", 1.2, id="threshold-above-one"),
        pytest.param("cpu_pressure_threshold", 101.0, id="psi-above-100"),
        pytest.param("cpu_weight", -1, id="weight-negative"),
        pytest.param("memory_weight", 0.5, id="weight-float"),
        pytest.param("cpu_target", 1.0, id="target-one"),
        pytest.param("memory_target", 0.0, id="target-zero"),
    ],
)
def test_invalid_field_is_named(field: str, value: Any) -> None:
    with pytest.raises(ConfigError, match=field) as info:
        PredictConfig(**{field: value})
    assert len(info.value.problems) == 1


def test_all_problems_are_reported_at_once() -> None:
    with pytest.raises(ConfigError) as info:
        PredictConfig(cpu_alpha=2.0, settle_delay_s=-1.0, cpu_threshold=3.0)
    assert len(info.value.problems) == 3
    assert isinstance(info.value, ValueError)


def test_both_weights_zero_is_rejected() -> None:
    with pytest.raises(ConfigError, match="both be 0"):
        PredictConfig(cpu_weight=0, memory_weight=0)


def test_replace_validates_too() -> None:
    config = PredictConfig()
    with pytest.raises(ConfigError, match="cpu_alpha"):
        dataclasses.replace(config, cpu_alpha=0.0)
    assert dataclasses.replace(config, cpu_alpha=1.0).cpu_alpha == 1.0


def test_integers_are_accepted_for_float_fields() -> None:
    # Values from a custom resource's spec may come as integers.
    assert PredictConfig(cpu_alpha=1, stale_after_s=60).stale_after_s == 60
