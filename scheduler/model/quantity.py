"""Exact Kubernetes quantities.

Theory of operation: a quantity string ("500m", "1.5Gi", "1e3", "12E-3") denotes an exact
decimal or binary-scaled number. apimachinery stores it with at most nanounit precision,
rounding *up* (away from zero) anything finer, and converts to integers with
``MilliValue() = ceil(q * 1000)`` and ``Value() = ceil(q)``. We keep the same model: a
:class:`Quantity` is an exact integer count of nanounits, so sums of quantities are exact and
the final rounding to millicores or bytes happens once, as in Kubernetes. No floats are used
anywhere; values that do not fit in int64 after conversion raise :class:`InvalidObjectError`
(Kubernetes would silently overflow or saturate).

The grammar follows ``resource.ParseQuantity``: an optional sign, digits with an optional
fraction, then a suffix that is a decimal SI suffix (n u m k M G T P E), a binary SI suffix
(Ki Mi Gi Ti Pi Ei) or a decimal exponent (e3, E-3). We are slightly stricter than Go on
degenerate inputs Go accepts by accident (".", "-", "1." is still accepted).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from scheduler.model.errors import InvalidObjectError

INT64_MAX: Final = 2**63 - 1
INT64_MIN: Final = -(2**63)
_NANO: Final = 10**9

_DECIMAL_SUFFIXES: Final[dict[str, int]] = {
    "n": -9,
    "u": -6,
    "m": -3,
    "": 0,
    "k": 3,
    "M": 6,
    "G": 9,
    "T": 12,
    "P": 15,
    "E": 18,
}
_BINARY_SUFFIXES: Final[dict[str, int]] = {
    "Ki": 10,
    "Mi": 20,
    "Gi": 30,
    "Ti": 40,
    "Pi": 50,
    "Ei": 60,
}
# Mirrors parseQuantityString: sign, integer digits, optional fraction, then the suffix run
# (letters from the suffix alphabet, an optional sign and digits for exponents).
_QUANTITY_RE: Final = re.compile(
    r"(?P<sign>[+-]?)(?P<int>[0-9]*)(?:\.(?P<frac>[0-9]*))?(?P<suffix>[eEinumkKMGTP]*[+-]?[0-9]*)"
)
_INT64_RE: Final = re.compile(r"[+-]?[0-9]+")
# Anything with more than this many decimal digits of nanounits cannot fit int64 in any unit.
_MAX_NANO_DIGITS: Final = 40


def parse_int64(text: str) -> int | None:
    """Parse like Go's ``strconv.ParseInt(text, 10, 64)``; None when Go would fail."""
    if not _INT64_RE.fullmatch(text):
        return None
    value = int(text)
    if value < INT64_MIN or value > INT64_MAX:
        return None
    return value


def _ceil_div(numerator: int, denominator: int) -> int:
    return -((-numerator) // denominator)


def _round_up_away_from_zero(numerator: int, denominator: int) -> int:
    if numerator >= 0:
        return _ceil_div(numerator, denominator)
    return -_ceil_div(-numerator, denominator)


_PARSED: dict[str, int] = {}
"""Valid quantity strings already parsed: a cluster's pods name the same few ("100m",
"128Mi") tens of thousands of times, and the regular expression was most of a listed
pod's resource parse. Invalid ones are never kept (each raises again)."""
_PARSED_LIMIT: Final = 4096


@dataclass(frozen=True, order=True, slots=True)
class Quantity:
    """An exact quantity, stored as an integer number of nanounits."""

    nanos: int

    @classmethod
    def parse(cls, raw: object, *, field: str = "quantity") -> Quantity:
        """Parse a quantity from its API form (string, or a JSON number)."""
        if isinstance(raw, bool):
            raise InvalidObjectError(field, raw, "quantities must be strings or numbers")
        if isinstance(raw, int):
            return cls(raw * _NANO)
        if isinstance(raw, float):
            # A JSON number: Go reads its literal text, which repr() reproduces.
            text = repr(raw)
            if text in {"nan", "inf", "-inf"}:
                raise InvalidObjectError(field, raw, "quantities must be finite")
        elif isinstance(raw, str):
            nanos = _PARSED.get(raw)
            if nanos is not None:
                return cls(nanos)
            nanos = _parse_nanos(raw, field)
            if len(_PARSED) >= _PARSED_LIMIT:
                _PARSED.clear()
            _PARSED[raw] = nanos
            return cls(nanos)
        else:
            raise InvalidObjectError(field, raw, "quantities must be strings or numbers")
        return cls(_parse_nanos(text, field))

    @classmethod
    def from_milli(cls, millis: int) -> Quantity:
        return cls(millis * 10**6)

    @classmethod
    def from_units(cls, units: int) -> Quantity:
        return cls(units * _NANO)

    def milli_value(self) -> int:
        """``ceil(q * 1000)`` like apimachinery's MilliValue (unbounded)."""
        return _ceil_div(self.nanos, 10**6)

    def value(self) -> int:
        """``ceil(q)`` like apimachinery's Value (unbounded)."""
        return _ceil_div(self.nanos, _NANO)

    def __add__(self, other: Quantity) -> Quantity:
        return Quantity(self.nanos + other.nanos)

    def __str__(self) -> str:
        """Canonical decimal-SI form; ``Quantity.parse(str(q)) == q`` always holds."""
        if self.nanos == 0:
            return "0"
        best = "n"
        best_value = self.nanos
        for suffix, exponent in sorted(_DECIMAL_SUFFIXES.items(), key=lambda kv: kv[1]):
            divisor = 10 ** (exponent + 9)
            if self.nanos % divisor == 0:
                best, best_value = suffix, self.nanos // divisor
        return f"{best_value}{best}"


def _parse_nanos(text: str, field: str) -> int:
    match = _QUANTITY_RE.fullmatch(text)
    if match is None:
        raise InvalidObjectError(
            field,
            text,
            "quantities must match the regular expression "
            "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'",
        )
    int_part = match["int"]
    frac_part = match["frac"] or ""
    if not int_part and not frac_part:
        raise InvalidObjectError(field, text, "a quantity needs at least one digit")
    suffix = match["suffix"]
    digits = int((int_part or "0") + frac_part)
    negative = match["sign"] == "-"
    if suffix in _DECIMAL_SUFFIXES:
        exponent = _DECIMAL_SUFFIXES[suffix]
        nanos = _scale_decimal(digits, exponent - len(frac_part), text, field)
    elif suffix in _BINARY_SUFFIXES:
        numerator = digits * (1 << _BINARY_SUFFIXES[suffix]) * _NANO
        nanos = _ceil_div(numerator, 10 ** len(frac_part))
    elif len(suffix) > 1 and suffix[0] in "eE":
        exponent_or_none = parse_int64(suffix[1:])
        if exponent_or_none is None:
            raise InvalidObjectError(field, text, f"unknown quantity suffix {suffix!r}")
        nanos = _scale_decimal(digits, exponent_or_none - len(frac_part), text, field)
    else:
        raise InvalidObjectError(field, text, f"unknown quantity suffix {suffix!r}")
    return -nanos if negative else nanos


def _scale_decimal(digits: int, exponent10: int, text: str, field: str) -> int:
    """Return ``ceil(digits * 10**exponent10 * 1e9)`` without building huge powers."""
    shift = exponent10 + 9
    if digits == 0:
        return 0
    if shift >= 0:
        if len(str(digits)) + shift > _MAX_NANO_DIGITS:
            raise InvalidObjectError(field, text, "quantity is too large")
        scale: int = 10**shift
        return digits * scale
    if -shift > len(str(digits)):
        return 1  # finer than a nanounit: rounds up to one nanounit, as apimachinery does
    return _round_up_away_from_zero(digits, 10**-shift)


def to_int64(value: int, *, field: str, raw: object) -> int:
    """Check that an integer conversion result fits int64 like the Go fields it mirrors."""
    if value > INT64_MAX or value < INT64_MIN:
        raise InvalidObjectError(field, str(raw), "value does not fit in a 64-bit integer")
    return value
