"""Columnar cluster snapshot, updated incrementally.

Theory of operation: every node owns one row in a set of numpy arrays (allocatable and
requested amounts per resource column, pod counts, the unschedulable flag, one int32 column
per label key holding a per-key value id, a boolean node-by-taint matrix, the node's
declared features as one bitset per row). Filters and scores
work on whole columns at once, so the per-pod cost does not grow with Python work per node.

Rows are dense: removing a node moves the last row into the hole, so row order is the
insertion order perturbed by removals (row order only matters for tie-breaking, which is
seeded). Arrays have spare capacity and double when full, so adding nodes is amortised O(1).
Pods are added to and removed from rows (``add_pod``/``remove_pod``); their requests are
kept exactly as accounted at insertion so removal subtracts the same integers. A pod whose
node is unknown (not yet added, or removed) is parked and re-attached when the node appears,
like kube-scheduler's cache keeps pods of absent nodes.

The snapshot also owns the :class:`~scheduler.graph.AffinityGraph` and feeds it every node,
pod and namespace change it receives, so the inter-pod plugins read counts that are kept
incrementally instead of looping over pods (:attr:`Snapshot.affinity_graph`).

The snapshot is not thread-safe; the controller owns it and the core reads it. Nothing here
does I/O.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from types import MappingProxyType
from typing import Any, Final, TypeVar, cast

import numpy as np
import numpy.typing as npt

from scheduler.graph.affinity import AffinityGraph
from scheduler.model.names import CPU, EPHEMERAL_STORAGE, MEMORY, PODS
from scheduler.model.node import Namespace, Node, Taint, TaintEffect
from scheduler.model.pod import HostPort, Pod
from scheduler.model.quantity import parse_int64
from scheduler.model.selectors import (
    NODE_NAME_FIELD,
    FieldRequirement,
    NodeSelector,
    NodeSelectorTerm,
    Operator,
    Requirement,
)

BoolArray = npt.NDArray[np.bool_]
IntArray = npt.NDArray[np.int64]
IndexArray = npt.NDArray[np.intp]

BASE_RESOURCES: Final = (CPU, MEMORY, EPHEMERAL_STORAGE)
_INITIAL_CAPACITY: Final = 16
_ABSENT: Final = -1


class LabelColumn:
    """Values of one label key across node rows, dictionary-encoded (-1 = label absent)."""

    __slots__ = ("_int_cache", "ids", "values", "vocab")

    def __init__(self, capacity: int) -> None:
        self.ids: npt.NDArray[np.int32] = np.full(capacity, _ABSENT, dtype=np.int32)
        self.vocab: dict[str, int] = {}
        self.values: list[str] = []
        self._int_cache: tuple[int, IntArray, BoolArray] | None = None

    def encode(self, value: str) -> int:
        vid = self.vocab.get(value)
        if vid is None:
            vid = len(self.values)
            self.vocab[value] = vid
            self.values.append(value)
        return vid

    def int_lookup(self) -> tuple[IntArray, BoolArray]:
        """Integer value and parse flag per value id; index -1 hits a trailing sentinel."""
        if self._int_cache is None or self._int_cache[0] != len(self.values):
            ints = np.zeros(len(self.values) + 1, dtype=np.int64)
            ok = np.zeros(len(self.values) + 1, dtype=np.bool_)
            for vid, text in enumerate(self.values):
                parsed = parse_int64(text)
                if parsed is not None:
                    ints[vid], ok[vid] = parsed, True
            self._int_cache = (len(self.values), ints, ok)
        return self._int_cache[1], self._int_cache[2]

    def grow(self, capacity: int) -> None:
        grown = np.full(capacity, _ABSENT, dtype=np.int32)
        grown[: len(self.ids)] = self.ids
        self.ids = grown


class Snapshot:
    """Nodes, the pods placed on them and namespace labels, in columnar form."""

    def __init__(
        self,
        nodes: Iterable[Node] = (),
        pods: Iterable[tuple[Pod, str]] = (),
        namespaces: Iterable[Namespace] = (),
    ) -> None:
        self._n = 0
        self._cap = _INITIAL_CAPACITY
        self._names: list[str] = []
        self._names_tuple: tuple[str, ...] | None = None
        self._nodes: list[Node] = []
        self._index: dict[str, int] = {}
        self._resources: list[str] = list(BASE_RESOURCES)
        self._res_index: dict[str, int] = {r: i for i, r in enumerate(self._resources)}
        # Resource-major (resources, capacity): one resource across nodes is contiguous.
        self._alloc = np.zeros((len(self._resources), self._cap), dtype=np.int64)
        self._requested = np.zeros((len(self._resources), self._cap), dtype=np.int64)
        self._non_zero = np.zeros((2, self._cap), dtype=np.int64)
        self._allowed_pods = np.zeros(self._cap, dtype=np.int64)
        self._pod_count = np.zeros(self._cap, dtype=np.int64)
        self._unschedulable = np.zeros(self._cap, dtype=np.bool_)
        self._declared_features = np.zeros(self._cap, dtype=np.int64)
        self._labels: dict[str, LabelColumn] = {}
        self._taint_ids: dict[Taint, int] = {}
        self._taints: list[Taint] = []
        self._taint_matrix = np.zeros((self._cap, 4), dtype=np.bool_)
        self._hard_taints = np.zeros(self._cap, dtype=np.int32)
        self._soft_taints = np.zeros(self._cap, dtype=np.int32)
        self._pods: list[dict[str, Pod]] = []
        self._ports: list[Counter[HostPort]] = []
        self._pod_node: dict[str, str] = {}
        self._orphans: dict[str, dict[str, Pod]] = {}
        self._priorities: Counter[int] = Counter()
        """Pods known (placed or parked) per priority: preemption's "anything lower?"."""
        self._with_affinity: dict[str, Pod] = {}
        self._with_required_anti: dict[str, Pod] = {}
        self._namespaces: dict[str, Mapping[str, str]] = {}
        self._affinity = AffinityGraph()
        self.generation = 0
        """Bumped on every change; lets callers cache derived data per snapshot state."""
        for node in nodes:
            self.add_node(node)
        for pod, node_name in pods:
            self.add_pod(pod, node_name)
        for ns in namespaces:
            self.set_namespace(ns)

    # ----------------------------------------------------------------- read API
    @property
    def num_nodes(self) -> int:
        return self._n

    @property
    def node_names(self) -> tuple[str, ...]:
        """Node names by row (cached until nodes are added or removed)."""
        if self._names_tuple is None:
            self._names_tuple = tuple(self._names)
        return self._names_tuple

    @property
    def resource_names(self) -> tuple[str, ...]:
        return tuple(self._resources)

    def resource_column(self, name: str) -> int | None:
        return self._res_index.get(name)

    @property
    def allocatable(self) -> IntArray:
        """(resources, nodes) allocatable; row r is resource ``resource_names[r]``."""
        return self._alloc[:, : self._n]

    @property
    def requested(self) -> IntArray:
        """(resources, nodes) sum of placed pods' requests."""
        return self._requested[:, : self._n]

    @property
    def non_zero_requested(self) -> IntArray:
        """(2, nodes) cpu and memory with 100m/200Mi defaults per container (for scoring)."""
        return self._non_zero[:, : self._n]

    @property
    def allowed_pods(self) -> IntArray:
        return self._allowed_pods[: self._n]

    @property
    def pod_counts(self) -> IntArray:
        return self._pod_count[: self._n]

    @property
    def unschedulable(self) -> BoolArray:
        return self._unschedulable[: self._n]

    @property
    def declared_feature_bits(self) -> IntArray:
        """Per node, its declared features that a pod can need, as the bits of
        :data:`scheduler.model.declared_features.FEATURE_BITS` (written once per node change)."""
        return self._declared_features[: self._n]

    @property
    def taints(self) -> tuple[Taint, ...]:
        """Distinct taints; column j of :attr:`taint_matrix` is ``taints[j]``."""
        return tuple(self._taints)

    @property
    def taint_matrix(self) -> BoolArray:
        return self._taint_matrix[: self._n, : len(self._taints)]

    @property
    def hard_taint_counts(self) -> npt.NDArray[np.int32]:
        """NoSchedule + NoExecute taints per node."""
        return self._hard_taints[: self._n]

    @property
    def soft_taint_counts(self) -> npt.NDArray[np.int32]:
        """PreferNoSchedule taints per node."""
        return self._soft_taints[: self._n]

    def index_of(self, node_name: str) -> int | None:
        return self._index.get(node_name)

    def node(self, index: int) -> Node:
        return self._nodes[index]

    def get_node(self, name: str) -> Node | None:
        i = self._index.get(name)
        return None if i is None else self._nodes[i]

    def nodes(self) -> Iterator[Node]:
        return iter(list(self._nodes))

    def pods_on(self, index: int) -> Iterable[Pod]:
        return self._pods[index].values()

    def used_ports(self, index: int) -> Counter[HostPort]:
        return self._ports[index]

    def nodes_with_used_ports(self) -> list[int]:
        return [i for i, c in enumerate(self._ports) if c]

    def node_of_pod(self, pod_key: str) -> str | None:
        return self._pod_node.get(pod_key)

    def has_priority_below(self, priority: int) -> bool:
        """Whether some pod (placed, assumed or parked on a missing node) has a priority
        lower than ``priority``: without one, preemption has nothing to evict."""
        return any(p < priority for p in self._priorities)

    def pods_with_affinity(self) -> list[tuple[Pod, int]]:
        """Placed pods with pod affinity or anti-affinity, with their node row."""
        return self._located(self._with_affinity)

    def pods_with_required_anti_affinity(self) -> list[tuple[Pod, int]]:
        return self._located(self._with_required_anti)

    @property
    def has_pods_with_affinity(self) -> bool:
        return bool(self._with_affinity)

    @property
    def has_pods_with_required_anti_affinity(self) -> bool:
        return bool(self._with_required_anti)

    def namespace_labels(self, namespace: str) -> Mapping[str, str] | None:
        """Labels of a known namespace, None when the namespace is unknown."""
        return self._namespaces.get(namespace)

    def namespaces(self) -> Mapping[str, Mapping[str, str]]:
        return MappingProxyType(self._namespaces)

    @property
    def affinity_graph(self) -> AffinityGraph:
        """Pods, nodes, domains and affinity terms, patched with every change made here."""
        return self._affinity

    def label_column(self, key: str) -> LabelColumn | None:
        return self._labels.get(key)

    def label_keys(self) -> tuple[str, ...]:
        return tuple(self._labels)

    # ----------------------------------------------------------- vector queries
    def requirement_mask(self, req: Requirement) -> BoolArray:
        """Nodes whose labels satisfy one label requirement."""
        n = self._n
        col = self._labels.get(req.key)
        op = req.operator
        if col is None:
            absent_true = op in (Operator.NOT_IN, Operator.DOES_NOT_EXIST)
            return np.full(n, absent_true, dtype=np.bool_)
        ids = col.ids[:n]
        if op is Operator.EXISTS:
            return ids >= 0
        if op is Operator.DOES_NOT_EXIST:
            return ids < 0
        if op in (Operator.IN, Operator.NOT_IN):
            vids = [col.vocab[v] for v in req.values if v in col.vocab]
            if not vids:
                hit = np.zeros(n, dtype=np.bool_)
            elif len(vids) == 1:
                hit = ids == vids[0]
            else:
                hit = np.isin(ids, vids)
            return hit if op is Operator.IN else ~hit
        ints, ok = col.int_lookup()
        values = ints[ids]
        cmp = values > req.int_value if op is Operator.GT else values < req.int_value
        return ok[ids] & cmp

    def field_mask(self, req: FieldRequirement) -> BoolArray:
        n = self._n
        if req.key == NODE_NAME_FIELD:
            hit = np.zeros(n, dtype=np.bool_)
            i = self._index.get(req.value)
            if i is not None:
                hit[i] = True
        else:
            hit = np.full(n, req.value == "", dtype=np.bool_)
        return hit if req.operator is Operator.IN else ~hit

    def term_mask(self, term: NodeSelectorTerm) -> BoolArray:
        mask = np.ones(self._n, dtype=np.bool_)
        for req in term.match_expressions:
            mask &= self.requirement_mask(req)
        for f in term.match_fields:
            mask &= self.field_mask(f)
        return mask

    def node_selector_mask(self, selector: NodeSelector) -> BoolArray:
        mask = np.zeros(self._n, dtype=np.bool_)
        for term in selector.terms:
            mask |= self.term_mask(term)
        return mask

    def label_map_mask(self, required: Mapping[str, str]) -> BoolArray:
        """Nodes carrying every ``key: value`` of a plain map (``spec.nodeSelector``)."""
        mask = np.ones(self._n, dtype=np.bool_)
        for key, value in required.items():
            mask &= self.requirement_mask(Requirement(key, Operator.IN, (value,)))
        return mask

    def has_label_mask(self, key: str) -> BoolArray:
        col = self._labels.get(key)
        if col is None:
            return np.zeros(self._n, dtype=np.bool_)
        return col.ids[: self._n] >= 0

    def per_label_value(self, key: str, values: Mapping[str, int]) -> IntArray:
        """Per node row, ``values[node's value of key]`` (0 if absent): domain counts to rows."""
        col = self._labels.get(key)
        if col is None or not values:
            return np.zeros(self._n, dtype=np.int64)
        # Entry ``size`` takes the values no node carries (reset below); the last entry
        # serves id -1 (rows without the label) and stays 0. One fancy assignment instead
        # of a numpy item write per value: domains can be as many as nodes (hostname).
        size = len(col.values)
        lookup = np.zeros(size + 2, dtype=np.int64)
        vocab = col.vocab
        try:  # the usual case, every value a node's: map() over the dict's own lookup
            vids: Any = np.fromiter(map(vocab.__getitem__, values), np.intp, len(values))
        except KeyError:
            vids = [vocab.get(value, size) for value in values]
        lookup[vids] = np.fromiter(values.values(), np.int64, len(values))
        lookup[size] = 0
        out: IntArray = lookup[col.ids[: self._n]]
        return out

    def per_node_name(self, values: Mapping[str, int]) -> IntArray:
        """Per node row, ``values[node name]`` (0 if absent)."""
        n = self._n
        if not values:
            return np.zeros(n, dtype=np.int64)
        out = np.zeros(n + 1, dtype=np.int64)  # entry n takes the names of no node
        index = self._index
        try:
            rows: Any = np.fromiter(map(index.__getitem__, values), np.intp, len(values))
        except KeyError:
            rows = [index.get(name, n) for name in values]
        out[rows] = np.fromiter(values.values(), np.int64, len(values))
        return out[:n]

    # ------------------------------------------------------------- node updates
    def add_node(self, node: Node) -> None:
        """Add a node; an existing name is updated in place (pods stay)."""
        if node.name in self._index:
            self.update_node(node)
            return
        if self._n == self._cap:
            self._grow(self._cap * 2)
        i = self._n
        self._n += 1
        self._names.append(node.name)
        self._names_tuple = None
        self._nodes.append(node)
        self._index[node.name] = i
        self._pods.append({})
        self._ports.append(Counter())
        self._requested[:, i] = 0
        self._non_zero[:, i] = 0
        self._pod_count[i] = 0
        self._write_node_row(i, node)
        self.generation += 1
        for pod in self._orphans.pop(node.name, {}).values():
            self._place(pod, i)
        self._affinity.on_node_upserted(node)

    def update_node(self, node: Node) -> None:
        i = self._index.get(node.name)
        if i is None:
            self.add_node(node)
            return
        self._nodes[i] = node
        self._write_node_row(i, node)
        self.generation += 1
        self._affinity.on_node_upserted(node)

    def remove_node(self, name: str) -> None:
        """Remove a node; its pods are parked until a node of that name returns."""
        i = self._index.pop(name, None)
        if i is None:
            return
        parked = self._pods[i]
        for key in parked:
            self._forget_pod_indexes(key)
        if parked:
            self._orphans[name] = dict(parked)
        last = self._n - 1
        if i != last:
            self._move_row(last, i)
        self._names.pop()
        self._names_tuple = None
        self._nodes.pop()
        self._pods.pop()
        self._ports.pop()
        self._n -= 1
        self.generation += 1
        self._affinity.on_node_removed(name)

    # -------------------------------------------------------------- pod updates
    def add_pod(self, pod: Pod, node_name: str) -> None:
        """Place (or assume) a pod on a node; a pod already known by key is moved."""
        self._detach_pod(pod.key)
        i = self._index.get(node_name)
        self._pod_node[pod.key] = node_name
        self._priorities[pod.priority] += 1
        if i is None:
            self._orphans.setdefault(node_name, {})[pod.key] = pod
        else:
            self._place(pod, i)
        self.generation += 1
        # One upsert, so a relabelled or moved pod patches its edges instead of being rebuilt.
        if node_name:
            self._affinity.on_pod_placed(pod, node_name)
        else:  # parked under no node, it never counts: to the graph it is pending
            self._affinity.on_pod_pending(pod)

    def remove_pod(self, pod: Pod | str) -> None:
        """Remove a pod by record or key; unknown pods are ignored."""
        key = pod if isinstance(pod, str) else pod.key
        self._affinity.on_pod_removed(key)
        if self._detach_pod(key):
            self.generation += 1

    def set_namespace(self, namespace: Namespace) -> None:
        self._namespaces[namespace.name] = namespace.labels
        self.generation += 1
        self._affinity.on_namespace(namespace)

    def remove_namespace(self, name: str) -> None:
        self._namespaces.pop(name, None)
        self.generation += 1
        self._affinity.on_namespace_removed(name)

    # ---------------------------------------------------------------- internals
    def _detach_pod(self, key: str) -> bool:
        """Take a pod off its row (or out of the parked pods); False if it was unknown."""
        node_name = self._pod_node.pop(key, None)
        if node_name is None:
            return False
        i = self._index.get(node_name)
        gone: Pod | None
        if i is None:
            parked = self._orphans.get(node_name, {})
            gone = parked.pop(key, None)
            if not parked:
                self._orphans.pop(node_name, None)
        else:
            gone = self._pods[i].pop(key)
            self._account(gone, i, -1)
            self._forget_pod_indexes(key)
        if gone is not None:
            self._priorities[gone.priority] -= 1
            if self._priorities[gone.priority] <= 0:
                del self._priorities[gone.priority]
        return True

    def _located(self, pods: Mapping[str, Pod]) -> list[tuple[Pod, int]]:
        out = []
        for key, pod in pods.items():
            i = self._index[self._pod_node[key]]
            out.append((pod, i))
        return out

    def _place(self, pod: Pod, i: int) -> None:
        self._pods[i][pod.key] = pod
        self._account(pod, i, +1)
        if pod.has_pod_affinity:
            self._with_affinity[pod.key] = pod
        if pod.has_required_anti_affinity:
            self._with_required_anti[pod.key] = pod

    def _forget_pod_indexes(self, key: str) -> None:
        self._with_affinity.pop(key, None)
        self._with_required_anti.pop(key, None)

    def _account(self, pod: Pod, i: int, sign: int) -> None:
        for name, amount in pod.resources.accounted.items():
            col = self._res_index.get(name)
            if col is None:
                col = self._add_resource_column(name)
            self._requested[col, i] += sign * amount
        self._non_zero[0, i] += sign * pod.resources.non_zero_cpu
        self._non_zero[1, i] += sign * pod.resources.non_zero_memory
        self._pod_count[i] += sign
        ports = self._ports[i]
        for port in pod.host_ports:
            ports[port] += sign
            if ports[port] <= 0:
                del ports[port]

    def _add_resource_column(self, name: str) -> int:
        col = len(self._resources)
        self._resources.append(name)
        self._res_index[name] = col
        pad = np.zeros((1, self._cap), dtype=np.int64)
        self._alloc = np.vstack([self._alloc, pad])
        self._requested = np.vstack([self._requested, pad])
        return col

    def _write_node_row(self, i: int, node: Node) -> None:
        self._alloc[:, i] = 0
        for name, amount in node.allocatable.items():
            if name == PODS:
                continue
            col = self._res_index.get(name)
            if col is None:
                col = self._add_resource_column(name)
            self._alloc[col, i] = amount
        self._allowed_pods[i] = node.allocatable.get(PODS, 0)
        self._unschedulable[i] = node.unschedulable
        self._declared_features[i] = node.declared_feature_bits
        for label_column in self._labels.values():
            label_column.ids[i] = _ABSENT
        for key, value in node.labels.items():
            column = self._labels.get(key)
            if column is None:
                column = self._labels[key] = LabelColumn(self._cap)
            column.ids[i] = column.encode(value)
        self._taint_matrix[i] = False
        hard = soft = 0
        for taint in node.taints:
            tid = self._taint_ids.get(taint)
            if tid is None:
                tid = self._add_taint(taint)
            self._taint_matrix[i, tid] = True
            if taint.blocks_scheduling:
                hard += 1
            elif taint.effect == TaintEffect.PREFER_NO_SCHEDULE:
                soft += 1
        self._hard_taints[i] = hard
        self._soft_taints[i] = soft

    def _add_taint(self, taint: Taint) -> int:
        tid = len(self._taints)
        self._taints.append(taint)
        self._taint_ids[taint] = tid
        if tid >= self._taint_matrix.shape[1]:
            grown = np.zeros((self._cap, self._taint_matrix.shape[1] * 2), dtype=np.bool_)
            grown[:, : self._taint_matrix.shape[1]] = self._taint_matrix
            self._taint_matrix = grown
        return tid

    def _move_row(self, src: int, dst: int) -> None:
        for resource_major in (self._alloc, self._requested, self._non_zero):
            resource_major[:, dst] = resource_major[:, src]
        for arr in (
            self._allowed_pods,
            self._pod_count,
            self._unschedulable,
            self._declared_features,
            self._taint_matrix,
            self._hard_taints,
            self._soft_taints,
        ):
            arr[dst] = arr[src]
        for col in self._labels.values():
            col.ids[dst] = col.ids[src]
            col.ids[src] = _ABSENT
        name = self._names[src]
        self._names[dst] = name
        self._nodes[dst] = self._nodes[src]
        self._pods[dst] = self._pods[src]
        self._ports[dst] = self._ports[src]
        self._index[name] = dst

    def _grow(self, capacity: int) -> None:
        self._alloc = _grown_columns(self._alloc, capacity)
        self._requested = _grown_columns(self._requested, capacity)
        self._non_zero = _grown_columns(self._non_zero, capacity)
        self._allowed_pods = _grown(self._allowed_pods, capacity)
        self._pod_count = _grown(self._pod_count, capacity)
        self._unschedulable = _grown(self._unschedulable, capacity)
        self._declared_features = _grown(self._declared_features, capacity)
        self._taint_matrix = _grown(self._taint_matrix, capacity)
        self._hard_taints = _grown(self._hard_taints, capacity)
        self._soft_taints = _grown(self._soft_taints, capacity)
        for col in self._labels.values():
            col.grow(capacity)
        self._cap = capacity


_Array = TypeVar("_Array", bound="np.ndarray[Any, Any]")


def _grown(arr: _Array, capacity: int) -> _Array:
    """A copy of ``arr`` with ``capacity`` rows, the new rows zeroed."""
    out = np.zeros((capacity, *arr.shape[1:]), dtype=arr.dtype)
    out[: arr.shape[0]] = arr
    return cast(_Array, out)


def _grown_columns(arr: IntArray, capacity: int) -> IntArray:
    """A resource-major array widened to ``capacity`` node columns."""
    out = np.zeros((arr.shape[0], capacity), dtype=arr.dtype)
    out[:, : arr.shape[1]] = arr
    return out
