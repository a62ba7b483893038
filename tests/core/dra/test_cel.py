"""DRA CEL selectors: the Kubernetes device environment on cel-expr-python."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.core.dra.cel import CelError, SelectorCompiler, Semver
from scheduler.core.dra.objects import VERDICTS_PER_DEVICE, Device
from scheduler.model.errors import InvalidObjectError
from scheduler.model.quantity import Quantity

COMPILER = SelectorCompiler()
DRIVER = "gpu.example.com"


def gpu(**extra: Any) -> Device:
    body: dict[str, Any] = {
        "name": "gpu-0",
        "attributes": {
            "model": {"string": "A100"},
            "index": {"int": 3},
            "healthy": {"bool": True},
            "driverVersion": {"version": "1.2.3+build.7"},
            "resource.kubernetes.io/pcieRoot": {"string": "pci0000:00"},
        },
        "capacity": {"memory": {"value": "1Gi"}},
        **extra,
    }
    return Device.from_api(body, driver=DRIVER, path="device")


def verdict(expression: str, device: Device | None = None) -> bool:
    return (device or gpu()).matches(expression, COMPILER)


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        pytest.param('device.driver == "gpu.example.com"', True, id="driver"),
        pytest.param('device.attributes["gpu.example.com"].model == "A100"', True, id="bare-name"),
        pytest.param('device.attributes["gpu.example.com"].index > 2', True, id="int"),
        pytest.param('device.attributes["gpu.example.com"].healthy', True, id="bool"),
        pytest.param(
            'device.attributes["resource.kubernetes.io"].pcieRoot == "pci0000:00"',
            True,
            id="qualified-name",
        ),
        pytest.param(
            'device.attributes["other.example.com"].size() == 0', True, id="unknown-domain"
        ),
        pytest.param(
            '"model" in device.attributes["other.example.com"]', False, id="unknown-domain-in"
        ),
        pytest.param('has(device.attributes["gpu.example.com"].uuid)', False, id="has-missing"),
        pytest.param(
            'device.attributes["gpu.example.com"].index == "3"', False, id="heterogeneous"
        ),
        pytest.param('device.attributes["gpu.example.com"].index < 3.5', True, id="cross-numeric"),
        pytest.param(
            'cel.bind(g, device.attributes["gpu.example.com"], g.model == "A100" && g.index == 3)',
            True,
            id="bind",
        ),
        pytest.param(
            'device.attributes["gpu.example.com"].model.lowerAscii().startsWith("a1")',
            True,
            id="strings",
        ),
        pytest.param(
            'device.attributes["gpu.example.com"].model.matches("^A[0-9]+$")', True, id="regex"
        ),
        pytest.param(
            'device.attributes["gpu.example.com"].model.find("[0-9]+") == "100"', True, id="find"
        ),
        pytest.param(
            'device.capacity["gpu.example.com"].memory == quantity("1024Mi")', True, id="q-eq"
        ),
        pytest.param(
            'device.capacity["gpu.example.com"].memory.compareTo(quantity("40Gi")) < 0',
            True,
            id="q-compare",
        ),
        pytest.param(
            'device.capacity["gpu.example.com"].memory.isGreaterThan(quantity("1G"))',
            True,
            id="q-greater",
        ),
        pytest.param(
            'device.capacity["gpu.example.com"].memory.isLessThan(quantity("1Gi"))',
            False,
            id="q-not-less",
        ),
        pytest.param(
            'device.capacity["gpu.example.com"].memory.add(quantity("1Gi")) == quantity("2Gi")',
            True,
            id="q-add",
        ),
        pytest.param('quantity("1500m").sub(1) == quantity("500m")', True, id="q-sub-int"),
        pytest.param(
            'quantity("1500m").sign() == 1 && quantity("-1").sign() == -1', True, id="sign"
        ),
        pytest.param(
            'quantity("2k").isInteger() && quantity("2k").asInteger() == 2000', True, id="int-q"
        ),
        pytest.param('!quantity("500m").isInteger()', True, id="not-integer"),
        pytest.param('quantity("500m").asApproximateFloat() == 0.5', True, id="float"),
        pytest.param('isQuantity("1Gi") && !isQuantity("200K")', True, id="is-quantity"),
        pytest.param(
            'device.attributes["gpu.example.com"].driverVersion == semver("1.2.3")',
            True,
            id="semver-eq-ignores-build",
        ),
        pytest.param(
            'device.attributes["gpu.example.com"].driverVersion.isGreaterThan(semver("1.2.0"))',
            True,
            id="semver-greater",
        ),
        pytest.param('semver("1.2.3-alpha").isLessThan(semver("1.2.3"))', True, id="prerelease"),
        pytest.param(
            'semver("1.2.3-alpha.2").compareTo(semver("1.2.3-alpha.10")) == -1',
            True,
            id="pre-numeric",
        ),
        pytest.param('semver("v1.02", true) == semver("1.2.0")', True, id="normalize"),
        pytest.param(
            'isSemver("1.2.3") && !isSemver("1.2") && isSemver("v1.2", true)', True, id="is-semver"
        ),
        pytest.param(
            'cel.bind(v, semver("1.2.3"), v.major() == 1 && v.minor() == 2 && v.patch() == 3)',
            True,
            id="parts",
        ),
        pytest.param(
            'device.attributes["gpu.example.com"].driverVersion == "1.2.3"',
            False,
            id="semver-not-string",
        ),
        pytest.param(
            "sets.contains([1, 2, 3], [1, 3]) && !sets.intersects([1], [2])", True, id="sets"
        ),
        pytest.param(
            "[3, 1, 2].max() == 3 && [1, 2].isSorted() && [1, 2, 3].sum() == 6", True, id="lists"
        ),
        pytest.param(
            '["a", "b", "a"].lastIndexOf("a") == 2 && [1].indexOf(2) == -1', True, id="index"
        ),
    ],
)
def test_selector_semantics(expression: str, expected: bool) -> None:
    assert verdict(expression) is expected


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        pytest.param('device.attributes["gpu.example.com"].uuid == "x"', "uuid", id="unknown-id"),
        pytest.param(
            'quantity("200K") == quantity("1")', "quantities must be valid", id="bad-quantity"
        ),
        pytest.param('semver("1.2") == semver("1.2.0")', "invalid semver", id="bad-semver"),
        pytest.param(
            'quantity("1").isGreaterThan(semver("1.0.0"))',
            "expected a quantity",
            id="mixed-compare",
        ),
        pytest.param(
            'device.attributes["gpu.example.com"].model > 1', "overload", id="no-overload"
        ),
        pytest.param('device.attributes["gpu.example.com"].index', "not a bool", id="not-bool"),
        pytest.param("device.driver ==", "compile", id="syntax"),
    ],
)
def test_selector_errors(expression: str, message: str) -> None:
    with pytest.raises(CelError, match=message):
        verdict(expression)


def test_error_after_a_short_circuit_is_no_error() -> None:
    """CEL's commutative || and &&: a true (false) branch absorbs the other's error."""
    assert verdict('device.attributes["gpu.example.com"].uuid == "x" || device.driver != ""')
    assert not verdict('device.driver == "" && device.attributes["gpu.example.com"].uuid == "x"')


def test_a_bad_version_attribute_fails_every_selector_of_the_device() -> None:
    device = gpu(attributes={"v": {"version": "not-a-version"}})
    with pytest.raises(CelError, match="invalid semver"):
        verdict("true", device)


def test_verdicts_are_cached_per_device_and_expression() -> None:
    compiler = SelectorCompiler()
    devices = [gpu() for _ in range(5)]
    expression = 'device.attributes["gpu.example.com"].index == 3'
    for d in devices:
        assert d.matches(expression, compiler)
        assert d.matches(expression, compiler)
        assert d.verdicts == {expression: True}
    assert len(compiler) == 1
    failing = 'device.attributes["gpu.example.com"].nope'
    with pytest.raises(CelError):
        devices[0].matches(failing, compiler)
    assert isinstance(devices[0].verdicts[failing], CelError)
    with pytest.raises(CelError):
        devices[0].matches(failing, compiler)


_QUANTITY = st.builds(
    lambda sign, digits, frac, suffix: f"{sign}{digits}{'.' + frac if frac else ''}{suffix}",
    st.sampled_from(["", "-"]),
    st.integers(min_value=0, max_value=10**6).map(str),
    st.one_of(st.just(""), st.integers(min_value=0, max_value=999).map(str)),
    st.sampled_from(["", "m", "k", "M", "G", "Ki", "Mi", "Gi", "e3", "E-2", "n", "u"]),
)


@given(_QUANTITY, _QUANTITY)
def test_quantity_order_and_equality_agree_with_exact_quantities(a: str, b: str) -> None:
    qa, qb = Quantity.parse(a), Quantity.parse(b)
    expected = (qa.nanos > qb.nanos) - (qa.nanos < qb.nanos)
    assert verdict(f'quantity("{a}").compareTo(quantity("{b}")) == {expected}')
    assert verdict(f'quantity("{a}") == quantity("{b}")') is (expected == 0)
    assert verdict(f'quantity("{a}").isGreaterThan(quantity("{b}"))') is (expected > 0)


_IDENT = st.one_of(
    st.integers(min_value=0, max_value=20), st.sampled_from(["alpha", "beta", "rc", "x-1"])
)
_VERSION = st.builds(
    Semver,
    st.integers(min_value=0, max_value=3),
    st.integers(min_value=0, max_value=3),
    st.integers(min_value=0, max_value=3),
    st.lists(_IDENT, max_size=2).map(tuple),
)


@given(_VERSION, _VERSION)
def test_semver_order_is_a_total_order_matching_python(a: Semver, b: Semver) -> None:
    expected = (a > b) - (a < b)
    assert Semver.parse(str(a)) == a
    assert verdict(f'semver("{a}").compareTo(semver("{b}")) == {expected}')
    assert verdict(f'semver("{b}").compareTo(semver("{a}")) == {-expected}')


def test_semver_precedence_follows_the_spec() -> None:
    ordered = ["1.0.0-alpha", "1.0.0-alpha.1", "1.0.0-alpha.beta", "1.0.0-beta", "1.0.0-beta.2",
               "1.0.0-beta.11", "1.0.0-rc.1", "1.0.0", "2.0.0", "2.1.0", "2.1.1"]  # fmt: skip
    parsed = [Semver.parse(v) for v in ordered]
    assert parsed == sorted(parsed)
    assert len(set(parsed)) == len(parsed)


def test_invalid_capacity_is_an_invalid_object() -> None:
    with pytest.raises(InvalidObjectError, match="capacity"):
        gpu(capacity={"memory": {"value": "lots"}})


def test_the_compile_cache_is_bounded_and_keeps_what_is_in_use() -> None:
    compiler = SelectorCompiler(limit=3)
    kept = compiler.compile("device.driver == 'a'")
    for i in range(10):
        compiler.compile(f"device.driver == 'x{i}'")
        assert compiler.compile("device.driver == 'a'") is kept  # used again: stays
    assert len(compiler) == 3
    first = compiler.compile("device.driver == 'x0'")  # dropped: compiled again
    assert first.expression == "device.driver == 'x0'"
    assert len(compiler) == 3


def test_a_device_keeps_at_most_its_share_of_verdicts() -> None:
    compiler = SelectorCompiler()
    device = gpu()
    for i in range(VERDICTS_PER_DEVICE + 20):
        assert not device.matches(f"device.driver == 'x{i}'", compiler)
    assert len(device.verdicts) == VERDICTS_PER_DEVICE
    assert f"device.driver == 'x{VERDICTS_PER_DEVICE + 19}'" in device.verdicts
    assert "device.driver == 'x0'" not in device.verdicts  # the oldest went first
