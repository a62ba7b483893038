"""CEL device selectors as kube-scheduler 1.34 evaluates them, on cel-expr-python (cel-cpp).

Theory of operation. A selector (``DeviceClass.spec.selectors[].cel.expression`` or a
request's ``selectors``) is compiled once per distinct expression string by
:class:`SelectorCompiler` and evaluated against one device at a time. The device is the
variable ``device`` (declared ``dyn``, so the expression is type-checked against the
library functions and evaluated dynamically, which gives CEL's heterogeneous equality:
``device.attributes["d"].i == "a"`` is false, not an error, and numbers compare across
int/uint/double as with ``cel.CrossTypeNumericComparisons``):

* ``device.driver``: the driver name;
* ``device.attributes[domain][id]``: int, bool, string or semver values. An unqualified
  attribute name sits under the driver's domain; ``a.b/c`` splits at the first ``/``;
* ``device.capacity[domain][id]``: quantities.

Kubernetes' outer maps return an empty map for an unknown domain while an unknown id inside
a domain is a runtime error. cel-cpp converts Python maps eagerly (no default hook), so the
domains an expression names literally (``attributes["x"]``, ``capacity['x']``,
``attributes.x``) are added as empty maps to that expression's input when the device lacks
them. A domain computed at run time (``device.attributes[d]`` with ``d`` a variable) still
errors where kube answers with an empty map; ``"x" in device.attributes`` is false as in
kube unless the same expression also indexes ``attributes["x"]`` (then true). Both are rare
in selectors and documented here rather than hidden.

cel-cpp's Python bindings cannot return opaque values, so a Quantity is the map
``{"k8s.quantity": "<exact nanounits>"}`` and a semantic version the map ``{"k8s.semver":
"<version without build metadata>"}``: both canonical, so CEL's own ``==`` is the semantic
equality Kubernetes has (``quantity("1Gi") == quantity("1024Mi")``; versions equal when only
build metadata differ, as blang/semver's ``Equals``). The Kubernetes quantity library
(``quantity``, ``isQuantity``, ``sign``, ``add``, ``sub``, ``isInteger``, ``asInteger``,
``asApproximateFloat``, ``isGreaterThan``, ``isLessThan``, ``compareTo``) and the semver
library (``semver(s[, normalize])``, ``isSemver``, ``major``, ``minor``, ``patch`` and the same
comparisons) are Python overloads on those maps; comparing a quantity with a version is an
error. Also loaded: ``cel.bind`` (ext bindings), the strings extension, optional types, the
sets extension (``sets.contains/equivalent/intersects``), the Kubernetes list library
(``isSorted``, ``sum``, ``min``, ``max``, ``indexOf``, ``lastIndexOf``) and regex
``find``/``findAll``. Not loaded (not in cel-expr-python): URLs, IP/CIDR, authz, format's
Kubernetes-specific verbs and the v3 list extension; an expression using them fails to
compile, which the allocator reports as an error like any compile error.

Errors are values here too: compiling or evaluating raises :class:`CelError`, which the
allocator turns into an error for the whole pod's attempt, as kube does. A selector's
verdict (or error) is cached on the :class:`~scheduler.core.dra.objects.Device` per
expression, so a device is evaluated once per distinct expression until its slice changes
(a new slice object brings new Device objects).
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import total_ordering
from typing import Any, Final

import cel_expr_python.cel as cel
import cel_expr_python.ext.ext_bindings as ext_bindings
import cel_expr_python.ext.ext_optional as ext_optional
import cel_expr_python.ext.ext_strings as ext_strings

from scheduler.model.errors import InvalidObjectError
from scheduler.model.quantity import INT64_MAX, INT64_MIN, Quantity

QUANTITY_KEY: Final = "k8s.quantity"
SEMVER_KEY: Final = "k8s.semver"
_NANO: Final = 10**9


class CelError(Exception):
    """A selector failed to compile or to evaluate (kube aborts the pod's allocation)."""


# --- quantities ------------------------------------------------------------------------


def quantity_value(q: Quantity) -> dict[str, str]:
    """The CEL representation of a quantity (canonical, so ``==`` is semantic)."""
    return {QUANTITY_KEY: str(q.nanos)}


def _nanos(value: object) -> int:
    if isinstance(value, Mapping) and set(value) == {QUANTITY_KEY}:
        return int(value[QUANTITY_KEY])
    raise CelError(f"no such overload: expected a quantity, got {value!r}")


def _parse_quantity(text: str) -> Quantity:
    try:
        return Quantity.parse(text)
    except InvalidObjectError as err:
        raise CelError(f"quantities must be valid: {err.reason}") from err


def _quantity(text: str) -> dict[str, str]:
    return quantity_value(_parse_quantity(text))


def _is_quantity(text: str) -> bool:
    try:
        Quantity.parse(text)
    except InvalidObjectError:
        return False
    return True


def _sign(q: object) -> int:
    n = _nanos(q)
    return (n > 0) - (n < 0)


def _is_integer(q: object) -> bool:
    n = _nanos(q)
    return n % _NANO == 0 and INT64_MIN <= n // _NANO <= INT64_MAX


def _as_integer(q: object) -> int:
    if not _is_integer(q):
        raise CelError("cannot convert value to integer")
    return _nanos(q) // _NANO


def _as_float(q: object) -> float:
    return float(Fraction(_nanos(q), _NANO))


def _add(q: object, other: object) -> dict[str, str]:
    extra = other * _NANO if isinstance(other, int) else _nanos(other)
    return {QUANTITY_KEY: str(_nanos(q) + extra)}


def _sub(q: object, other: object) -> dict[str, str]:
    extra = other * _NANO if isinstance(other, int) else _nanos(other)
    return {QUANTITY_KEY: str(_nanos(q) - extra)}


# --- semantic versions (blang/semver v4, as apiserver's semver library uses) -------------

_NUM: Final = r"(?:0|[1-9][0-9]*)"
_PRE_ID: Final = r"(?:0|[1-9][0-9]*|[0-9]*[A-Za-z-][0-9A-Za-z-]*)"
_SEMVER_RE: Final = re.compile(
    rf"(?P<major>{_NUM})\.(?P<minor>{_NUM})\.(?P<patch>{_NUM})"
    rf"(?:-(?P<pre>{_PRE_ID}(?:\.{_PRE_ID})*))?"
    r"(?:\+(?P<build>[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?"
)


@total_ordering
@dataclass(frozen=True, slots=True)
class Semver:
    """A parsed version; equality and order ignore build metadata (blang's Compare)."""

    major: int
    minor: int
    patch: int
    pre: tuple[int | str, ...] = ()

    @classmethod
    def parse(cls, text: str, *, normalize: bool = False) -> Semver:
        if normalize:
            text = _normalize(text)
        match = _SEMVER_RE.fullmatch(text)
        if match is None:
            raise CelError(f"invalid semver: {text!r}")
        pre: tuple[int | str, ...] = ()
        if match["pre"]:
            pre = tuple(int(p) if p.isdigit() else p for p in match["pre"].split("."))
        return cls(int(match["major"]), int(match["minor"]), int(match["patch"]), pre)

    def _key(self) -> tuple[int, int, int, int, tuple[tuple[int, int, str], ...]]:
        # No pre-release sorts after any pre-release; numeric identifiers before alphanumeric.
        ids = tuple((0, p, "") if isinstance(p, int) else (1, 0, p) for p in self.pre)
        return (self.major, self.minor, self.patch, 0 if self.pre else 1, ids)

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Semver):
            return NotImplemented
        return self._key() < other._key()

    def __str__(self) -> str:
        core = f"{self.major}.{self.minor}.{self.patch}"
        return core + ("-" + ".".join(str(p) for p in self.pre) if self.pre else "")


def _normalize(text: str) -> str:
    """apiserver's ``semver(s, true)``: drop a leading v, pad to three parts, no leading 0s."""
    text = text.removeprefix("v")
    cut = min((i for i in (text.find("-"), text.find("+")) if i >= 0), default=len(text))
    core, rest = text[:cut], text[cut:]
    parts = core.split(".")
    if not 1 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
        return text
    return ".".join([str(int(p)) for p in parts] + ["0"] * (3 - len(parts))) + rest


def semver_value(version: Semver) -> dict[str, str]:
    return {SEMVER_KEY: str(version)}


def _version(value: object) -> Semver:
    if isinstance(value, Mapping) and set(value) == {SEMVER_KEY}:
        return Semver.parse(str(value[SEMVER_KEY]))
    raise CelError(f"no such overload: expected a semver, got {value!r}")


def _semver(text: str) -> dict[str, str]:
    return semver_value(Semver.parse(text))


def _semver_normalized(text: str, normalize: bool) -> dict[str, str]:
    return semver_value(Semver.parse(text, normalize=normalize))


def _is_semver(text: str, normalize: bool = False) -> bool:
    try:
        Semver.parse(text, normalize=normalize)
    except CelError:
        return False
    return True


def _compare(a: object, b: object) -> int:
    """compareTo over two quantities or two versions (mixing them has no overload)."""
    if isinstance(a, Mapping) and QUANTITY_KEY in a:
        x, y = _nanos(a), _nanos(b)
        return (x > y) - (x < y)
    va, vb = _version(a), _version(b)
    return (va > vb) - (va < vb)


# --- sets, lists and regex helpers of the Kubernetes base environment ------------------


def _sets_contains(a: Sequence[object], b: Sequence[object]) -> bool:
    return all(any(_equal(x, y) for y in a) for x in b)


def _sets_equivalent(a: Sequence[object], b: Sequence[object]) -> bool:
    return _sets_contains(a, b) and _sets_contains(b, a)


def _sets_intersects(a: Sequence[object], b: Sequence[object]) -> bool:
    return any(any(_equal(x, y) for y in a) for x in b)


def _equal(x: object, y: object) -> bool:
    if isinstance(x, bool) or isinstance(y, bool):
        return type(x) is type(y) and x == y
    return x == y


def _ordered(values: Sequence[Any]) -> list[Any]:
    items = list(values)
    kinds = {type(v) for v in items}
    if len(kinds) > 1 and not kinds <= {int, float}:
        raise CelError("no such overload: list elements are not comparable")
    return items


def _is_sorted(values: Sequence[Any]) -> bool:
    items = _ordered(values)
    return all(items[i] <= items[i + 1] for i in range(len(items) - 1))


def _sum(values: Sequence[Any]) -> Any:
    items = _ordered(values)
    return sum(items) if items else 0


def _min(values: Sequence[Any]) -> Any:
    items = _ordered(values)
    if not items:
        raise CelError("min of empty list")
    return min(items)


def _max(values: Sequence[Any]) -> Any:
    items = _ordered(values)
    if not items:
        raise CelError("max of empty list")
    return max(items)


def _index_of(values: Sequence[object], item: object) -> int:
    return next((i for i, v in enumerate(values) if _equal(v, item)), -1)


def _last_index_of(values: Sequence[object], item: object) -> int:
    return next((i for i in range(len(values) - 1, -1, -1) if _equal(values[i], item)), -1)


def _compiled_regex(pattern: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern)
    except re.error as err:
        raise CelError(f"invalid regular expression {pattern!r}: {err}") from err


def _find(text: str, pattern: str) -> str:
    match = _compiled_regex(pattern).search(text)
    return match.group(0) if match else ""


def _find_all(text: str, pattern: str) -> list[str]:
    return [m.group(0) for m in _compiled_regex(pattern).finditer(text)]


def _find_all_n(text: str, pattern: str, limit: int) -> list[str]:
    found = _find_all(text, pattern)
    return found if limit < 0 else found[:limit]


# --- the environment -------------------------------------------------------------------

_T = cel.Type
_MAP: Final = _T.Map(_T.STRING, _T.STRING)
_LIST: Final = _T.List(_T.DYN)


def _overload(
    oid: str, ret: cel.Type, params: Sequence[cel.Type], impl: Callable[..., Any], *, member: bool
) -> cel.Overload:
    return cel.Overload(oid, ret, list(params), is_member=member, impl=impl)


def _fn(name: str, *overloads: cel.Overload) -> cel.FunctionDecl:
    return cel.FunctionDecl(name, list(overloads))


def _kubernetes_library() -> cel.CelExtension:
    m = _MAP
    return cel.CelExtension(
        "kubernetes",
        [
            _fn("quantity", _overload("k8s_quantity", m, [_T.STRING], _quantity, member=False)),
            _fn(
                "isQuantity",
                _overload("k8s_is_quantity", _T.BOOL, [_T.STRING], _is_quantity, member=False),
            ),
            _fn("sign", _overload("k8s_sign", _T.INT, [m], _sign, member=True)),
            _fn("isInteger", _overload("k8s_is_integer", _T.BOOL, [m], _is_integer, member=True)),
            _fn("asInteger", _overload("k8s_as_integer", _T.INT, [m], _as_integer, member=True)),
            _fn(
                "asApproximateFloat",
                _overload("k8s_as_float", _T.DOUBLE, [m], _as_float, member=True),
            ),
            _fn(
                "add",
                _overload("k8s_add_quantity", m, [m, m], _add, member=True),
                _overload("k8s_add_int", m, [m, _T.INT], _add, member=True),
            ),
            _fn(
                "sub",
                _overload("k8s_sub_quantity", m, [m, m], _sub, member=True),
                _overload("k8s_sub_int", m, [m, _T.INT], _sub, member=True),
            ),
            _fn(
                "isGreaterThan",
                _overload(
                    "k8s_greater", _T.BOOL, [m, m], lambda a, b: _compare(a, b) > 0, member=True
                ),
            ),
            _fn(
                "isLessThan",
                _overload(
                    "k8s_less", _T.BOOL, [m, m], lambda a, b: _compare(a, b) < 0, member=True
                ),
            ),
            _fn("compareTo", _overload("k8s_compare", _T.INT, [m, m], _compare, member=True)),
            _fn(
                "semver",
                _overload("k8s_semver", m, [_T.STRING], _semver, member=False),
                _overload(
                    "k8s_semver_normalize",
                    m,
                    [_T.STRING, _T.BOOL],
                    _semver_normalized,
                    member=False,
                ),
            ),
            _fn(
                "isSemver",
                _overload("k8s_is_semver", _T.BOOL, [_T.STRING], _is_semver, member=False),
                _overload(
                    "k8s_is_semver_normalize",
                    _T.BOOL,
                    [_T.STRING, _T.BOOL],
                    _is_semver,
                    member=False,
                ),
            ),
            _fn(
                "major",
                _overload("k8s_major", _T.INT, [m], lambda v: _version(v).major, member=True),
            ),
            _fn(
                "minor",
                _overload("k8s_minor", _T.INT, [m], lambda v: _version(v).minor, member=True),
            ),
            _fn(
                "patch",
                _overload("k8s_patch", _T.INT, [m], lambda v: _version(v).patch, member=True),
            ),
            _fn(
                "sets.contains",
                _overload("sets_contains", _T.BOOL, [_LIST, _LIST], _sets_contains, member=False),
            ),
            _fn(
                "sets.equivalent",
                _overload(
                    "sets_equivalent", _T.BOOL, [_LIST, _LIST], _sets_equivalent, member=False
                ),
            ),
            _fn(
                "sets.intersects",
                _overload(
                    "sets_intersects", _T.BOOL, [_LIST, _LIST], _sets_intersects, member=False
                ),
            ),
            _fn("isSorted", _overload("k8s_is_sorted", _T.BOOL, [_LIST], _is_sorted, member=True)),
            _fn("sum", _overload("k8s_sum", _T.DYN, [_LIST], _sum, member=True)),
            _fn("min", _overload("k8s_min", _T.DYN, [_LIST], _min, member=True)),
            _fn("max", _overload("k8s_max", _T.DYN, [_LIST], _max, member=True)),
            _fn(
                "indexOf",
                _overload("k8s_list_index_of", _T.INT, [_LIST, _T.DYN], _index_of, member=True),
            ),
            _fn(
                "lastIndexOf",
                _overload(
                    "k8s_list_last_index_of", _T.INT, [_LIST, _T.DYN], _last_index_of, member=True
                ),
            ),
            _fn(
                "find",
                _overload("k8s_find", _T.STRING, [_T.STRING, _T.STRING], _find, member=True),
            ),
            _fn(
                "findAll",
                _overload(
                    "k8s_find_all",
                    _T.List(_T.STRING),
                    [_T.STRING, _T.STRING],
                    _find_all,
                    member=True,
                ),
                _overload(
                    "k8s_find_all_n",
                    _T.List(_T.STRING),
                    [_T.STRING, _T.STRING, _T.INT],
                    _find_all_n,
                    member=True,
                ),
            ),
        ],
    )


# Domains an expression names literally: attributes["d"], capacity['d'], attributes.d.
_DOMAIN_RE: Final = re.compile(
    r"""\b(?:attributes|capacity)\s*(?:\[\s*(?:"((?:[^"\\]|\\.)*)"|'((?:[^'\\]|\\.)*)')\s*\]"""
    r"""|\.\s*([A-Za-z_][A-Za-z0-9_]*))"""
)


@dataclass(frozen=True, slots=True)
class Selector:
    """One compiled expression and the domains it names (defaulted to empty maps)."""

    expression: str
    program: cel.Expression
    domains: frozenset[str]

    def evaluate(self, device: Mapping[str, Any]) -> bool:
        """The verdict for ``device`` (its CEL input from :func:`device_input`)."""
        attributes: Mapping[str, Any] = device["attributes"]
        capacity: Mapping[str, Any] = device["capacity"]
        if any(d not in attributes or d not in capacity for d in self.domains):
            device = {
                **device,
                "attributes": {**{d: {} for d in self.domains}, **attributes},
                "capacity": {**{d: {} for d in self.domains}, **capacity},
            }
        try:
            result = self.program.eval(data={"device": device})
        except RuntimeError as err:  # cel-cpp reports some failures by raising
            raise CelError(str(err)) from err
        if result.type() == cel.Type.ERROR:
            raise CelError(str(result.value()))
        value = result.value()
        if not isinstance(value, bool):
            raise CelError(f"CEL result of type {result.type().name()} is not a bool")
        return value


COMPILED_MAX: Final = 4096
"""Compiled expressions kept: claims come and go, each with selectors of its own, so an
unbounded cache would grow for the life of the process."""


class SelectorCompiler:
    """Compiles each distinct expression once while it is in use (compile errors are cached
    too: they are deterministic for one library version); the least recently used beyond
    ``limit`` are dropped and compiled again if they return."""

    def __init__(self, limit: int = COMPILED_MAX) -> None:
        self.limit = limit
        self._env = cel.NewEnv(
            variables={"device": cel.Type.DYN},
            extensions=[
                ext_bindings.ExtBindings(),
                ext_strings.ExtStrings(),
                ext_optional.ExtOptional(),
                _kubernetes_library(),
            ],
        )
        self._compiled: OrderedDict[str, Selector | CelError] = OrderedDict()
        self.evaluations = 0
        """Selector evaluations so far (verdicts are cached per device: a metric of how
        much CEL a pod's cycle really ran)."""

    def compile(self, expression: str) -> Selector:
        cached = self._compiled.get(expression)
        if cached is not None:
            self._compiled.move_to_end(expression)
        else:
            try:
                program = self._env.compile(expression)
            except RuntimeError as err:
                cached = CelError(f"CEL compile error: {err}")
            else:
                domains = frozenset(
                    next(g for g in m.groups() if g is not None)
                    for m in _DOMAIN_RE.finditer(expression)
                )
                cached = Selector(expression, program, domains)
            self._compiled[expression] = cached
            while len(self._compiled) > self.limit:
                self._compiled.popitem(last=False)
        if isinstance(cached, CelError):
            raise cached
        return cached

    def __len__(self) -> int:
        return len(self._compiled)


def split_qualified_name(name: str, driver: str) -> tuple[str, str]:
    """``domain/id`` splits at the first slash; a bare id belongs to the driver's domain."""
    domain, sep, ident = name.partition("/")
    return (domain, ident) if sep else (driver, name)
