"""Seeded random DRA cases for the differential against kube-scheduler (pure: seed -> cases).

A case is a few drivers of its own (a DeviceClass each, the same devices published on both
nodes, one slice per node, sometimes an older generation's slice or an incomplete pool),
and one or two claims for one pod per node. Every selector is one of the generator's own
forms (:class:`Sel`), which knows its CEL text *and* what it means: :meth:`Sel.truth` gives
the value (or the runtime error) straight from the device's attributes, without CEL, so the
checker (:mod:`tests.e2e.differential.dra_check`) can judge an allocation independently of
both schedulers.

Kinds (``Case.kind``): exact (count 1/2/8/any, also more than the devices), all (also over
an incomplete pool), incomplete-exact, first-available (fallbacks, a count-33 subrequest,
a constraint scoped to ``req/sub``), match (matchAttribute on a string, int, version,
mixed-type or sometimes-missing attribute; ExactCount or All), two-requests (a scoped
constraint), pair (GPU + NIC of two drivers on ``resource.kubernetes.io/pcieRoot``), admin
(adminAccess, alone or beside a second claim holding the same devices), two-claims,
selector-error (unknown key, unknown domain, a missing attribute: kube's runtime errors),
too-many (33 devices in one request or across two), generation (an older generation's
slice with better devices that must be ignored), missing-class, shared (one claim, two or
three pods on the node; sometimes already allocated), held (a claim the test allocates
before any pod exists: the pod uses it, or it only takes devices from the pod's own claim,
or it is pinned to a node no pod can use, so the scheduler's PostFilter frees it and
allocates it anew), template (claims kube-controller-manager generates from
ResourceClaimTemplates), multi-slice (a pool published as two slices; kube's first fit then
follows its informer's slice order, so only verdicts and validity are compared), tainted
(device taints NoSchedule/NoExecute/None on some devices, tolerations Exists/Equal with or
without key and effect on the request or on firstAvailable subrequests; one or two claims,
sometimes All), partitioned (a pool of two slices: one with a ``sharedCounters`` set of
memory and compute, one with a full device consuming all of it and partitions consuming
parts; counts that sometimes over-spend, sometimes two claims or firstAvailable), shares
(devices that mostly allow multiple allocations, with a ``memory`` request policy: none, a
default, a stepped range or valid values; requests asking a share of memory or none, one or
two requests or claims, firstAvailable, a ``distinctAttribute`` over two requests).

The last three need kube 1.36+ (DRADeviceTaints, DRAPartitionableDevices and
DRAConsumableCapacity on; a 1.35 API server drops the fields): :func:`kinds` leaves them out
on an older plane, so there the draws are those of the other kinds only.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any, Final

from lattice_dev.devcluster.build import kubernetes_version
from tests.e2e.differential.dra_cases import node_pair, pinned

DOMAIN_SUFFIX: Final = ".dra.lattice.dev"
OTHER_DOMAIN: Final = "other.lattice.dev"
PCIE_ROOT: Final = "resource.kubernetes.io/pcieRoot"
MODELS: Final = ("A100", "A100", "H100", "H100", "B200")
FIRMWARE: Final = ("1.0.0", "1.2.0", "1.2.0+b1", "1.10.0", "2.0.0-rc.1", "2.0.0")
MEMORY: Final = ("16Gi", "40Gi", "40960Mi", "80Gi", "81920Mi")
QUANTITY_ARGS: Final = ("16Gi", "40Gi", "40960Mi", "64Gi", "80Gi", "17179869184")
SEMVER_ARGS: Final = ("1.0.0", "1.2.0", "1.5.0", "2.0.0-rc.1", "2.0.0")
CMP_OPS: Final = ("==", "!=", "<", "<=", ">", ">=")
CLEAN_PAIRS: Final = (0, 2, 3, 4)
"""The node pairs of the cases without an incomplete pool, taken in turn: a kwok node holds
110 pods, so 300 cases need more than one pair."""
SIDE_PAIR: Final = 1
"""The node pair of the cases with an incomplete pool (and of some All requests beside)."""
NODE_PAIRS: Final = 5
LIMIT: Final = 32
"""kube's AllocationResultsMaxSize: devices per claim."""
ELSEWHERE: Final = "kwok-node-elsewhere"
"""The node a held claim's allocation pins when no pod of its case can use it (no such
node exists)."""
FINALIZER: Final = "resource.kubernetes.io/delete-protection"
TAINT_KEYS: Final = ("example.com/flaky", "lattice.dev/maintenance", "gpu-health")
TAINT_VALUES: Final = ("a", "b")
TAINT_EFFECTS: Final = ("NoSchedule", "NoExecute", "None")
BLOCKING_EFFECTS: Final = ("NoSchedule", "NoExecute")
COUNTER_SET: Final = "gpu-counters"
GI: Final = 1 << 30
MEMORY_ASKS: Final = ("1Gi", "3Gi", "4Gi", "6Gi", "8Gi", "12Gi", "20Gi", "30Gi", "36Gi", "50Gi")
UNIQUE: Final = "uid"
"""The attribute each device of a shares case has a value of its own of."""


class SelectorError(Exception):
    """What kube's CEL evaluation fails with at runtime (the attempt errors)."""


Device = dict[str, Any]
"""A device exactly as published in the slice."""


def attributes_of(device: Device, driver: str) -> dict[str, dict[str, Any]]:
    """CEL's ``device.attributes``: domain -> id -> value, bare names under the driver."""
    out: dict[str, dict[str, Any]] = {}
    for name, value in (device.get("attributes") or {}).items():
        domain, sep, ident = name.partition("/")
        if not sep:
            domain, ident = driver, name
        out.setdefault(domain, {})[ident] = value
    return out


def lookup(device: Device, driver: str, qualified: str) -> tuple[str, Any] | None:
    """matchAttribute's lookup (exact name, else the bare id under the driver's domain):
    the attribute's (type, value) or None."""
    attrs = device.get("attributes") or {}
    found = attrs.get(qualified)
    if found is None:
        domain, _, ident = qualified.partition("/")
        if domain == driver:
            found = attrs.get(ident)
    if found is None:
        return None
    ((kind, value),) = found.items()
    return kind, value


def _semver(text: str) -> tuple[int, int, int, tuple[Any, ...]]:
    """A semver's precedence key (build metadata ignored; a release outranks its
    prereleases). Only the generator's own forms (``x.y.z[-pre][+build]``)."""
    core = text.split("+", 1)[0]
    base, _, pre = core.partition("-")
    major, minor, patch = (int(x) for x in base.split("."))
    if not pre:
        return major, minor, patch, (1,)
    parts = tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in pre.split("."))
    return major, minor, patch, (0, parts)


_SUFFIX: Final = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}


def _quantity(text: str) -> int:
    for suffix, factor in _SUFFIX.items():
        if text.endswith(suffix):
            return int(text[: -len(suffix)]) * factor
    return int(text)


def _cmp(op: str, a: Any, b: Any) -> bool:
    ops = {
        "==": a == b,
        "!=": a != b,
        "<": a < b,
        "<=": a <= b,
        ">": a > b,
        ">=": a >= b,
    }
    return bool(ops[op])


@dataclass(frozen=True)
class Sel:
    """One selector form of the generator's: ``kind`` and its arguments."""

    kind: str
    args: tuple[Any, ...] = ()

    def cel(self, driver: str) -> str:
        a = f'device.attributes["{driver}"]'
        k, x = self.kind, self.args
        if k == "model-eq":
            return f'{a}.model {x[0]} "{x[1]}"'
        if k == "model-in":
            return f"{a}.model in [{', '.join(json.dumps(v) for v in x)}]"
        if k == "model-prefix":
            return f'{a}.model.startsWith("{x[0]}")'
        if k == "numa":
            return f"{a}.numa {x[0]} {x[1]}"
        if k == "fw":
            fn, v = x
            if fn == "eq":
                return f'{a}.fw == semver("{v}")'
            if fn == "compareTo":
                return f'{a}.fw.compareTo(semver("{v}")) >= 0'
            return f'{a}.fw.{fn}(semver("{v}"))'
        if k == "memory":
            c = f'device.capacity["{driver}"].memory'
            fn, q = x
            if fn == "eq":
                return f'{c} == quantity("{q}")'
            if fn == "compareTo":
                return f'{c}.compareTo(quantity("{q}")) > 0'
            return f'{c}.{fn}(quantity("{q}"))'
        if k == "has-opt":
            return f"has({a}.opt)"
        if k == "opt-guarded":
            return f'has({a}.opt) && {a}.opt == "{x[0]}"'
        if k == "opt-eq":
            return f'{a}.opt == "{x[0]}"'
        if k == "other-has":
            return f'has(device.attributes["{OTHER_DOMAIN}"].model)'
        if k == "other-in":
            return f'"model" in device.attributes["{OTHER_DOMAIN}"]'
        if k == "other-not-has":
            return f'!has(device.attributes["{OTHER_DOMAIN}"].model)'
        if k == "other-get":
            return f'device.attributes["{OTHER_DOMAIN}"].model == "A100"'
        if k == "unknown-key":
            return f"{a}.nosuch == 1"
        if k == "unknown-capacity":
            return f'device.capacity["{driver}"].nosuch.isGreaterThan(quantity("1"))'
        if k == "tag-int":
            return f"{a}.tag == {x[0]}"
        if k == "bind":
            return f'cel.bind(d, {a}, d.fw.isGreaterThan(semver("{x[0]}")) || d.numa == {x[1]})'
        if k == "rdma":
            return f"{a}.rdma == true"
        if k == "driver":
            return f'device.driver == "{driver}"'
        if k == "profile":
            return f'{a}.profile == "{x[0]}"'
        raise AssertionError(k)

    def truth(self, device: Device, driver: str) -> bool:
        """The selector's value on ``device``, straight from its attributes; raises
        :class:`SelectorError` where kube's evaluation fails."""
        attrs = attributes_of(device, driver)
        mine = attrs.get(driver, {})
        k, x = self.kind, self.args

        def get(ident: str) -> Any:
            if ident not in mine:
                raise SelectorError(f"no such key: {ident}")
            ((_, value),) = mine[ident].items()
            return value

        if k == "model-eq":
            return _cmp(x[0], get("model"), x[1])
        if k == "model-in":
            return get("model") in x
        if k == "model-prefix":
            return str(get("model")).startswith(x[0])
        if k == "numa":
            return _cmp(x[0], get("numa"), x[1])
        if k == "fw":
            fn, v = x
            have, want = _semver(get("fw")), _semver(v)
            return {
                "eq": have == want,
                "compareTo": have >= want,
                "isGreaterThan": have > want,
                "isLessThan": have < want,
            }[fn]
        if k == "memory":
            fn, q = x
            caps = {
                name.partition("/")[2] if "/" in name else name: v["value"]
                for name, v in (device.get("capacity") or {}).items()
            }
            have_q, want_q = _quantity(caps["memory"]), _quantity(q)
            return {
                "eq": have_q == want_q,
                "compareTo": have_q > want_q,
                "isGreaterThan": have_q > want_q,
                "isLessThan": have_q < want_q,
            }[fn]
        if k == "has-opt":
            return "opt" in mine
        if k == "opt-guarded":
            return "opt" in mine and get("opt") == x[0]
        if k == "opt-eq":
            return bool(get("opt") == x[0])
        if k in ("other-has", "other-in"):
            return "model" in attrs.get(OTHER_DOMAIN, {})
        if k == "other-not-has":
            return "model" not in attrs.get(OTHER_DOMAIN, {})
        if k == "other-get":
            if "model" not in attrs.get(OTHER_DOMAIN, {}):
                raise SelectorError("no such key: model")
            return bool(attrs[OTHER_DOMAIN]["model"] == {"string": "A100"})
        if k in ("unknown-key", "unknown-capacity"):
            raise SelectorError("no such key: nosuch")
        if k == "tag-int":
            kind_value = mine.get("tag")
            if kind_value is None:
                raise SelectorError("no such key: tag")
            # Heterogeneous equality: a string tag is simply not equal to an int.
            return bool(kind_value == {"int": x[0]})
        if k == "bind":
            return _semver(get("fw")) > _semver(x[0]) or get("numa") == x[1]
        if k == "rdma":
            return get("rdma") is True
        if k == "driver":
            return True
        if k == "profile":
            return bool(get("profile") == x[0])
        raise AssertionError(k)


@dataclass
class Sub:
    """An ``exactly`` request (``name`` empty) or one firstAvailable subrequest."""

    name: str
    cls: str
    selectors: list[Sel] = field(default_factory=list)
    mode: str = "ExactCount"
    count: int = 1
    admin: bool = False
    tolerations: list[dict[str, str]] = field(default_factory=list)
    """Device tolerations as written (``operator`` always explicit), copied by kube into
    each result of the request."""
    capacity: dict[str, str] | None = None
    """``capacity.requests`` (DRAConsumableCapacity), as written."""

    def body(self, driver: str) -> dict[str, Any]:
        out: dict[str, Any] = {"deviceClassName": self.cls}
        if self.selectors:
            out["selectors"] = [{"cel": {"expression": s.cel(driver)}} for s in self.selectors]
        if self.mode == "All":
            out["allocationMode"] = "All"
        else:
            out["count"] = self.count
        if self.admin:
            out["adminAccess"] = True
        if self.tolerations:
            out["tolerations"] = [dict(t) for t in self.tolerations]
        if self.capacity is not None:
            out["capacity"] = {"requests": dict(self.capacity)}
        return out


@dataclass
class Request:
    name: str
    alternatives: list[Sub]
    first_available: bool = False


@dataclass
class Constraint:
    requests: list[str]
    attribute: str
    distinct: bool = False
    """``distinctAttribute`` rather than ``matchAttribute``."""


@dataclass
class Claim:
    suffix: str
    requests: list[Request]
    constraints: list[Constraint] = field(default_factory=list)
    config_for: list[list[str]] = field(default_factory=lambda: [[]])
    """The claim's opaque configs, each by the requests it names ([] = all)."""
    template: bool = False
    """A ResourceClaimTemplate's: each pod gets a claim of its own, generated."""
    held: list[str] | None = None
    """Device names (of the first request's driver) the test allocates the claim before any
    pod exists, as a scheduler would have written it."""
    held_elsewhere: bool = False
    """The held allocation pins :data:`ELSEWHERE`: the pod's node never fits it, so the
    scheduler deallocates it in PostFilter (reserved by nobody) and allocates it anew."""
    unused: bool = False
    """No pod names it: its held devices are only taken."""


@dataclass
class Driver:
    """One driver of a case: its DeviceClass (named ``cls``) and its devices per node."""

    name: str
    cls: str
    devices: list[Device]
    class_selectors: list[Sel] = field(default_factory=list)
    slice_count: int = 1
    """resourceSliceCount; 2 with one slice published is an incomplete pool."""
    old_devices: list[Device] | None = None
    """An older generation's slice (generation 1; the current one is 2)."""
    split: bool = False
    """The pool published whole as ``slice_count`` slices, its devices dealt out in order
    (rather than an incomplete pool, whose one slice of ``slice_count`` is published)."""
    counters: dict[str, str] | None = None
    """The pool's one counter set (:data:`COUNTER_SET`: counter -> quantity), published in
    a slice of its own beside the devices' (which then consume from it)."""

    def pool(self, node: str) -> str:
        return f"{self.cls}-{node}"


@dataclass
class Case:
    index: int
    kind: str
    drivers: list[Driver]
    claims: list[Claim]
    missing_class: bool = False
    side: bool = False
    """On the :data:`SIDE_PAIR` of nodes (an incomplete pool, or an All request beside one)
    instead of one of the :data:`CLEAN_PAIRS`."""
    pods_per_node: int = 1
    """Pods on each node naming the same claims (shared claims when more than one)."""

    @property
    def same_devices_expected(self) -> bool:
        """Whether kube's first fit is deterministic (one slice per pool on the node), so the
        two schedulers' devices are compared, not only their validity."""
        return not any(d.split for d in self.drivers)

    @property
    def nodes(self) -> tuple[str, str]:
        """(kube-scheduler's node, Lattice's node)."""
        return node_pair(SIDE_PAIR if self.side else CLEAN_PAIRS[self.index % len(CLEAN_PAIRS)])

    @property
    def name(self) -> str:
        return f"c{self.index}"

    def driver_of(self, cls: str) -> Driver | None:
        return next((d for d in self.drivers if d.cls == cls), None)

    def claim_name(self, claim: Claim, node: str) -> str:
        """The claim's name on ``node`` (a template's, for a generated claim)."""
        return f"{self.name}{claim.suffix}-{node}"

    def pod_names(self, node: str) -> list[str]:
        """The case's pods on ``node``; the first one's name is ``{case}-{node}``."""
        return [f"{self.name}{f's{i}' if i else ''}-{node}" for i in range(self.pods_per_node)]

    def used_claims(self) -> list[Claim]:
        """The claims every pod of the case names, in order."""
        return [c for c in self.claims if not c.unused]

    def pods(self, node: str) -> list[dict[str, Any]]:
        """The case's pod bodies for ``node``."""
        used = self.used_claims()
        names = [self.claim_name(c, node) for c in used]
        templates = {self.claim_name(c, node) for c in used if c.template}
        return [
            pinned(name.removesuffix(f"-{node}"), node, names, templates)
            for name in self.pod_names(node)
        ]

    def describe(self) -> str:
        """A short, replayable summary for assertion messages."""
        return f"{self.name} ({self.kind})"


def _device(r: random.Random, i: int, *, root: bool, nic: bool, opt_p: float) -> Device:
    attrs: dict[str, Any] = {
        "model": {"string": r.choice(MODELS)},
        "numa": {"int": r.randint(0, 3)},
        "fw": {"version": r.choice(FIRMWARE)},
        "tag": {"int": r.randint(0, 2)} if r.random() < 0.5 else {"string": r.choice("ab")},
    }
    if r.random() < opt_p:
        attrs["opt"] = {"string": r.choice("xy")}
    if root:
        attrs[PCIE_ROOT] = {"string": f"pci0000:{r.randint(0, 3):02x}"}
    if nic:
        attrs["rdma"] = {"bool": r.random() < 0.7}
    return {
        "name": f"{'nic' if nic else 'dev'}-{i}",
        "attributes": attrs,
        "capacity": {"memory": {"value": r.choice(MEMORY)}},
    }


def _devices(r: random.Random, n: int, **kw: Any) -> list[Device]:
    return [_device(r, i, **kw) for i in range(n)]


SAFE_KINDS: Final = (
    "model-eq",
    "model-in",
    "model-prefix",
    "numa",
    "fw",
    "memory",
    "has-opt",
    "opt-guarded",
    "tag-int",
    "bind",
    "driver",
)
"""Forms that never error on the generator's devices."""
ERROR_KINDS: Final = ("unknown-key", "unknown-capacity", "other-get", "opt-eq")


CONSTANT_KINDS: Final = ("other-has", "other-in", "other-not-has")
"""Never error, and false (true) on every device: an attribute of an unknown domain."""


def _sel(r: random.Random, kind: str | None = None) -> Sel:
    k = kind or r.choice(CONSTANT_KINDS if r.random() < 0.08 else SAFE_KINDS)
    if k == "model-eq":
        return Sel(k, (r.choice(("==", "!=")), r.choice(MODELS)))
    if k == "model-in":
        return Sel(k, tuple(sorted(set(r.sample(MODELS, 2)))))
    if k == "model-prefix":
        return Sel(k, (r.choice("AHB"),))
    if k == "numa":
        return Sel(k, (r.choice(CMP_OPS), r.randint(0, 3)))
    if k == "fw":
        return Sel(
            k, (r.choice(("eq", "compareTo", "isGreaterThan", "isLessThan")), r.choice(SEMVER_ARGS))
        )
    if k == "memory":
        return Sel(
            k,
            (r.choice(("eq", "compareTo", "isGreaterThan", "isLessThan")), r.choice(QUANTITY_ARGS)),
        )
    if k in ("opt-guarded", "opt-eq"):
        return Sel(k, (r.choice("xy"),))
    if k == "tag-int":
        return Sel(k, (r.randint(0, 2),))
    if k == "bind":
        return Sel(k, (r.choice(SEMVER_ARGS), r.randint(0, 3)))
    return Sel(k)


def _sels(r: random.Random, most: int = 2) -> list[Sel]:
    return [_sel(r) for _ in range(r.choice((0, 0, 1, 1, 2)[: most + 3]))]


KINDS: Final = (
    ("exact", 14),
    ("all", 8),
    ("incomplete-exact", 3),
    ("first-available", 9),
    ("match", 12),
    ("two-requests", 8),
    ("pair", 8),
    ("admin", 7),
    ("two-claims", 5),
    ("selector-error", 8),
    ("too-many", 4),
    ("generation", 4),
    ("missing-class", 2),
    ("shared", 5),
    ("held", 7),
    ("template", 5),
    ("multi-slice", 4),
    ("tainted", 6),
    ("partitioned", 6),
    ("shares", 8),
)
NEW_IN_136: Final = ("tainted", "partitioned", "shares")
"""Kinds whose fields (device taints and tolerations, shared counters, consumable capacity)
a 1.35 API server drops: not generated there."""


def kinds(release: str | None = None) -> tuple[tuple[str, int], ...]:
    """The :data:`KINDS` (with weights) the plane's release (or ``release``) supports."""
    if (release or kubernetes_version()) >= "v1.36":
        return KINDS
    return tuple((k, w) for k, w in KINDS if k not in NEW_IN_136)


def _taint(r: random.Random, key: str, no_execute: bool) -> dict[str, str]:
    effects = TAINT_EFFECTS if no_execute else tuple(e for e in TAINT_EFFECTS if e != "NoExecute")
    taint = {"key": key, "effect": r.choice(effects)}
    if r.random() < 0.5:
        taint["value"] = r.choice(TAINT_VALUES)
    return taint


def _toleration(r: random.Random, effect: bool) -> dict[str, str]:
    form = r.choice(("exists-any", "exists-key", "exists-key", "equal", "equal", "equal"))
    out: dict[str, str] = {}
    if form != "exists-any":
        out["key"] = r.choice(TAINT_KEYS)
    if form == "equal":
        out["operator"] = "Equal"
        value = r.choice((*TAINT_VALUES, ""))
        if value:
            out["value"] = value
    else:
        out["operator"] = "Exists"
    if effect or r.random() < 0.4:
        out["effect"] = r.choice(BLOCKING_EFFECTS)
    return out


def _tolerations(r: random.Random, effect: bool = False) -> list[dict[str, str]]:
    """A request's tolerations; each with an ``effect`` when ``effect`` (see
    :meth:`_Gen.taint`)."""
    return [_toleration(r, effect) for _ in range(r.choice((0, 1, 1, 2, 3)))]


PROFILES: Final = ("full", "half", "quarter", "small")


class _Gen:
    def __init__(self, seed: int, release: str | None = None) -> None:
        self.r = random.Random(seed)
        self.kinds = kinds(release)

    def driver(self, case: str, tag: str = "gpu", n: int | None = None, **kw: Any) -> Driver:
        r = self.r
        n = n if n is not None else r.choice((1, 2, 3, 4, 4, 6, 8, 8, 10, 12, 16))
        opt_p = r.choice((0.0, 0.5, 1.0))
        return Driver(
            name=f"{case}-{tag}{DOMAIN_SUFFIX}",
            cls=f"{case}-{tag}",
            devices=_devices(
                r, n, root=kw.get("root", r.random() < 0.3), nic=tag == "nic", opt_p=opt_p
            ),
            class_selectors=[_sel(r)] if r.random() < 0.2 else [],
        )

    def count(self, n: int) -> int:
        return self.r.choice((1, 1, 2, 2, 8, min(n, 8), n, n + 1, self.r.randint(1, n + 2)))

    def case(self, index: int) -> Case:
        r = self.r
        kind = r.choices([k for k, _ in self.kinds], weights=[w for _, w in self.kinds])[0]
        name = f"c{index}"
        d = self.driver(name)
        n = len(d.devices)
        drivers = [d]
        claims: list[Claim] = []
        missing = False
        constraint_attrs = [f"{d.name}/{a}" for a in ("model", "numa", "fw", "opt", "tag")]
        if any(PCIE_ROOT in x["attributes"] for x in d.devices):
            constraint_attrs.append(PCIE_ROOT)

        def one(sub: Sub, **kw: Any) -> Claim:
            return Claim("", [Request("gpu", [sub])], **kw)

        if kind == "exact":
            claims.append(one(Sub("", d.cls, _sels(r), count=self.count(n))))
        elif kind == "all":
            if r.random() < 0.3:
                d.slice_count = 2
            claims.append(one(Sub("", d.cls, _sels(r, 1), mode="All")))
        elif kind == "incomplete-exact":
            d.slice_count = 2
            claims.append(one(Sub("", d.cls, _sels(r, 1), count=self.count(n))))
        elif kind == "first-available":
            subs = [
                Sub(f"s{i}", d.cls, _sels(r), count=self.count(n)) for i in range(r.randint(2, 3))
            ]
            if r.random() < 0.15:
                subs[0].count = LIMIT + 1
            if r.random() < 0.2:
                # All only as the first subrequest: kube 1.34's allocator continues an All
                # subrequest past its first device with subrequest 0's data (the recursion
                # drops subRequestIndex), so an All fallback is not kube's All (reported
                # with a reproducer; Lattice takes every matching device).
                subs[0].mode = "All"
            claim = Claim("", [Request("gpu", subs, first_available=True)])
            if r.random() < 0.4:
                scope = r.choice((["gpu"], [f"gpu/{subs[0].name}"], []))
                claim.constraints.append(Constraint(scope, r.choice(constraint_attrs)))
            if r.random() < 0.3:
                claim.config_for.append(["gpu"])
            claims.append(claim)
        elif kind == "match":
            mode = "All" if r.random() < 0.25 else "ExactCount"
            sub = Sub("", d.cls, _sels(r, 1), mode=mode, count=r.randint(2, 4))
            claims.append(one(sub, constraints=[Constraint([], r.choice(constraint_attrs))]))
        elif kind == "two-requests":
            a = Sub("", d.cls, _sels(r, 1), count=r.randint(1, 2))
            b = Sub("", d.cls, _sels(r, 1), count=r.randint(1, 3))
            if r.random() < 0.2:
                r.choice((a, b)).mode = "All"
            scope = r.choice((["b"], ["a", "b"], ["a"], []))
            claim = Claim(
                "",
                [Request("a", [a]), Request("b", [b])],
                constraints=[Constraint(scope, r.choice(constraint_attrs))],
            )
            if r.random() < 0.4:
                claim.config_for.append([r.choice("ab")])
            if r.random() < 0.2:
                claim.config_for.append(["a", "b"])
            claims.append(claim)
        elif kind == "pair":
            gpu = self.driver(name, "gpu", root=True)
            nic = self.driver(name, "nic", n=r.randint(1, 8), root=True)
            drivers = [gpu, nic]
            gsub = Sub("", gpu.cls, _sels(r, 1), count=r.choice((1, 1, 2)))
            nsels = [Sel("rdma")] if r.random() < 0.5 else []
            nsub = Sub("", nic.cls, nsels, count=1)
            scope = r.choice((["gpu", "nic"], []))
            claims.append(
                Claim(
                    "",
                    [Request("gpu", [gsub]), Request("nic", [nsub])],
                    constraints=[Constraint(scope, PCIE_ROOT)],
                    config_for=[[], ["nic"]] if r.random() < 0.3 else [[]],
                )
            )
        elif kind == "admin":
            mode = "All" if r.random() < 0.3 else "ExactCount"
            admin = Sub("", d.cls, _sels(r, 1), mode=mode, count=r.randint(1, 3), admin=True)
            claims.append(one(admin))
            if r.random() < 0.6:
                # A second claim of the same pod holding (some of) the same devices first.
                used = Sub("", d.cls, [], count=r.randint(1, n))
                claims.insert(0, Claim("-u", [Request("gpu", [used])]))
        elif kind == "two-claims":
            for suffix in ("", "-b"):
                claims.append(
                    Claim(
                        suffix, [Request("gpu", [Sub("", d.cls, _sels(r, 1), count=self.count(n))])]
                    )
                )
        elif kind == "selector-error":
            bad = _sel(r, r.choice(ERROR_KINDS))
            sels = [bad] if r.random() < 0.6 else [_sel(r), bad]
            r.shuffle(sels)
            mode = "All" if r.random() < 0.25 else "ExactCount"
            claims.append(one(Sub("", d.cls, sels, mode=mode, count=self.count(n))))
        elif kind == "too-many":
            if r.random() < 0.5:
                claims.append(one(Sub("", d.cls, [], count=LIMIT + 1)))
            else:
                big = r.randint(17, LIMIT)
                claims.append(
                    Claim(
                        "",
                        [
                            Request("a", [Sub("", d.cls, [], count=big)]),
                            Request("b", [Sub("", d.cls, [], count=LIMIT + 1 - big)]),
                        ],
                    )
                )
        elif kind == "generation":
            # The older slice's devices all match what the claim asks; the current ones may not.
            d.old_devices = [
                {
                    "name": f"old-{i}",
                    "attributes": {"model": {"string": "B200"}, "numa": {"int": 0}},
                    "capacity": {"memory": {"value": "80Gi"}},
                }
                for i in range(r.randint(1, 8))
            ]
            sels = [Sel("model-eq", ("==", "B200"))] if r.random() < 0.5 else []
            claims.append(one(Sub("", d.cls, sels, count=r.randint(1, 4))))
        elif kind == "missing-class":
            missing = True
            claims.append(one(Sub("", f"{name}-nosuch", [], count=1)))
        elif kind == "shared":
            pods = r.choice((2, 2, 3))
            claim = one(Sub("", d.cls, _sels(r, 1), count=self.count(n)))
            if r.random() < 0.3:
                claim = self.held(d, pods=pods)
            claims.append(claim)
        elif kind == "held":
            held = self.held(d)
            variant = r.choice(("use", "use", "block", "elsewhere", "beside"))
            held.unused = variant == "block"
            held.held_elsewhere = variant == "elsewhere"
            claims.append(held)
            if variant in ("block", "beside"):
                claims.append(
                    Claim(
                        "-b", [Request("gpu", [Sub("", d.cls, _sels(r, 1), count=self.count(n))])]
                    )
                )
        elif kind == "template":
            claim = one(Sub("", d.cls, _sels(r), count=self.count(n)), template=True)
            if r.random() < 0.3:
                claim.constraints.append(Constraint([], r.choice(constraint_attrs)))
            claims.append(claim)
            if r.random() < 0.4:
                sub = Sub("", d.cls, _sels(r, 1), count=r.randint(1, 2))
                claims.append(Claim("-t", [Request("gpu", [sub])], template=True))
        elif kind == "multi-slice":
            if n < 2:
                d = self.driver(name, n=r.choice((2, 4, 8, 12, 16)))
                drivers, n = [d], len(d.devices)
            d.split = True
            d.slice_count = 2
            mode = "All" if r.random() < 0.25 else "ExactCount"
            claim = one(Sub("", d.cls, _sels(r, 1), mode=mode, count=self.count(n)))
            if r.random() < 0.3:
                claim.constraints.append(Constraint([], r.choice(constraint_attrs)))
            claims.append(claim)
        elif kind == "tainted":
            # No PCIe roots: Lattice's root-aware order would make the devices differ from
            # kube's first fit (allowed, but then only validity is compared).
            for x in d.devices:
                x["attributes"].pop(PCIE_ROOT, None)
            no_execute = self.taint(d)

            variant = r.choice(("exact", "exact", "first-available", "two-claims", "all"))

            def few() -> int:
                return r.choice((1, 1, 2, 2, 3, max(1, n // 2), n, self.count(n)))

            if variant == "first-available":
                subs = [
                    Sub(
                        f"s{i}",
                        d.cls,
                        _sels(r, 1),
                        count=few(),
                        tolerations=_tolerations(r, no_execute),
                    )
                    for i in range(r.randint(2, 3))
                ]
                claims.append(Claim("", [Request("gpu", subs, first_available=True)]))
            elif variant == "two-claims":
                for suffix in ("", "-b"):
                    sub = Sub("", d.cls, _sels(r, 1), count=r.randint(1, max(1, n // 2 + 1)))
                    sub.tolerations = _tolerations(r, no_execute)
                    claims.append(Claim(suffix, [Request("gpu", [sub])]))
            else:
                mode = "All" if variant == "all" else "ExactCount"
                sub = Sub("", d.cls, _sels(r, 1), mode=mode, count=few())
                sub.tolerations = _tolerations(r, no_execute)
                claims.append(one(sub))
        elif kind == "partitioned":
            d = self.partitioned(name)
            drivers, n = [d], len(d.devices)
            variant = r.choice(("one", "one", "two-claims", "first-available", "all"))

            def psub(sub_name: str = "") -> Sub:
                sels = [Sel("profile", (r.choice(PROFILES),))] if r.random() < 0.6 else []
                if r.random() < 0.2:
                    sels.append(_sel(r))
                return Sub(sub_name, d.cls, sels, count=r.choice((1, 1, 2, 2, 3, 4, n)))

            if variant == "two-claims":
                claims += [Claim(suffix, [Request("gpu", [psub()])]) for suffix in ("", "-b")]
            elif variant == "first-available":
                subs = [psub(f"s{i}") for i in range(r.randint(2, 3))]
                claims.append(Claim("", [Request("gpu", subs, first_available=True)]))
            else:
                sub = psub()
                if variant == "all":
                    sub.mode = "All"
                claims.append(one(sub))
        elif kind == "shares":
            d = self.shares(name)
            drivers = [d]
            variant = r.choice(("one", "two-requests", "distinct", "two-claims", "first"))

            def ssub(sub_name: str = "") -> Sub:
                ask = r.choice((*MEMORY_ASKS, None, None))
                sels = [_sel(r)] if r.random() < 0.15 else []
                count = r.choice((1, 1, 1, 2, 3))
                capacity = None if ask is None else {"memory": ask}
                return Sub(sub_name, d.cls, sels, count=count, capacity=capacity)

            if variant == "two-claims":
                claims += [Claim(suffix, [Request("gpu", [ssub()])]) for suffix in ("", "-b")]
            elif variant == "first":
                subs = [ssub(f"s{i}") for i in range(r.randint(2, 3))]
                claims.append(Claim("", [Request("gpu", subs, first_available=True)]))
            elif variant == "one":
                claims.append(one(ssub()))
            else:
                claim = Claim("", [Request("a", [ssub()]), Request("b", [ssub()])])
                if variant == "distinct":
                    scope = r.choice(([], ["a", "b"]))
                    claim.constraints.append(Constraint(scope, f"{d.name}/{UNIQUE}", True))
                claims.append(claim)
        else:
            raise AssertionError(kind)
        incomplete = any(x.slice_count > 1 and not x.split for x in drivers)
        side = incomplete or (kind in ("all", "admin", "match") and r.random() < 0.15)
        return Case(
            index,
            kind,
            drivers,
            claims,
            missing_class=missing,
            side=side,
            pods_per_node=pods if kind == "shared" else 1,
        )

    def taint(self, d: Driver) -> bool:
        """Taint some of ``d``'s devices (distinct keys per device); whether ``NoExecute``
        is among the effects. kube-controller-manager's device taint eviction spares a pod
        on a NoExecute device only for a toleration that names ``effect: NoExecute`` (an
        effect-less one lets the allocator take the device, then the pod is evicted and
        deleted: no verdict to compare), so where NoExecute taints are drawn every
        toleration names its effect; effect-less tolerations come with NoSchedule and
        None taints only."""
        r = self.r
        p = r.choice((0.3, 0.6, 1.0))
        no_execute = r.random() < 0.5
        for x in d.devices:
            if r.random() < p:
                keys = r.sample(TAINT_KEYS, r.choice((1, 1, 2)))
                x["taints"] = [_taint(r, k, no_execute) for k in keys]
        return no_execute

    def shares(self, case: str) -> Driver:
        """A driver of one to four devices (no PCIe roots), most allowing multiple
        allocations, each with a value of :data:`UNIQUE` of its own and a ``memory``
        request policy drawn from none, a default, a stepped range (4Gi steps up to a max)
        or valid values (all valid for the API server: the default inside, the bounds
        within the capacity)."""
        r = self.r
        d = self.driver(case, n=r.randint(1, 4), root=False)
        for i, x in enumerate(d.devices):
            x["attributes"][UNIQUE] = {"string": f"u{i}"}
            if r.random() < 0.2:
                continue  # one allocation only: the capacity bounds a request
            x["allowMultipleAllocations"] = True
            memory = x["capacity"]["memory"]
            top = _quantity(memory["value"]) // GI
            policy = r.choice(("none", "default", "range", "values"))
            if policy == "default":
                memory["requestPolicy"] = {"default": "4Gi"}
            elif policy == "range":
                most = r.choice((16, top))
                memory["requestPolicy"] = {
                    "default": "8Gi",
                    "validRange": {"min": "4Gi", "max": f"{most}Gi", "step": "4Gi"},
                }
            elif policy == "values":
                memory["requestPolicy"] = {
                    "default": "4Gi",
                    "validValues": ["4Gi", "8Gi", "16Gi"],
                }
        return d

    def partitioned(self, case: str) -> Driver:
        """A driver whose pool shares one counter set (memory and compute) among a full
        device consuming all of it and partitions consuming parts (no PCIe roots, so kube's
        first fit and Lattice's are the same devices)."""
        r = self.r
        gib, compute = r.choice((40, 80)), r.choice((7, 8))
        wanted = {
            "full": r.choice((0, 1, 1, 2)),
            "half": r.randint(0, 2),
            "quarter": r.randint(0, 4),
            "small": r.randint(0, 8),
        }
        if not any(wanted.values()):
            wanted["small"] = 1
        use = {
            "full": (gib, compute),
            "half": (gib // 2, compute // 2),
            "quarter": (gib // 4, max(1, compute // 4)),
            "small": (gib // 8, 1),
        }
        profiles = [p for p in PROFILES for _ in range(wanted[p])]
        if r.random() < 0.5:
            r.shuffle(profiles)
        d = self.driver(case, n=len(profiles), root=False)
        for x, profile in zip(d.devices, profiles, strict=True):
            x["attributes"]["profile"] = {"string": profile}
            mem, slices = use[profile]
            counters = {"memory": {"value": f"{mem}Gi"}, "compute": {"value": str(slices)}}
            if r.random() < 0.15:
                del counters[r.choice(("memory", "compute"))]
            x["consumesCounters"] = [{"counterSet": COUNTER_SET, "counters": counters}]
        d.counters = {"memory": f"{gib}Gi", "compute": str(compute)}
        return d

    def held(self, d: Driver, pods: int = 1) -> Claim:
        """A claim for k devices of ``d``, allocated by the test (k drawn devices its class
        accepts: a valid allocation, as a scheduler would have written it)."""

        def accepted(device: Device) -> bool:
            try:
                return all(s.truth(device, d.name) for s in d.class_selectors)
            except SelectorError:
                return False

        fits = [i for i, x in enumerate(d.devices) if accepted(x)]
        if not fits:
            d.class_selectors = []
            fits = list(range(len(d.devices)))
        k = self.r.randint(1, min(len(fits), 4 if pods > 1 else len(fits)))
        picked = sorted(self.r.sample(fits, k))
        return Claim(
            "-h",
            [Request("gpu", [Sub("", d.cls, [], count=k)])],
            held=[d.devices[i]["name"] for i in picked],
        )


def generate(seed: int, count: int, release: str | None = None) -> list[Case]:
    """``count`` cases from ``seed``: the same seed (and release: :func:`kinds`) gives the
    same cases."""
    g = _Gen(seed, release)
    return [g.case(i) for i in range(count)]


def _opaque(driver: str, **parameters: Any) -> dict[str, Any]:
    return {"opaque": {"driver": driver, "parameters": parameters}}


def class_config(d: Driver) -> dict[str, Any]:
    return _opaque(d.name, source="class", cls=d.cls)


def claim_config(case: Case, claim: Claim, i: int) -> dict[str, Any]:
    return _opaque(case.drivers[0].name, source="claim", index=i)


def objects(case: Case, ns: str) -> list[dict[str, Any]]:
    """The case's DeviceClasses, slices (both nodes) and claims (both nodes)."""
    out: list[dict[str, Any]] = []
    for d in case.drivers:
        selectors = [Sel("driver"), *d.class_selectors]
        out.append(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": d.cls},
                "spec": {
                    "selectors": [{"cel": {"expression": s.cel(d.name)}} for s in selectors],
                    "config": [class_config(d)],
                },
            }
        )
    for node in case.nodes:
        for d in case.drivers:
            generation = 1 if d.old_devices is None else 2
            pool = {
                "name": d.pool(node),
                "generation": generation,
                "resourceSliceCount": d.slice_count + (d.counters is not None),
            }
            if d.counters is not None:
                # v1: a slice holds sharedCounters or devices, never both.
                counters = {k: {"value": v} for k, v in d.counters.items()}
                out.append(
                    {
                        "apiVersion": "resource.k8s.io/v1",
                        "kind": "ResourceSlice",
                        "metadata": {"name": f"{d.pool(node)}-counters"},
                        "spec": {
                            "driver": d.name,
                            "nodeName": node,
                            "pool": pool,
                            "sharedCounters": [{"name": COUNTER_SET, "counters": counters}],
                        },
                    }
                )
            parts = (
                [
                    (f"{d.pool(node)}-s{i}", d.devices[i :: d.slice_count])
                    for i in range(d.slice_count)
                ]
                if d.split
                else [(d.pool(node), d.devices)]
            )
            for slice_name, devices in parts:
                out.append(
                    {
                        "apiVersion": "resource.k8s.io/v1",
                        "kind": "ResourceSlice",
                        "metadata": {"name": slice_name},
                        "spec": {
                            "driver": d.name,
                            "nodeName": node,
                            "pool": pool,
                            "devices": devices,
                        },
                    }
                )
            if d.old_devices is not None:
                out.append(
                    {
                        "apiVersion": "resource.k8s.io/v1",
                        "kind": "ResourceSlice",
                        "metadata": {"name": f"{d.pool(node)}-old"},
                        "spec": {
                            "driver": d.name,
                            "nodeName": node,
                            "pool": {**pool, "generation": 1},
                            "devices": d.old_devices,
                        },
                    }
                )
        for claim in case.claims:
            meta = {"name": case.claim_name(claim, node), "namespace": ns}
            spec = {"devices": claim_spec(case, claim)}
            if claim.template:
                out.append(
                    {
                        "apiVersion": "resource.k8s.io/v1",
                        "kind": "ResourceClaimTemplate",
                        "metadata": meta,
                        "spec": {"spec": spec},
                    }
                )
                continue
            body: dict[str, Any] = {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": meta,
                "spec": spec,
            }
            if claim.held is not None:
                # kubectl apply leaves status alone: the test writes it (held_status).
                body["status"] = held_status(case, claim, node)
            out.append(body)
    return out


def held_status(case: Case, claim: Claim, node: str) -> dict[str, Any]:
    """The status a held claim starts with: its devices allocated as kube 1.34.4 writes an
    allocation (results, configs, a nodeSelector pinning the node), reserved for nobody."""
    from tests.e2e.differential.dra_check import expected_config

    assert claim.held is not None
    (request,) = claim.requests
    (sub,) = request.alternatives
    d = case.driver_of(sub.cls)
    assert d is not None
    pinned_to = ELSEWHERE if claim.held_elsewhere else node
    return {
        "allocation": {
            "devices": {
                "results": [
                    {"request": request.name, "driver": d.name, "pool": d.pool(node), "device": x}
                    for x in claim.held
                ],
                "config": expected_config(case, claim, {request.name: sub}),
            },
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {
                        "matchFields": [
                            {"key": "metadata.name", "operator": "In", "values": [pinned_to]}
                        ]
                    }
                ]
            },
        }
    }


def claim_spec(case: Case, claim: Claim) -> dict[str, Any]:
    def driver_name(cls: str) -> str:
        d = case.driver_of(cls)
        return d.name if d else case.drivers[0].name

    requests: list[dict[str, Any]] = []
    for req in claim.requests:
        if req.first_available:
            subs = [{"name": s.name, **s.body(driver_name(s.cls))} for s in req.alternatives]
            requests.append({"name": req.name, "firstAvailable": subs})
        else:
            (s,) = req.alternatives
            requests.append({"name": req.name, "exactly": s.body(driver_name(s.cls))})
    devices: dict[str, Any] = {"requests": requests}
    if claim.constraints:
        devices["constraints"] = [
            {
                **({"requests": c.requests} if c.requests else {}),
                ("distinctAttribute" if c.distinct else "matchAttribute"): c.attribute,
            }
            for c in claim.constraints
        ]
    devices["config"] = [
        {**({"requests": names} if names else {}), **claim_config(case, claim, i)}
        for i, names in enumerate(claim.config_for)
    ]
    return devices


def reproducer(case: Case, ns: str) -> list[dict[str, Any]]:
    """The case's objects for kube-scheduler's node only: apply them, pin a pod there."""
    kube_node = case.nodes[0]
    return [
        o
        for o in objects(case, ns)
        if o["kind"] == "DeviceClass"
        or o["spec"].get("nodeName") == kube_node
        or o["metadata"]["name"].endswith(kube_node)
    ]
