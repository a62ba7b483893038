"""Synthetic node load, for simulated agents on fake nodes and for tests.

A node's demand at time t is the sum of
  * a per-node base load (fraction of capacity),
  * Gaussian noise,
  * hotspots: a set of nodes that heat up at `start` for `duration_s`, with
    linear ramps up and down (a trapezoid), and
  * the pods the caller says run there: requests times a usage ratio, ramping
    in over a warm-up after they start (a new pod shows in usage late, which is
    exactly what the predictor's settle delay is for).
Use is demand clipped to capacity; the excess shows as PSI pressure (a toy
model: CPU pressure grows from 80 % demand, memory pressure from 90 %).

Reproducible by construction: the noise of a sample is drawn from a generator
seeded by (seed, node name, sample time in ms), so a sample depends only on
its arguments - not on call order or on which other nodes were sampled - and
the same seed gives the same samples in every process.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from scheduler.predict.types import LoadReport, PsiSample

GIB = 1024**3
_U64 = 2**64
_NOISE_STREAM = 0
_TIMES_STREAM = 1
_FLEET_STREAM = 2


@dataclass(frozen=True, slots=True, kw_only=True)
class SyntheticNode:
    """A fake node's size and its load when nothing special happens."""

    name: str
    cpu_capacity_milli: int = 4000
    mem_capacity_bytes: int = 16 * GIB
    base_cpu: float = 0.1
    """Base CPU demand (system daemons, foreign pods) as a fraction of capacity."""
    base_memory: float = 0.2
    noise_cpu: float = 0.02
    """Standard deviation of CPU noise, as a fraction of capacity."""
    noise_memory: float = 0.005


@dataclass(frozen=True, slots=True, kw_only=True)
class Hotspot:
    """Extra demand on some nodes for a while, rising and falling linearly over `ramp_s`."""

    nodes: frozenset[str]
    start: float
    duration_s: float
    cpu: float = 0.6
    """Extra CPU demand at the peak, as a fraction of capacity."""
    memory: float = 0.0
    ramp_s: float = 0.0

    def intensity(self, t: float) -> float:
        """0 outside, 1 on the plateau, linear on the ramps (within [start, start + duration])."""
        end = self.start + self.duration_s
        if t < self.start or t > end:
            return 0.0
        if self.ramp_s <= 0.0:
            return 1.0
        return min(1.0, (t - self.start) / self.ramp_s, (end - t) / self.ramp_s)


@dataclass(frozen=True, slots=True, kw_only=True)
class PodLoad:
    """A pod running on a fake node: uses `usage_ratio` times its requests once warm."""

    cpu_request_milli: int
    mem_request_bytes: int
    usage_ratio: float = 1.0
    memory_usage_ratio: float | None = None
    """Defaults to `usage_ratio`."""
    started_at: float = -math.inf
    warmup_s: float = 0.0

    def usage(self, t: float) -> tuple[float, float]:
        """(cpu millicores, memory bytes) used at time t."""
        if t < self.started_at:
            return 0.0, 0.0
        ramp = 1.0 if self.warmup_s <= 0.0 else min(1.0, (t - self.started_at) / self.warmup_s)
        mem_ratio = self.usage_ratio if self.memory_usage_ratio is None else self.memory_usage_ratio
        return (
            ramp * self.usage_ratio * self.cpu_request_milli,
            ramp * mem_ratio * self.mem_request_bytes,
        )


def _rng(seed: int, node: str, stream: int, tick: int) -> np.random.Generator:
    entropy = [seed % _U64, zlib.crc32(node.encode()), stream, tick % _U64]
    return np.random.default_rng(np.random.SeedSequence(entropy))


def _ramp(value: float, start: float, width: float) -> float:
    """0 below start, rising linearly to 100 at start + width: a percentage of pressure."""
    return 100.0 * min(1.0, max(0.0, (value - start) / width))


class SyntheticLoad:
    """Samples in the agent's shape for a fixed set of fake nodes."""

    def __init__(
        self,
        nodes: Sequence[SyntheticNode],
        *,
        seed: int,
        hotspots: Sequence[Hotspot] = (),
    ) -> None:
        self._nodes = {n.name: n for n in nodes}
        if len(self._nodes) != len(nodes):
            raise ValueError("duplicate node names")
        self._seed = seed
        self._hotspots = tuple(hotspots)

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(self._nodes)

    def sample(self, node: str, t: float, pods: Sequence[PodLoad] = ()) -> LoadReport:
        """The report `node` would send at time t while running `pods`."""
        spec = self._nodes[node]
        noise = _rng(self._seed, node, _NOISE_STREAM, round(t * 1000)).standard_normal(2)
        cpu_frac = spec.base_cpu + spec.noise_cpu * float(noise[0])
        mem_frac = spec.base_memory + spec.noise_memory * float(noise[1])
        for hotspot in self._hotspots:
            if node in hotspot.nodes:
                k = hotspot.intensity(t)
                cpu_frac += k * hotspot.cpu
                mem_frac += k * hotspot.memory
        cpu_demand = cpu_frac * spec.cpu_capacity_milli
        mem_demand = mem_frac * spec.mem_capacity_bytes
        for pod in pods:
            pod_cpu, pod_mem = pod.usage(t)
            cpu_demand += pod_cpu
            mem_demand += pod_mem
        cpu_demand = max(cpu_demand, 0.0)
        mem_demand = max(mem_demand, 0.0)
        cpu_u = cpu_demand / spec.cpu_capacity_milli
        mem_u = mem_demand / spec.mem_capacity_bytes
        memory_some = _ramp(mem_u, 0.9, 0.2)
        return LoadReport(
            node=node,
            sample_time=t,
            cpu_used_milli=min(cpu_demand, float(spec.cpu_capacity_milli)),
            mem_used_bytes=float(round(min(mem_demand, float(spec.mem_capacity_bytes)))),
            cpu_capacity_milli=spec.cpu_capacity_milli,
            mem_capacity_bytes=spec.mem_capacity_bytes,
            psi=PsiSample(
                cpu_some=_ramp(cpu_u, 0.8, 0.4),
                memory_some=memory_some,
                memory_full=memory_some / 2.0,
            ),
        )

    def sample_all(
        self, t: float, pods_by_node: Mapping[str, Sequence[PodLoad]] | None = None
    ) -> list[LoadReport]:
        """One report per node at time t, in node order."""
        pods = pods_by_node or {}
        return [self.sample(name, t, pods.get(name, ())) for name in self._nodes]

    def report_times(
        self,
        node: str,
        start: float,
        end: float,
        *,
        interval_s: float = 15.0,
        jitter_s: float = 0.0,
        drop_probability: float = 0.0,
    ) -> list[float]:
        """When `node`'s agent reports in [start, end): a jittered schedule with lost reports.

        Jitter is uniform in [-jitter_s, +jitter_s] (keep it below half the
        interval to keep order); drops are independent. Reproducible per seed
        and node.
        """
        if interval_s <= 0.0 or not 0.0 <= drop_probability <= 1.0 or jitter_s < 0.0:
            raise ValueError("need interval_s > 0, jitter_s >= 0, drop_probability in [0, 1]")
        rng = _rng(self._seed, node, _TIMES_STREAM, 0)
        times: list[float] = []
        t = start
        while t < end:
            jitter = float(rng.uniform(-jitter_s, jitter_s)) if jitter_s > 0.0 else 0.0
            dropped = float(rng.random()) < drop_probability
            if not dropped:
                times.append(t + jitter)
            t += interval_s
        return times


def make_fleet(
    count: int,
    *,
    seed: int,
    prefix: str = "node-",
    cpu_capacity_milli: int = 4000,
    mem_capacity_bytes: int = 16 * GIB,
    base_cpu: tuple[float, float] = (0.05, 0.5),
    base_memory: tuple[float, float] = (0.1, 0.5),
) -> list[SyntheticNode]:
    """`count` nodes named prefix000.. with base loads drawn uniformly from the given ranges."""
    rng = _rng(seed, prefix, _FLEET_STREAM, count)
    width = max(3, len(str(count - 1)))
    return [
        SyntheticNode(
            name=f"{prefix}{i:0{width}d}",
            cpu_capacity_milli=cpu_capacity_milli,
            mem_capacity_bytes=mem_capacity_bytes,
            base_cpu=float(rng.uniform(*base_cpu)),
            base_memory=float(rng.uniform(*base_memory)),
        )
        for i in range(count)
    ]
