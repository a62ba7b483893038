"""Traces: the nodes of a cluster, the pods already on them, and the tasks that arrive.

A :class:`Trace` is made of the core's own records (``Node.from_api`` / ``Pod.from_api`` of
the camelCase bodies the API server would return), so whatever replays it, `lattice
simulate` or a live benchmark that creates the same objects through an API server, sees
exactly the pods and nodes the scheduler would.

Two sources:

* :func:`load_alibaba`: Alibaba's GPU trace v2023 (``cluster-trace-gpu-v2023/csv``, the
  data of FGD, Weng et al., USENIX ATC'23). Node rows ``sn,cpu_milli,memory_mib,gpu,model``
  become nodes labelled ``lattice.dev/gpu-model: <model>`` with ``nvidia.com/gpu``
  allocatable; task rows ``name,cpu_milli,memory_mib,num_gpu,gpu_milli`` (optionally
  ``gpu_spec``, ``creation_time``, ``deletion_time`` and columns ignored here) become pods of
  schedulerName ``lattice`` asking whole GPUs. Rows that share a GPU (``num_gpu > 0`` and
  ``gpu_milli < 1000``) are out of scope (whole GPUs only) and counted in
  :attr:`Trace.skipped`; a ``gpu_spec`` of ``a|b`` becomes the required node affinity
  ``lattice.dev/gpu-model In [a, b]``.
* :func:`load_dump`: ``kubectl get nodes,pods -o json``. Pods with ``spec.nodeName`` are
  the existing load (:attr:`Trace.placed`), pods without it arrive in creation order
  (``metadata.creationTimestamp``, then namespace/name); terminating and finished pods
  (Succeeded, Failed) hold nothing and are left out.

Bad input raises :class:`TraceError`, one line naming the file, the line (CSV) or item
(JSON) and the column or field.
"""

from __future__ import annotations

import copy
import csv
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Final

import orjson

from scheduler.core.profile import GPU_RESOURCES
from scheduler.model.errors import InvalidObjectError
from scheduler.model.names import label_value_error
from scheduler.model.node import Node
from scheduler.model.pod import Pod

GPU_MODEL_LABEL: Final = "lattice.dev/gpu-model"
"""Node label naming the GPU model (the trace's ``model``; ``gpu_spec`` selects on it)."""
GPU_RESOURCE: Final = "nvidia.com/gpu"
SCHEDULER_NAME: Final = "lattice"
NAMESPACE: Final = "default"
NODE_PODS: Final = "1000"
"""Pods per node: more than any trace node holds, so the pod count never limits."""
WHOLE_GPU_MILLI: Final = 1000

NODE_COLUMNS: Final = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
TASK_COLUMNS: Final = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
"""Required; ``gpu_spec``, ``creation_time`` and ``deletion_time`` are read when present."""
_FINISHED: Final = frozenset({"Succeeded", "Failed"})


class TraceError(ValueError):
    """A trace file that cannot be read as a trace; the message is one line."""


@dataclass(frozen=True, slots=True)
class Task:
    """One arriving pod and, when the trace knows them, its times (seconds, trace clock)."""

    pod: Pod
    created: float | None = None
    deleted: float | None = None
    """When the pod goes away (replays with deletions free its resources then)."""
    body: Mapping[str, Any] | None = field(default=None, compare=False)
    """The Pod body it was read from, for a live replay that creates it through an API
    server (None where the source had none)."""

    @property
    def gpus(self) -> int:
        """Whole GPUs the pod asks (the sum of its GPU resources' requests)."""
        requests = self.pod.resources.requests
        return sum(requests.get(r, 0) for r in GPU_RESOURCES)


@dataclass(frozen=True, slots=True)
class Trace:
    """A cluster and its workload, in the core's records."""

    nodes: list[Node]
    placed: list[tuple[Pod, str]]
    """Pods already on a node (pod, node name): load present before the first arrival."""
    tasks: list[Task]
    """Arrivals, in order."""
    skipped: int
    """Tasks of the source left out as out of scope (GPU sharing)."""
    name: str = ""
    """What the trace is called in reports and plot titles (the file's stem)."""
    node_bodies: list[dict[str, Any]] = field(default_factory=list, compare=False)
    """The Node bodies :attr:`nodes` were read from (a live replay creates them)."""

    @property
    def gpus(self) -> int:
        """Allocatable GPUs of all nodes."""
        return sum(n.allocatable.get(r, 0) for n in self.nodes for r in GPU_RESOURCES)


# ----------------------------------------------------------------------- Alibaba CSV
def node_body(sn: str, *, cpu_milli: int, memory_mib: int, gpus: int, model: str) -> dict[str, Any]:
    """The Node the API server would return for one row of the node list."""
    labels = {"kubernetes.io/hostname": sn}
    if model:
        labels[GPU_MODEL_LABEL] = model
    resources = {"cpu": f"{cpu_milli}m", "memory": f"{memory_mib}Mi", "pods": NODE_PODS}
    if gpus > 0:
        resources[GPU_RESOURCE] = str(gpus)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": sn, "uid": f"node-{sn}", "labels": labels},
        "spec": {},
        "status": {"capacity": dict(resources), "allocatable": dict(resources)},
    }


def pod_body(
    name: str,
    *,
    uid: str,
    cpu_milli: int,
    memory_mib: int,
    gpus: int,
    gpu_models: Sequence[str] = (),
) -> dict[str, Any]:
    """The pending Pod the API server would return for one task row."""
    requests: dict[str, str] = {"cpu": f"{cpu_milli}m", "memory": f"{memory_mib}Mi"}
    resources: dict[str, Any] = {"requests": requests}
    if gpus > 0:
        # Extended resources are set as limits (requests must equal them).
        requests[GPU_RESOURCE] = str(gpus)
        resources["limits"] = {GPU_RESOURCE: str(gpus)}
    spec: dict[str, Any] = {
        "schedulerName": SCHEDULER_NAME,
        "containers": [{"name": "task", "resources": resources}],
    }
    if gpu_models:
        term = {"key": GPU_MODEL_LABEL, "operator": "In", "values": list(gpu_models)}
        spec["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [term]}]
                }
            }
        }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "uid": uid},
        "spec": spec,
        "status": {"phase": "Pending"},
    }


class _Rows:
    """A CSV file's rows as dicts, with the line each came from and one-line errors."""

    def __init__(self, path: Path, text: str, required: Sequence[str]) -> None:
        self.path = path
        self._reader = csv.DictReader(text.splitlines(keepends=True))
        header = self._reader.fieldnames
        if header is None:
            raise TraceError(f"{path}: empty file, expected a header {','.join(required)}")
        self._reader.fieldnames = [h.strip() for h in header]
        self.columns = frozenset(self._reader.fieldnames)
        missing = [c for c in required if c not in self.columns]
        if missing:
            raise TraceError(
                f"{path}:1: missing column(s) {', '.join(missing)} "
                f"(header: {','.join(self._reader.fieldnames)})"
            )
        self.line = 1

    def __iter__(self) -> Iterator[dict[str, str | None]]:
        for row in self._reader:
            self.line = self._reader.line_num
            yield row

    def error(self, column: str, message: str) -> TraceError:
        return TraceError(f"{self.path}:{self.line}: column {column!r}: {message}")

    def text(self, row: Mapping[str, str | None], column: str) -> str:
        value = row.get(column)
        if value is None:
            raise self.error(column, "missing value (short row)")
        return value.strip()

    def integer(self, row: Mapping[str, str | None], column: str) -> int:
        value = self.text(row, column)
        try:
            number = int(value)
        except ValueError:
            raise self.error(column, f"not an integer: {value!r}") from None
        if number < 0:
            raise self.error(column, f"must not be negative: {value!r}")
        return number

    def label_value(self, row: Mapping[str, str | None], column: str) -> str:
        """A GPU model: it labels nodes and pods select on it, so it must be a label value."""
        return self._checked_label(column, self.text(row, column))

    def label_values(self, row: Mapping[str, str | None], column: str) -> tuple[str, ...]:
        """``a|b``: GPU models, each a label value; empty: none."""
        values = (v.strip() for v in self.text(row, column).split("|"))
        return tuple(self._checked_label(column, v) for v in values if v)

    def _checked_label(self, column: str, value: str) -> str:
        problem = label_value_error(value)
        if problem is not None:
            raise self.error(column, f"{value!r} is not a label value: {problem}")
        return value

    def seconds(self, row: Mapping[str, str | None], column: str) -> float | None:
        """A time, or None when the column is absent or the cell empty."""
        if column not in self.columns:
            return None
        value = self.text(row, column)
        if not value:
            return None
        try:
            number = float(value)
        except ValueError:
            raise self.error(column, f"not a number of seconds: {value!r}") from None
        if not math.isfinite(number):
            raise self.error(column, f"not a number of seconds: {value!r}")
        return number


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8-sig")
    except OSError as exc:
        raise TraceError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise TraceError(f"{path}: not UTF-8 text: {exc.reason}") from None


def load_alibaba(nodes_csv: Path, tasks_csv: Path) -> Trace:
    """Alibaba GPU trace v2023: a node list and a task list (see the module docstring)."""
    nodes: list[Node] = []
    bodies: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    rows = _Rows(nodes_csv, _read(nodes_csv), NODE_COLUMNS)
    for row in rows:
        sn = rows.text(row, "sn")
        if not sn:
            raise rows.error("sn", "empty node name")
        if sn in seen:
            raise rows.error("sn", f"node {sn!r} already on line {seen[sn]}")
        seen[sn] = rows.line
        body = node_body(
            sn,
            cpu_milli=rows.integer(row, "cpu_milli"),
            memory_mib=rows.integer(row, "memory_mib"),
            gpus=rows.integer(row, "gpu"),
            model=rows.label_value(row, "model"),
        )
        try:
            nodes.append(Node.from_api(body))
        except InvalidObjectError as exc:
            raise TraceError(f"{nodes_csv}:{rows.line}: {exc}") from None
        bodies.append(body)

    tasks: list[Task] = []
    skipped = 0
    rows = _Rows(tasks_csv, _read(tasks_csv), TASK_COLUMNS)
    has_spec = "gpu_spec" in rows.columns
    for row in rows:
        name = rows.text(row, "name")
        if not name:
            raise rows.error("name", "empty task name")
        cpu_milli = rows.integer(row, "cpu_milli")
        memory_mib = rows.integer(row, "memory_mib")
        gpus = rows.integer(row, "num_gpu")
        gpu_milli = rows.integer(row, "gpu_milli")
        models = rows.label_values(row, "gpu_spec") if has_spec else ()
        created = rows.seconds(row, "creation_time")
        deleted = rows.seconds(row, "deletion_time")
        if gpus > 0 and gpu_milli < WHOLE_GPU_MILLI:
            skipped += 1  # GPU sharing: out of scope
            continue
        body = pod_body(
            name,
            uid=f"{tasks_csv.stem}-{rows.line}",
            cpu_milli=cpu_milli,
            memory_mib=memory_mib,
            gpus=gpus,
            gpu_models=models if gpus > 0 else (),
        )
        try:
            pod = Pod.from_api(body)
        except InvalidObjectError as exc:
            raise TraceError(f"{tasks_csv}:{rows.line}: {exc}") from None
        tasks.append(Task(pod, created, deleted, body))
    return Trace(nodes, [], tasks, skipped, name=tasks_csv.stem, node_bodies=bodies)


# ----------------------------------------------------------------------- kubectl dump
def _timestamp(value: object) -> float | None:
    """RFC 3339 (``metadata.creationTimestamp``) to POSIX seconds; None if absent."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None


def load_dump(path: Path) -> Trace:
    """``kubectl get nodes,pods -o json`` (a ``List``; ``NodeList``/``PodList`` too)."""
    try:
        document = orjson.loads(path.read_bytes())
    except OSError as exc:
        raise TraceError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except orjson.JSONDecodeError as exc:
        raise TraceError(f"{path}:{exc.lineno}:{exc.colno}: not JSON: {exc.msg}") from None
    if not isinstance(document, dict) or not isinstance(document.get("items"), list):
        raise TraceError(f"{path}: expected a List with items (kubectl get nodes,pods -o json)")
    list_kind = str(document.get("kind", ""))
    implied = list_kind.removesuffix("List") if list_kind not in ("", "List") else ""
    nodes: list[Node] = []
    placed: list[tuple[Pod, str]] = []
    pending: list[tuple[float, str, Pod]] = []
    for i, item in enumerate(document["items"]):
        if not isinstance(item, dict):
            raise TraceError(f"{path}: items[{i}]: not an object")
        kind = item.get("kind") or implied
        metadata = item.get("metadata")
        name = metadata.get("name", "?") if isinstance(metadata, dict) else "?"
        where = f"{path}: items[{i}] ({kind} {name})"
        try:
            if kind == "Node":
                nodes.append(Node.from_api(item))
                continue
            if kind != "Pod":
                continue  # kubectl get may list other kinds; a trace has no use for them
            pod = Pod.from_api(item)
        except InvalidObjectError as exc:
            raise TraceError(f"{where}: {exc}") from None
        if pod.terminating or pod.phase in _FINISHED:
            continue
        if pod.node_name:
            placed.append((pod, pod.node_name))
            continue
        created = _timestamp(item["metadata"].get("creationTimestamp"))
        order = math.inf if created is None else created
        pending.append((order, f"{pod.namespace}/{pod.name}", pod))
    pending.sort(key=lambda entry: (entry[0], entry[1]))
    tasks = [Task(pod, None if math.isinf(t) else t, None) for t, _, pod in pending]
    return Trace(nodes, placed, tasks, 0, name=path.stem)


# ----------------------------------------------------------------------- synthetic mix
MULTI_GPU_SIZES: Final = (2, 4, 8)


def synthetic(
    base: Trace, *, multi_share: float, seed: int, demand: float = 110.0, prefix: str = "syn"
) -> Trace:
    """A task mix drawn from ``base`` so a placement rule is judged on more than one trace:
    its nodes, its share of CPU-only tasks, and each task's CPU and memory resampled from
    ``base``'s tasks of the same GPU count. ``multi_share`` is the share of the requested
    GPUs that multi-GPU tasks ask (FGD's "multi-GPU 40 %" traces): those ask 2, 4 or 8 GPUs
    in ``base``'s proportions among them (equal if it has none), the rest ask 1. Tasks are
    drawn until they ask ``demand`` % of the GPUs. Deterministic for a given seed."""
    import numpy as np

    if not 0.0 <= multi_share <= 1.0:
        raise ValueError(f"multi_share must be in [0, 1], got {multi_share}")
    by_size: dict[int, list[Task]] = {}
    for task in base.tasks:
        by_size.setdefault(task.gpus, []).append(task)
    singles = by_size.get(1, [])
    if not singles:
        raise ValueError("the base trace has no 1-GPU task to draw from")
    counts = np.array([len(by_size.get(g, [])) for g in MULTI_GPU_SIZES], dtype=float)
    weights = counts / counts.sum() if counts.sum() else np.full(len(MULTI_GPU_SIZES), 1 / 3)
    cpu_share = len(by_size.get(0, [])) / len(base.tasks)
    mean_multi = float(np.dot(weights, MULTI_GPU_SIZES))
    # P(multi) so that multi-GPU tasks ask multi_share of the GPUs in expectation.
    p_multi = multi_share / (multi_share + mean_multi * (1.0 - multi_share))
    rng = np.random.default_rng(seed)
    limit = base.gpus * demand / 100
    tasks: list[Task] = []
    asked = 0
    while asked < limit:
        if by_size.get(0) and rng.random() < cpu_share:
            gpus = 0
        elif rng.random() < p_multi:
            gpus = int(MULTI_GPU_SIZES[rng.choice(len(MULTI_GPU_SIZES), p=weights)])
        else:
            gpus = 1
        pool = by_size.get(gpus)
        if pool:
            like = pool[int(rng.integers(len(pool)))].pod.resources.requests
            cpu_milli, memory_mib = like.get("cpu", 0), like.get("memory", 0) >> 20
        else:  # a size the base never asked: its 1-GPU tasks' shape, scaled
            like = singles[int(rng.integers(len(singles)))].pod.resources.requests
            cpu_milli, memory_mib = gpus * like.get("cpu", 0), gpus * (like.get("memory", 0) >> 20)
        name = f"{prefix}-{seed}-{len(tasks):05d}"
        body = pod_body(
            name, uid=name, cpu_milli=cpu_milli, memory_mib=max(memory_mib, 1), gpus=gpus
        )
        tasks.append(Task(Pod.from_api(body), body=body))
        asked += gpus
    name = f"synthetic-{multi_share:g}-seed{seed}"
    return Trace(base.nodes, [], tasks, 0, name=name, node_bodies=base.node_bodies)


def with_churn(
    trace: Trace, durations: Sequence[float], *, load: float, seed: int, repeat: int = 1
) -> Trace:
    """``trace``'s tasks, in order, given times so the cluster sees churn: Poisson arrivals
    at the rate where the GPU time asked is ``load`` times what the cluster has (above 1,
    work waits), each task running a duration drawn from ``durations`` (e.g. the default
    task list's deletion - creation, clipped at its 95th percentile). With ``repeat`` > 1
    the task list is cycled that many times (names suffixed ``-rN``): arrivals span about
    ``repeat`` mean run times, so the cluster reaches a steady state rather than only
    filling up. Deterministic for a given seed."""
    import numpy as np

    if not load > 0 or trace.gpus <= 0:
        raise ValueError("churn needs positive durations, load > 0 and a cluster with GPUs")
    pool = run_pool(durations)
    if repeat < 1:
        raise ValueError("repeat must be >= 1")
    source = list(trace.tasks)
    for r in range(1, repeat):
        for t in trace.tasks:
            body = copy.deepcopy(dict(t.body)) if t.body is not None else None
            if body is None:
                raise ValueError("repeat needs the tasks' Pod bodies")
            body["metadata"]["name"] = f"{t.pod.name}-r{r}"
            body["metadata"]["uid"] = f"{body['metadata'].get('uid', t.pod.name)}-r{r}"
            source.append(Task(Pod.from_api(body), body=body))
    rng = np.random.default_rng(seed)
    runs = rng.choice(pool, size=len(source))
    gpu_seconds = sum(t.gpus * r for t, r in zip(source, runs, strict=True))
    # n tasks over a span T ask gpu_seconds; load = gpu_seconds / (gpus * T).
    span = gpu_seconds / (trace.gpus * load)
    gaps = rng.exponential(span / len(source), size=len(source))
    starts = np.cumsum(gaps)
    tasks = [
        Task(t.pod, float(start), float(start + run), t.body)
        for t, start, run in zip(source, starts, runs, strict=True)
    ]
    return Trace(
        trace.nodes,
        trace.placed,
        tasks,
        trace.skipped,
        name=f"{trace.name}-churn{load:g}",
        node_bodies=trace.node_bodies,
    )


def run_pool(durations: Sequence[float]) -> Any:
    """The positive run times churn draws from, clipped at their 95th percentile: the
    trace's run times are heavy-tailed (mean 50x the median), and a few week-long tasks
    would set the arrival rate and leave the cluster idle between them."""
    import numpy as np

    pool = np.array([d for d in durations if d > 0], dtype=float)
    if not len(pool):
        raise ValueError("churn needs positive durations, load > 0 and a cluster with GPUs")
    return np.minimum(pool, np.percentile(pool, 95))


def durations_of(trace: Trace) -> list[float]:
    """Run times (deletion - creation) of the tasks that have both."""
    return [
        t.deleted - t.created
        for t in trace.tasks
        if t.created is not None and t.deleted is not None and t.deleted > t.created
    ]
