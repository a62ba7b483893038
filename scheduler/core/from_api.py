"""Build a Snapshot from raw API lists, as a one-off (explain, tests).

The running scheduler never does this per pod: its cache feeds the snapshot
event by event. A one-off reader (``lattice explain``, the differential test)
needs the same view from plain lists, with the same rules: only pods bound to
a node and not finished count, and an unreadable object is reported, not
fatal.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from scheduler.core.profile import DEFAULT_KUBE_MINOR
from scheduler.core.snapshot import Snapshot
from scheduler.model.errors import InvalidObjectError
from scheduler.model.node import Namespace, Node
from scheduler.model.pod import TERMINAL_PHASES, Pod
from scheduler.model.topology import parse_time

Body = Mapping[str, Any]


@dataclass
class Built:
    snapshot: Snapshot
    skipped: list[str] = field(default_factory=list)
    """``kind/name: reason`` for each object that could not be read."""


def _name(body: Body) -> str:
    meta = body.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{ns}/{meta.get('name')}" if ns else str(meta.get("name"))


def counts_on_node(body: Body) -> bool:
    """A pod holds node capacity once bound and until it finishes."""
    return bool((body.get("spec") or {}).get("nodeName")) and (
        (body.get("status") or {}).get("phase") not in TERMINAL_PHASES
    )


def snapshot_from_api(
    nodes: Iterable[Body],
    pods: Iterable[Body],
    namespaces: Iterable[Body],
    *,
    exclude_pod: tuple[str, str] | None = None,
    kube_minor: int = DEFAULT_KUBE_MINOR,
) -> Built:
    """Nodes, bound pods (minus ``exclude_pod`` as namespace/name) and namespaces; a bound
    pod holds what the ``kube_minor`` release's kube-scheduler would count (in-place
    resize status)."""
    built = Built(Snapshot())
    for body in nodes:
        try:
            built.snapshot.add_node(Node.from_api(body))
        except InvalidObjectError as exc:
            built.skipped.append(f"node/{_name(body)}: {exc}")
    for body in namespaces:
        try:
            built.snapshot.set_namespace(Namespace.from_api(body))
        except InvalidObjectError as exc:
            built.skipped.append(f"namespace/{_name(body)}: {exc}")
    for body in pods:
        meta = body.get("metadata") or {}
        if exclude_pod == (meta.get("namespace"), meta.get("name")) or not counts_on_node(body):
            continue
        try:
            pod = Pod.from_api(body, kube_minor=kube_minor)
            built.snapshot.add_pod(pod, str(body["spec"]["nodeName"]))
        except InvalidObjectError as exc:
            built.skipped.append(f"pod/{_name(body)}: {exc}")
    return built


def as_pending(body: Body) -> dict[str, Any]:
    """The pod as it was before binding, to ask "where would it go now?"."""
    pending = {k: v for k, v in body.items() if k != "status"}
    spec = dict(pending.get("spec") or {})
    spec.pop("nodeName", None)
    pending["spec"] = spec
    return pending


def scheduled_at(body: Body) -> float | None:
    """Unix time of the pod's PodScheduled=True condition (when it was bound), if readable.

    The load predictor counts a pod bound shortly before as "in flight" (not yet in the
    agents' samples); this is how it learns about pods bound by another scheduler or
    before a restart.
    """
    conditions = (body.get("status") or {}).get("conditions") or []
    if not isinstance(conditions, list):
        return None
    for cond in conditions:
        if (
            isinstance(cond, Mapping)
            and cond.get("type") == "PodScheduled"
            and cond.get("status") == "True"
        ):
            stamp = cond.get("lastTransitionTime")
            if isinstance(stamp, str):
                try:
                    return parse_time(stamp).timestamp()
                except ValueError:
                    return None
    return None
