"""The live part of the configuration: a LatticeScheduler object's spec, typed.

The spec is applied while running (a new profile takes effect from the next
cycle). A spec that does not validate is reported in the object's status and
the previous settings stay in force: a typo must not stop scheduling.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from scheduler.core.dra.binding import BINDING_TIMEOUT
from scheduler.core.dra.search import SEARCH_BUDGET
from scheduler.core.profile import (
    DEFAULT_KUBE_MINOR,
    DEFAULT_PROFILE,
    DynamicResourcesArgs,
    GpuPlacementArgs,
    GpuPolicy,
    LoadAwareArgs,
    LoadScoreMode,
    Profile,
    ScoringStrategy,
)
from scheduler.core.registry import UnknownPluginError, default_registry
from scheduler.model.errors import InvalidObjectError
from scheduler.model.names import qualified_name_error, subdomain_error
from scheduler.model.selectors import LabelSelector
from scheduler.predict import ConfigError, PredictConfig

API_GROUP = "lattice.dev"
API_VERSION = "v1alpha1"
PLURAL = "latticeschedulers"


BIND_CONCURRENCY = 64
"""Bindings in flight by default. Measured with `just bench --nodes 200 --pods 3000
--workloads plain --repeat 2 --bind-concurrency N`: 16 capped Lattice at 282-356 pods/s (a
binding's round trip, not the cycle, was the limit), 64 gave 412-436 with stream p99
97-417 ms, 256 gave 320-326 with p99 613-699 ms (the API server queues them)."""


class SettingsError(ValueError):
    """The spec is invalid; the message says which field and why."""


@dataclass(frozen=True)
class SchedulerSettings:
    scheduler_name: str = "lattice"
    profile: Profile = field(default_factory=lambda: DEFAULT_PROFILE)
    bind_concurrency: int = BIND_CONCURRENCY
    client_qps: float = 500.0
    client_burst: int = 1000
    percentage_of_nodes_to_score: int = 0
    """Recorded, and shown in status. Lattice filters and scores every node: its
    vectorised cycle costs less than kube-scheduler's sampling saves."""
    seed: int = 0
    scheduled_events: bool = True
    """One ``Scheduled`` Event per binding, as kube-scheduler writes; off halves the writes
    per pod (the binding itself and PodScheduled=True still say where it went)."""
    gang: GangSettings = field(default_factory=lambda: GangSettings())
    topology: TopologySettings = field(default_factory=lambda: TopologySettings())
    quota: QuotaSettings = field(default_factory=lambda: QuotaSettings())


class QuotaPolicy(enum.StrEnum):
    """spec.quota.policy: what decides between tenants beyond CapacityScheduling's rules."""

    FAIR = "Fair"
    """CapacityScheduling's admission and reclaim, plus weighted fair share: among pending
    pods of equal priority the tenant furthest below its fair share goes first, and reclaim
    takes from the quota furthest above its fair share first; a quota above its min but
    within its fair share may also reclaim from quotas above theirs, each only down to its
    fair share (:mod:`scheduler.core.reclaim`)."""
    CAPACITY = "Capacity"
    """CapacityScheduling exactly: equal priorities in arrival order."""


@dataclass(frozen=True)
class QuotaSettings:
    """spec.quota. Fair by default: it keeps every rule CapacityScheduling guarantees (max,
    the sum of mins, who may reclaim from whom) and only decides what CapacityScheduling
    leaves to arrival order, which is what lets the first team to submit take the idle
    GPUs; with no ``lattice.dev/quota-weight`` annotation the leftover is split evenly."""

    policy: QuotaPolicy = QuotaPolicy.FAIR


def parse_quota_settings(raw: object) -> QuotaSettings:
    if raw is None:
        return QuotaSettings()
    if not isinstance(raw, Mapping):
        raise SettingsError("spec.quota must be an object")
    problems = [f"spec.quota: unknown key {k!r}" for k in raw if k != "policy"]
    policy: object = raw.get("policy", QuotaPolicy.FAIR.value)
    if policy not in {p.value for p in QuotaPolicy}:
        problems.append(f"spec.quota.policy: {policy!r} is not Fair or Capacity")
    if problems:
        raise SettingsError("; ".join(problems))
    return QuotaSettings(policy=QuotaPolicy(str(policy)))


@dataclass(frozen=True)
class TopologySettings:
    """spec.topology: the cluster's network hierarchy, for gangs placed in it."""

    levels: tuple[str, ...] = ()
    """Node label keys, widest first (block, rack, host). A gang that prefers one level
    is also kept compact at every wider one; keys not listed still work as one level.
    With ``from_kueue``: the levels read from that Topology (empty until it is read)."""
    from_kueue: str | None = None
    """spec.topology.fromKueue: the name of a Kueue ``Topology`` (kueue.x-k8s.io) whose
    ``spec.levels[].nodeLabel`` are the levels, followed live
    (:mod:`scheduler.control.kueue`), so the hierarchy is written down once."""


MAX_TOPOLOGY_LEVELS = 8
"""Kueue's Topology allows 16 levels (8 before v1beta2) and uses 3-5; each level is a
tier of the gang's objective, so a bound keeps it within int64."""

_TOPOLOGY_KEYS = frozenset({"levels", "fromKueue"})


def level_problems(levels: object, field: str) -> list[str]:
    """What is wrong with a list of levels (distinct node label keys, at most
    :data:`MAX_TOPOLOGY_LEVELS`); ``field`` names it in each message. The same rules for
    ``spec.topology.levels`` and a Kueue Topology's ``spec.levels[].nodeLabel``."""
    if not isinstance(levels, list):
        return [f"{field}: {levels!r} is not a list of node label keys"]
    problems: list[str] = []
    if len(levels) > MAX_TOPOLOGY_LEVELS:
        problems.append(f"{field}: {len(levels)} levels, at most {MAX_TOPOLOGY_LEVELS}")
    seen: set[str] = set()
    for i, key in enumerate(levels):
        if not isinstance(key, str):
            problems.append(f"{field}[{i}]: {key!r} is not a node label key")
            continue
        problem = qualified_name_error(key)
        if problem is not None:
            problems.append(f"{field}[{i}]: {key!r} is not a label key: {problem}")
        elif key in seen:
            problems.append(f"{field}[{i}]: {key!r} is listed twice")
        seen.add(key)
    return problems


def parse_topology(raw: object) -> TopologySettings:
    """spec.topology: either ``levels`` (distinct node label keys, widest first) or
    ``fromKueue`` (a Kueue Topology's name), not both."""
    if raw is None:
        return TopologySettings()
    if not isinstance(raw, Mapping):
        raise SettingsError("spec.topology must be an object")
    problems = [f"spec.topology: unknown key {k!r}" for k in raw if k not in _TOPOLOGY_KEYS]
    levels: object = raw.get("levels")
    if levels is None:
        levels = []
    problems += level_problems(levels, "spec.topology.levels")
    source: object = raw.get("fromKueue")
    if source is not None:
        if not isinstance(source, str) or (problem := subdomain_error(source)) is not None:
            why = "not a string" if not isinstance(source, str) else problem
            problems.append(f"spec.topology.fromKueue: {source!r} is not an object name: {why}")
        if levels:
            problems.append(
                "spec.topology: levels and fromKueue are both set; give the levels in one"
                " place: fromKueue reads them from the Kueue Topology"
            )
    if problems:
        raise SettingsError("; ".join(problems))
    assert isinstance(levels, list)
    if source is not None:
        return TopologySettings(from_kueue=str(source))
    return TopologySettings(levels=tuple(str(k) for k in levels))


@dataclass(frozen=True)
class GangSettings:
    """spec.gang: how a PodGroup is placed."""

    solver_time_limit_s: float = 1.0
    """CP-SAT's budget per gang; the greedy answer stands when it runs out."""
    use_solver: bool = True
    """False: greedy only (what the benchmark compares against)."""
    partial_boost_s: int = 60
    """How long a partial gang whose PodGroup has no ``scheduleTimeoutSeconds`` ranks ahead
    of every pod. Its bound members hold capacity while it waits, so it gets first claim,
    but not forever: 60 s is coscheduling's ``permitWaitingTimeSeconds``, how long its
    members would hold a reservation waiting for the rest."""


def parse_gang(raw: object) -> GangSettings:
    if raw is None:
        return GangSettings()
    if not isinstance(raw, Mapping):
        raise SettingsError("spec.gang must be an object")
    problems: list[str] = []
    limit: object = raw.get("solverTimeLimitSeconds", 1.0)
    if isinstance(limit, bool) or not isinstance(limit, int | float) or not 0 < limit <= 60:
        problems.append(f"spec.gang.solverTimeLimitSeconds: {limit!r} is not within (0, 60]")
    solver: object = raw.get("solver", "CPSAT")
    if solver not in ("CPSAT", "Greedy"):
        problems.append(f"spec.gang.solver: {solver!r} is not CPSAT or Greedy")
    boost: object = raw.get("partialBoostSeconds", GangSettings.partial_boost_s)
    if isinstance(boost, bool) or not isinstance(boost, int) or boost < 0:
        problems.append(f"spec.gang.partialBoostSeconds: {boost!r} is not an integer >= 0")
    for key in raw:
        if key not in ("solverTimeLimitSeconds", "solver", "partialBoostSeconds"):
            problems.append(f"spec.gang: unknown key {key!r}")
    if problems:
        raise SettingsError("; ".join(problems))
    assert isinstance(limit, int | float)
    assert isinstance(boost, int)
    return GangSettings(
        solver_time_limit_s=float(limit), use_solver=solver == "CPSAT", partial_boost_s=boost
    )


def parse_gpu_placement(raw: object) -> GpuPlacementArgs:
    """spec.gpuPlacement into GPUPlacement's arguments; every bad key is reported at once."""
    if raw is None:
        return GpuPlacementArgs()
    if not isinstance(raw, Mapping):
        raise SettingsError("spec.gpuPlacement must be an object")
    problems: list[str] = []
    policy = GpuPlacementArgs().policy
    resources = GpuPlacementArgs().resources
    for key, value in raw.items():
        if key == "policy":
            try:
                policy = GpuPolicy(value)
            except ValueError:
                known = ", ".join(p.value for p in GpuPolicy)
                problems.append(f"spec.gpuPlacement.policy: {value!r} is not one of {known}")
        elif key == "resources":
            if (
                not isinstance(value, list)
                or not value
                or not all(isinstance(r, str) and "/" in r for r in value)
            ):
                problems.append(
                    f"spec.gpuPlacement.resources: {value!r} is not a non-empty list of"
                    " extended resource names (domain/name)"
                )
            else:
                resources = tuple(dict.fromkeys(value))
        else:
            problems.append(f"spec.gpuPlacement: unknown key {key!r}")
    if problems:
        raise SettingsError("; ".join(problems))
    return GpuPlacementArgs(policy=policy, resources=resources)


BINDING_TIMEOUT_MAX = 86400.0
"""The largest ``spec.dra.bindingTimeoutSeconds`` (a day: a binding that waits longer
holds its devices and node room for nothing)."""
SEARCH_BUDGET_MAX = 60.0
"""The largest ``spec.dra.searchBudgetSeconds``: past kube's 10 s per node, a minute of
search per attempt serves no one."""


def parse_dra(raw: object) -> DynamicResourcesArgs:
    """spec.dra into DynamicResources' arguments (a bad selector is a clear error)."""
    if raw is None:
        return DynamicResourcesArgs()
    if not isinstance(raw, Mapping):
        raise SettingsError("spec.dra must be an object")
    unknown = sorted(set(raw) - {"nodeSelector", "searchBudgetSeconds", "bindingTimeoutSeconds"})
    if unknown:
        raise SettingsError(f"spec.dra: unknown key {unknown[0]!r}")
    timeout: object = raw.get("bindingTimeoutSeconds", BINDING_TIMEOUT)
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not 0 < timeout <= BINDING_TIMEOUT_MAX
    ):
        raise SettingsError(
            f"spec.dra.bindingTimeoutSeconds: {timeout!r} is not a number within "
            f"(0, {BINDING_TIMEOUT_MAX:g}]"
        )
    budget: object = raw.get("searchBudgetSeconds", SEARCH_BUDGET)
    if (
        isinstance(budget, bool)
        or not isinstance(budget, int | float)
        or not 0 < budget <= SEARCH_BUDGET_MAX
    ):
        raise SettingsError(
            f"spec.dra.searchBudgetSeconds: {budget!r} is not a number within "
            f"(0, {SEARCH_BUDGET_MAX:g}]"
        )
    body = raw.get("nodeSelector")
    if body is None:
        return DynamicResourcesArgs(search_budget=float(budget), binding_timeout=float(timeout))
    try:
        selector = LabelSelector.from_api(body, field="spec.dra.nodeSelector")
    except InvalidObjectError as exc:
        raise SettingsError(str(exc)) from exc
    return DynamicResourcesArgs(
        node_selector=selector, search_budget=float(budget), binding_timeout=float(timeout)
    )


def default_spec(scheduler_name: str) -> dict[str, Any]:
    """The object `lattice run` creates when none exists."""
    s = SchedulerSettings(scheduler_name=scheduler_name)
    load = s.profile.load_aware.predict
    return {
        "schedulerName": scheduler_name,
        "bindConcurrency": s.bind_concurrency,
        "clientQPS": s.client_qps,
        "clientBurst": s.client_burst,
        "percentageOfNodesToScore": s.percentage_of_nodes_to_score,
        "seed": s.seed,
        "plugins": [{"name": n, "enabled": True, "weight": w} for n, w in s.profile.scores],
        "loadAware": {
            "mode": s.profile.load_aware.mode.value,
            "cpuAlpha": load.cpu_alpha,
            "memoryAlpha": load.memory_alpha,
            "reportIntervalSeconds": load.report_interval_s,
            "staleAfterSeconds": load.stale_after_s,
            "settleDelaySeconds": load.settle_delay_s,
            "cpuPreferBelow": load.cpu_prefer_below,
            "memoryPreferBelow": load.memory_prefer_below,
        },
        "gang": {
            "solver": "CPSAT",
            "solverTimeLimitSeconds": s.gang.solver_time_limit_s,
            "partialBoostSeconds": s.gang.partial_boost_s,
        },
        "gpuPlacement": {
            "policy": s.profile.gpu_placement.policy.value,
            "resources": list(s.profile.gpu_placement.resources),
        },
        "dra": {
            "nodeSelector": {},
            "searchBudgetSeconds": s.profile.dynamic_resources.search_budget,
            "bindingTimeoutSeconds": s.profile.dynamic_resources.binding_timeout,
        },
        "topology": {"levels": list(s.topology.levels)},
        "quota": {"policy": s.quota.policy.value},
    }


_LOAD_KEYS: dict[str, str] = {
    "cpuAlpha": "cpu_alpha",
    "memoryAlpha": "memory_alpha",
    "reportIntervalSeconds": "report_interval_s",
    "trendBeta": "trend_beta",
    "horizonSeconds": "horizon_s",
    "staleAfterSeconds": "stale_after_s",
    "maxFutureSkewSeconds": "max_future_skew_s",
    "settleDelaySeconds": "settle_delay_s",
    "cpuRequestScale": "cpu_request_scale",
    "memoryRequestScale": "memory_request_scale",
    "defaultCPUMillicores": "default_cpu_milli",
    "defaultMemoryBytes": "default_memory_bytes",
    "inflightMinWeight": "inflight_min_weight",
    "cpuThreshold": "cpu_threshold",
    "memoryThreshold": "memory_threshold",
    "cpuPressureThreshold": "cpu_pressure_threshold",
    "memoryPressureThreshold": "memory_pressure_threshold",
    "cpuPreferBelow": "cpu_prefer_below",
    "memoryPreferBelow": "memory_prefer_below",
    "cpuWeight": "cpu_weight",
    "memoryWeight": "memory_weight",
    "cpuTarget": "cpu_target",
    "memoryTarget": "memory_target",
}
"""spec.loadAware keys -> PredictConfig fields (the spec speaks Kubernetes camelCase)."""
_INT_FIELDS = frozenset(
    {"default_cpu_milli", "default_memory_bytes", "cpu_weight", "memory_weight"}
)


def parse_load_aware(raw: object) -> LoadAwareArgs:
    """spec.loadAware into LoadAware's arguments; every bad key is reported at once."""
    if raw is None:
        return LoadAwareArgs()
    if not isinstance(raw, Mapping):
        raise SettingsError("spec.loadAware must be an object")
    problems: list[str] = []
    mode = LoadScoreMode.LEAST_LOADED
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key == "mode":
            try:
                mode = LoadScoreMode(value)
            except ValueError:
                known = " or ".join(m.value for m in LoadScoreMode)
                problems.append(f"spec.loadAware.mode: {value!r} is not {known}")
            continue
        name = _LOAD_KEYS.get(key)
        if name is None:
            problems.append(f"spec.loadAware: unknown key {key!r}")
            continue
        if value is None:
            values[name] = None
        elif isinstance(value, bool) or not isinstance(value, int | float):
            problems.append(f"spec.loadAware.{key}: {value!r} is not a number")
        elif name in _INT_FIELDS:
            if value != int(value):
                problems.append(f"spec.loadAware.{key}: {value!r} is not an integer")
            values[name] = int(value)
        else:
            values[name] = float(value)
    if not problems:
        try:
            predict = PredictConfig(**values)
        except ConfigError as exc:
            reverse = {v: k for k, v in _LOAD_KEYS.items()}
            for problem in exc.problems:
                field_name, _, rest = problem.partition(" ")
                problems.append(f"spec.loadAware.{reverse.get(field_name, field_name)} {rest}")
    if problems:
        raise SettingsError("; ".join(problems))
    return LoadAwareArgs(mode=mode, predict=predict)


def _int(spec: Mapping[str, Any], key: str, default: int, lo: int, hi: int) -> int:
    value: object = spec.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise SettingsError(f"spec.{key}: {value!r} is not an integer within {lo}..{hi}")
    return value


def _bool(spec: Mapping[str, Any], key: str, default: bool) -> bool:
    value: object = spec.get(key, default)
    if not isinstance(value, bool):
        raise SettingsError(f"spec.{key}: {value!r} is not true or false")
    return value


def parse_spec(
    spec: Mapping[str, Any], scheduler_name: str, *, kube_minor: int = DEFAULT_KUBE_MINOR
) -> SchedulerSettings:
    """Validate a LatticeScheduler spec into settings; SettingsError says what is wrong.

    ``kube_minor`` is not part of the spec: it is the cluster's release (read from the API
    server at start, see release.py), the same for every spec applied."""
    if not isinstance(spec, Mapping):
        raise SettingsError("spec must be an object")
    name = spec.get("schedulerName", scheduler_name)
    if name != scheduler_name:
        raise SettingsError(
            f"spec.schedulerName {name!r} differs from this scheduler's {scheduler_name!r}"
        )
    qps = spec.get("clientQPS", 500.0)
    if isinstance(qps, bool) or not isinstance(qps, int | float) or qps <= 0:
        raise SettingsError(f"spec.clientQPS: {qps!r} is not a positive number")
    registry = default_registry()
    known = set(registry.names())
    filters = list(DEFAULT_PROFILE.filters)
    weights = dict(DEFAULT_PROFILE.scores)
    strategy = DEFAULT_PROFILE.node_resources_fit.strategy
    raw_plugins = spec.get("plugins") or []
    if not isinstance(raw_plugins, list):
        raise SettingsError("spec.plugins must be a list")
    for i, item in enumerate(raw_plugins):
        if not isinstance(item, Mapping) or not isinstance(item.get("name"), str):
            raise SettingsError(f"spec.plugins[{i}] needs a name")
        plugin = item["name"]
        if plugin not in known:
            raise SettingsError(
                f"spec.plugins[{i}]: unknown plugin {plugin!r}; known: {', '.join(sorted(known))}"
            )
        if item.get("enabled", True) is False:
            filters = [f for f in filters if f != plugin]
            weights.pop(plugin, None)
            continue
        if "weight" in item:
            weight = item["weight"]
            if isinstance(weight, bool) or not isinstance(weight, int) or not 0 <= weight <= 100:
                raise SettingsError(f"spec.plugins[{i}].weight: {weight!r} is not within 0..100")
            if weight == 0:
                weights.pop(plugin, None)
            else:
                weights[plugin] = weight
        args = item.get("args") or {}
        if plugin == "NodeResourcesFit" and "scoringStrategy" in args:
            try:
                strategy = ScoringStrategy(args["scoringStrategy"])
            except ValueError:
                raise SettingsError(
                    f"spec.plugins[{i}].args.scoringStrategy: {args['scoringStrategy']!r} is not"
                    " LeastAllocated or MostAllocated"
                ) from None
    try:
        profile = Profile(
            name=scheduler_name,
            filters=tuple(filters),
            scores=tuple(weights.items()),
            node_resources_fit=dataclasses.replace(
                DEFAULT_PROFILE.node_resources_fit, strategy=strategy
            ),
            load_aware=parse_load_aware(spec.get("loadAware")),
            gpu_placement=parse_gpu_placement(spec.get("gpuPlacement")),
            dynamic_resources=parse_dra(spec.get("dra")),
            kube_minor=kube_minor,
        )
        # A weight on a plugin that does not score (NodePorts, say) would otherwise pass
        # here and raise later, out of apply_settings, when the framework is built.
        registry.build(profile)
    except ValueError as exc:
        raise SettingsError(str(exc)) from exc
    except UnknownPluginError as exc:
        raise SettingsError(
            f"spec.plugins: {exc.args[0]} (only score plugins take a weight)"
        ) from exc
    return SchedulerSettings(
        scheduler_name=scheduler_name,
        profile=profile,
        bind_concurrency=_int(spec, "bindConcurrency", BIND_CONCURRENCY, 1, 1024),
        client_qps=float(qps),
        client_burst=_int(spec, "clientBurst", 1000, 1, 1_000_000),
        percentage_of_nodes_to_score=_int(spec, "percentageOfNodesToScore", 0, 0, 100),
        seed=_int(spec, "seed", 0, -(2**63), 2**63 - 1),
        scheduled_events=_bool(spec, "scheduledEvents", True),
        gang=parse_gang(spec.get("gang")),
        topology=parse_topology(spec.get("topology")),
        quota=parse_quota_settings(spec.get("quota")),
    )
