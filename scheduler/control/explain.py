"""`lattice explain`: run the core on the live cluster for one pod, without binding.

Reads nodes, pods and namespaces once, builds a snapshot the way the running
scheduler sees the cluster, and prints why each node was rejected or how it
scored. A pod that is already bound is explained as if it were pending again
(its own capacity taken out), which answers "why did it land there".
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import yaml
from kubernetes_asyncio import client

from scheduler.core.explain import Decision
from scheduler.core.from_api import as_pending, snapshot_from_api
from scheduler.core.schedule import schedule
from scheduler.core.topology.state import TopologyState
from scheduler.devcluster.kube import api_client
from scheduler.model.errors import InvalidObjectError
from scheduler.model.pod import Pod
from scheduler.model.topology import NodeTopology, TopologyParseError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kubeconfig", type=Path, required=True)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("pod", nargs="?", help="NAMESPACE/POD of a pod in the cluster")
    source.add_argument("-f", "--filename", type=Path, help="a pod manifest (YAML or JSON)")
    parser.add_argument("-o", "--output", choices=("table", "json"), default="table")
    parser.add_argument("--seed", type=int, default=0, help="tie-break seed (default 0)")


def run(args: argparse.Namespace) -> int:
    try:
        decision, skipped = asyncio.run(_explain(args))
    except (InvalidObjectError, ValueError, FileNotFoundError) as exc:
        print(f"lattice explain: {exc}", file=sys.stderr)
        return 2
    except client.ApiException as exc:
        print(f"lattice explain: API error {exc.status}: {exc.reason}", file=sys.stderr)
        return 2
    for line in skipped:
        print(f"warning: skipped unreadable {line}", file=sys.stderr)
    if args.output == "json":
        print(json.dumps(decision.to_json(), indent=2))
    else:
        print(render_table(decision))
    return 0


async def _list(call: Any) -> list[dict[str, Any]]:
    resp = await call(_preload_content=False)
    items: list[dict[str, Any]] = json.loads(await resp.read())["items"]
    return items


async def _explain(args: argparse.Namespace) -> tuple[Decision, list[str]]:
    async with api_client(args.kubeconfig) as api:
        core = client.CoreV1Api(api)
        if args.filename is not None:
            body: dict[str, Any] = yaml.safe_load(args.filename.read_text())
            if not isinstance(body, dict) or body.get("kind") != "Pod":
                raise ValueError(f"{args.filename} is not a Pod manifest")
            body.setdefault("metadata", {}).setdefault("namespace", "default")
        else:
            ns, sep, name = str(args.pod).partition("/")
            if not sep or not ns or not name:
                raise ValueError(f"expected NAMESPACE/POD, got {args.pod!r}")
            raw: Any = await core.read_namespaced_pod(name, ns, _preload_content=False)
            body = json.loads(await raw.read())
        nodes, pods, namespaces = await asyncio.gather(
            _list(core.list_node),
            _list(core.list_pod_for_all_namespaces),
            _list(core.list_namespace),
        )
        try:
            reports: dict[str, Any] = await client.CustomObjectsApi(api).list_cluster_custom_object(
                "lattice.dev", "v1alpha1", "nodetopologies"
            )
        except client.ApiException as exc:
            if exc.status != 404:
                raise
            reports = {"items": []}
    meta = body["metadata"]
    built = snapshot_from_api(
        nodes, pods, namespaces, exclude_pod=(meta.get("namespace"), meta.get("name"))
    )
    topology = TopologyState()
    for report in reports.get("items", []):
        try:
            topology.set_node_topology(
                report["metadata"]["name"], NodeTopology.from_spec(report.get("spec") or {})
            )
        except (TopologyParseError, ValueError) as exc:
            built.skipped.append(f"nodetopology/{report['metadata']['name']}: {exc}")
    for row in range(built.snapshot.num_nodes):
        for placed in built.snapshot.pods_on(row):
            topology.pod_placed(placed, built.snapshot.node_names[row])
    pod = Pod.from_api(as_pending(body))
    return schedule(built.snapshot, pod, seed=args.seed, topology=topology), built.skipped


def render_table(decision: Decision) -> str:
    """Nodes x plugins: feasible nodes first by total, the chosen one marked with '*'."""
    data = decision.to_json()
    nodes: dict[str, Any] = data["nodes"]
    plugins = list(data["weights"])
    feasible = sorted(
        (n for n, v in nodes.items() if v["filter"] is None),
        key=lambda n: (-(nodes[n]["total"] or 0), n),
    )
    rejected = sorted(n for n, v in nodes.items() if v["filter"] is not None)
    header = ["", "NODE", *(f"{p}(x{data['weights'][p]})" for p in plugins), "TOTAL", "FILTER"]
    rows = [header]
    for name in feasible + rejected:
        v = nodes[name]
        mark = "*" if name == decision.selected else ""
        scores = [str(v["weighted_scores"].get(p, "")) for p in plugins]
        total = "" if v["total"] is None else str(v["total"])
        verdict = "ok" if v["filter"] is None else f"{v['plugin']}: {v['filter']}"
        rows.append([mark, name, *scores, total, verdict])
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    pod = data["pod"]
    chosen = decision.selected or "none"
    return "\n".join([f"pod {pod}: selected {chosen}", *lines, "", data["summary"]])
