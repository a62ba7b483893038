"""`lattice graph`: the live cluster's affinity graph, or the part explaining a placement, as DOT.

Reads nodes, pods and namespaces once, feeds them to an :class:`AffinityGraph` as events
(so the export shows exactly what the scheduler's patches build), selects a neighbourhood
and prints DOT on stdout: ``lattice graph --kubeconfig K --pod NS/NAME | dot -Tsvg``.
Bound pods that have not finished are placed; pending pods appear with their terms only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client, config

from scheduler.graph.affinity import AffinityGraph
from scheduler.graph.dot import DEFAULT_FANOUT, View, namespace_view, pod_view, to_dot
from scheduler.model.errors import InvalidObjectError
from scheduler.model.node import Namespace, Node
from scheduler.model.pod import TERMINAL_PHASES, Pod

Body = Mapping[str, Any]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kubeconfig", type=Path, required=True)
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument("--namespace", help="a namespace's pods, their terms, nodes and domains")
    scope.add_argument("--pod", metavar="NS/NAME", help="the neighbourhood of one pod")
    parser.add_argument(
        "--depth", type=int, default=2, help="steps from --pod (default 2: terms and their pods)"
    )
    parser.add_argument(
        "--max-fanout",
        type=int,
        default=DEFAULT_FANOUT,
        help=f"neighbours shown per vertex, the rest counted (default {DEFAULT_FANOUT})",
    )


def run(args: argparse.Namespace) -> int:
    try:
        text, skipped = asyncio.run(_export(args))
    except (ValueError, LookupError) as exc:
        print(f"lattice graph: {exc}", file=sys.stderr)
        return 2
    except client.ApiException as exc:
        print(f"lattice graph: API error {exc.status}: {exc.reason}", file=sys.stderr)
        return 2
    for line in skipped:
        print(f"warning: skipped unreadable {line}", file=sys.stderr)
    sys.stdout.write(text)
    return 0


async def _list(call: Any) -> list[dict[str, Any]]:
    resp = await call(_preload_content=False)
    items: list[dict[str, Any]] = json.loads(await resp.read())["items"]
    return items


async def _export(args: argparse.Namespace) -> tuple[str, list[str]]:
    if args.depth < 0 or args.max_fanout < 1:
        raise ValueError("--depth must be >= 0 and --max-fanout >= 1")
    async with await config.new_client_from_config(config_file=str(args.kubeconfig)) as api:
        core = client.CoreV1Api(api)
        nodes, pods, namespaces = await asyncio.gather(
            _list(core.list_node),
            _list(core.list_pod_for_all_namespaces),
            _list(core.list_namespace),
        )
    graph, skipped = graph_from_api(nodes, pods, namespaces)
    return render(
        graph, namespace=args.namespace, pod=args.pod, depth=args.depth, max_fanout=args.max_fanout
    ), skipped


def graph_from_api(
    nodes: Iterable[Body], pods: Iterable[Body], namespaces: Iterable[Body]
) -> tuple[AffinityGraph, list[str]]:
    """The graph of raw API lists, built through events; unreadable objects are reported."""
    graph = AffinityGraph()
    skipped: list[str] = []
    for body in namespaces:
        try:
            graph.on_namespace(Namespace.from_api(body))
        except InvalidObjectError as exc:
            skipped.append(f"namespace/{_name(body)}: {exc}")
    for body in nodes:
        try:
            graph.on_node_upserted(Node.from_api(body))
        except InvalidObjectError as exc:
            skipped.append(f"node/{_name(body)}: {exc}")
    for body in pods:
        if (body.get("status") or {}).get("phase") in TERMINAL_PHASES:
            continue
        try:
            pod = Pod.from_api(body)
        except InvalidObjectError as exc:
            skipped.append(f"pod/{_name(body)}: {exc}")
            continue
        if pod.node_name:
            graph.on_pod_placed(pod, pod.node_name)
        else:
            graph.on_pod_pending(pod)
    return graph, skipped


def render(
    graph: AffinityGraph,
    *,
    namespace: str | None = None,
    pod: str | None = None,
    depth: int = 2,
    max_fanout: int = DEFAULT_FANOUT,
) -> str:
    """DOT for the whole graph, a namespace, or one pod's neighbourhood."""
    view: View | None = None
    if pod is not None:
        ns, sep, name = pod.partition("/")
        if not sep or not ns or not name:
            raise ValueError(f"expected NAMESPACE/POD, got {pod!r}")
        vertex = graph.find_pod(ns, name)
        if vertex is None:
            raise LookupError(f"pod {pod} not found (finished pods are not in the graph)")
        view = pod_view(graph, vertex, depth, max_fanout=max_fanout)
    elif namespace is not None:
        view = namespace_view(graph, namespace, max_fanout=max_fanout)
    if view is None:
        return to_dot(graph.graph)
    return to_dot(graph.graph, view.vertices, truncated=view.truncated)


def _name(body: Body) -> str:
    meta = body.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{ns}/{meta.get('name')}" if ns else str(meta.get("name"))
