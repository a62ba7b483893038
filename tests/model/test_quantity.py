"""Quantity parsing: exact values, Kubernetes rounding, typed errors, round-trips."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.model.errors import InvalidObjectError
from scheduler.model.quantity import INT64_MAX, Quantity, parse_int64, to_int64


@pytest.mark.parametrize(
    ("text", "milli", "value"),
    [
        pytest.param("0", 0, 0, id="zero"),
        pytest.param("1", 1000, 1, id="plain"),
        pytest.param("500m", 500, 1, id="milli-rounds-value-up"),
        pytest.param("0.5", 500, 1, id="fraction"),
        pytest.param(".5", 500, 1, id="leading-dot"),
        pytest.param("1.", 1000, 1, id="trailing-dot"),
        pytest.param("+3m", 3, 1, id="plus-sign"),
        pytest.param("100n", 1, 1, id="nano-rounds-up"),
        pytest.param("1u", 1, 1, id="micro-rounds-up"),
        pytest.param("0.1n", 1, 1, id="finer-than-nano-rounds-up"),
        pytest.param("1500u", 2, 1, id="micro-to-milli-ceil"),
        pytest.param("1k", 1_000_000, 1000, id="kilo"),
        pytest.param("1M", 10**9, 10**6, id="mega"),
        pytest.param("1G", 10**12, 10**9, id="giga"),
        pytest.param("2T", 2 * 10**15, 2 * 10**12, id="tera"),
        pytest.param("1P", 10**18, 10**15, id="peta"),
        pytest.param("1E", 10**21, 10**18, id="exa"),
        pytest.param("1Ki", 1024_000, 1024, id="kibi"),
        pytest.param("1Mi", 1024**2 * 1000, 1024**2, id="mebi"),
        pytest.param("1.5Gi", 1536 * 1024**2 * 1000, 1536 * 1024**2, id="fractional-gibi"),
        pytest.param("1Ti", 1024**4 * 1000, 1024**4, id="tebi"),
        pytest.param("1Pi", 1024**5 * 1000, 1024**5, id="pebi"),
        pytest.param("1Ei", 1024**6 * 1000, 1024**6, id="exbi"),
        pytest.param("0.1Ki", 102_400, 103, id="fractional-kibi-rounds-up"),
        pytest.param("1e3", 1_000_000, 1000, id="exponent"),
        pytest.param("1E3", 1_000_000, 1000, id="capital-exponent"),
        pytest.param("1E-3", 1, 1, id="negative-exponent"),
        pytest.param("12e-3", 12, 1, id="negative-exponent-milli"),
        pytest.param("1e+3", 1_000_000, 1000, id="explicit-plus-exponent"),
        pytest.param("1.5e2", 150_000, 150, id="fraction-with-exponent"),
        pytest.param("-1", -1000, -1, id="negative"),
        pytest.param("-500m", -500, 0, id="negative-milli-ceil"),
        pytest.param("007", 7000, 7, id="leading-zeros"),
        pytest.param(2, 2000, 2, id="json-integer"),
        pytest.param(0.25, 250, 1, id="json-float"),
        pytest.param(1e-07, 1, 1, id="json-float-exponent"),
    ],
)
def test_parse(text: str | int | float, milli: int, value: int) -> None:
    q = Quantity.parse(text)
    assert q.milli_value() == milli
    assert q.value() == value


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("", id="empty"),
        pytest.param(".", id="dot"),
        pytest.param("-", id="sign-only"),
        pytest.param("1K", id="capital-k-is-not-a-suffix"),
        pytest.param("1ki", id="lowercase-binary"),
        pytest.param("1e", id="bare-exponent"),
        pytest.param("1Ee3", id="two-exponent-letters"),
        pytest.param("1 ", id="trailing-space"),
        pytest.param(" 1", id="leading-space"),
        pytest.param("abc", id="letters"),
        pytest.param("1..2", id="two-dots"),
        pytest.param("1e99999999999", id="exponent-too-large"),
        pytest.param("1e9223372036854775808", id="exponent-not-int64"),
        pytest.param("1Mii", id="unknown-suffix"),
        pytest.param(True, id="bool"),
        pytest.param(None, id="null"),
        pytest.param(float("inf"), id="infinite"),
    ],
)
def test_malformed_raises_typed_error(text: object) -> None:
    with pytest.raises(InvalidObjectError) as info:
        Quantity.parse(text, field="spec.containers[0].resources.requests[cpu]")
    assert info.value.field == "spec.containers[0].resources.requests[cpu]"
    assert "invalid spec.containers[0].resources.requests[cpu]" in str(info.value)


def test_sum_is_exact_before_rounding() -> None:
    # kube-scheduler sums Quantities, then rounds: 0.4m + 0.4m + 0.4m is 1.2m -> 2m, not 3m.
    total = Quantity.parse("400u") + Quantity.parse("400u") + Quantity.parse("400u")
    assert total.milli_value() == 2


def test_int64_overflow_is_a_typed_error() -> None:
    assert to_int64(INT64_MAX, field="f", raw="x") == INT64_MAX
    with pytest.raises(InvalidObjectError, match="64-bit"):
        to_int64(Quantity.parse("9223372036854775807").milli_value(), field="cpu", raw="x")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("42", 42, id="plain"),
        pytest.param("-7", -7, id="negative"),
        pytest.param("+7", 7, id="plus"),
        pytest.param("9223372036854775807", INT64_MAX, id="max"),
        pytest.param("9223372036854775808", None, id="overflow"),
        pytest.param("1_000", None, id="underscore"),
        pytest.param(" 1", None, id="space"),
        pytest.param("1.0", None, id="float"),
        pytest.param("", None, id="empty"),
    ],
)
def test_parse_int64_matches_go(text: str, expected: int | None) -> None:
    assert parse_int64(text) == expected


nanos = st.integers(min_value=-(10**30), max_value=10**30)


@given(nanos)
def test_format_then_parse_round_trips(value: int) -> None:
    q = Quantity(value)
    assert Quantity.parse(str(q)) == q


@given(st.integers(min_value=0, max_value=2**40))
def test_binary_and_decimal_suffixes(n: int) -> None:
    assert Quantity.parse(f"{n}Ki").value() == n * 1024
    assert Quantity.parse(f"{n}Mi").value() == n * 1024**2
    assert Quantity.parse(f"{n}k").value() == n * 1000
    assert Quantity.parse(f"{n}M") == Quantity.parse(f"{n}e6")
    assert Quantity.parse(f"{n}m") == Quantity.parse(f"{n}e-3")
    assert Quantity.parse(f"{n}") == Quantity.parse(f"{n * 1000}m")


@given(st.integers(min_value=0, max_value=10**12), st.integers(min_value=0, max_value=9))
def test_decimal_fraction_equals_milli(whole: int, tenth: int) -> None:
    assert Quantity.parse(f"{whole}.{tenth}") == Quantity.parse(f"{whole * 1000 + tenth * 100}m")


@given(st.integers(min_value=1, max_value=10**6))
def test_tiny_cpu_rounds_up_to_one_millicore(n: int) -> None:
    # Anything above zero and below a millicore costs a whole millicore (MilliValue is ceil).
    assert Quantity.parse(f"{n}n").milli_value() == -(-n // 10**6)
    assert Quantity.parse(f"{n}e-12").milli_value() == 1


def test_a_remembered_string_parses_as_before_and_a_bad_one_raises_every_time() -> None:
    """Valid strings are remembered (a cluster's pods repeat a few); invalid ones never
    are, so the second parse of a bad value is refused as the first was."""
    first = Quantity.parse("137Mi", field="f")
    assert Quantity.parse("137Mi", field="g") == first == Quantity(137 * 2**20 * 10**9)
    for field in ("a", "b"):
        with pytest.raises(InvalidObjectError) as err:
            Quantity.parse("12 GiB", field=field)
        assert err.value.field == field
