"""``lattice agent``: the node agent's command line.

``--dry-run`` reads and prints the NodeTopology object (YAML or JSON) instead of publishing
it; with ``--once`` it does so a single time, which is how to see what the agent would report
on a machine (``lattice agent --once --dry-run``). Without ``--dry-run`` the agent connects
to the API server (in-cluster config, else kubeconfig) and publishes every ``--interval``
seconds until SIGTERM/SIGINT. The node name comes from ``--node-name`` or ``NODE_NAME`` (the
downward API's ``spec.nodeName``); a dry run falls back to the host name.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

import structlog
import yaml

from scheduler.agent.pci import ResourceNaming
from scheduler.agent.publisher import AgentSettings
from scheduler.agent.reader import DEFAULT_PROCFS, DEFAULT_SYSFS
from scheduler.agent.resource import node_topology_object
from scheduler.model.topology import GPU_RESOURCE, RDMA_RESOURCE

NODE_NAME_ENV = "NODE_NAME"

log = structlog.get_logger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--node-name",
        default=None,
        help=f"node to report for (default: ${NODE_NAME_ENV}; host name on --dry-run)",
    )
    parser.add_argument("--sysfs-root", type=Path, default=DEFAULT_SYSFS, help="default: /sys")
    parser.add_argument("--procfs-root", type=Path, default=DEFAULT_PROCFS, help="default: /proc")
    parser.add_argument(
        "--kubelet-config",
        type=Path,
        default=None,
        help="KubeletConfiguration file to read topology/CPU/memory manager policies from",
    )
    parser.add_argument("--gpu-resource", default=GPU_RESOURCE, help="GPU resource name")
    parser.add_argument("--rdma-resource", default=RDMA_RESOURCE, help="RDMA NIC resource name")
    parser.add_argument(
        "--interval", type=float, default=60.0, help="seconds between reports (default: 60)"
    )
    parser.add_argument("--once", action="store_true", help="report once and exit")
    parser.add_argument(
        "--dry-run", action="store_true", help="print the object instead of publishing it"
    )
    parser.add_argument(
        "-o", "--output", choices=("yaml", "json"), default="yaml", help="dry-run output format"
    )


def run(args: argparse.Namespace) -> int:
    _ensure_logging()
    node_name: str | None = args.node_name or os.environ.get(NODE_NAME_ENV) or None
    if node_name is None and args.dry_run:
        node_name = socket.gethostname()
    if not node_name:
        log.error(f"no node name: pass --node-name or set {NODE_NAME_ENV}")
        return 2
    if args.interval <= 0:
        log.error("--interval must be positive", interval=args.interval)
        return 2
    settings = AgentSettings(
        node_name=node_name,
        sysfs_root=args.sysfs_root,
        procfs_root=args.procfs_root,
        kubelet_config=args.kubelet_config,
        naming=ResourceNaming(gpu=args.gpu_resource, rdma_nic=args.rdma_resource),
        interval_seconds=args.interval,
    )
    if args.dry_run:
        return asyncio.run(_dry_run(settings, once=args.once, output=args.output, out=sys.stdout))
    return asyncio.run(_publish(settings, once=args.once))


def render(settings: AgentSettings, *, output: str, now: datetime) -> str:
    """One reading as the document ``--dry-run`` prints."""
    reading = settings.read()
    for warning in reading.warnings:
        log.warning("topology reading degraded", node=settings.node_name, reason=warning)
    body: dict[str, Any] = dict(
        node_topology_object(settings.node_name, reading.topology, reading.status(now))
    )
    if output == "json":
        return json.dumps(body, indent=2) + "\n"
    return yaml.safe_dump(body, sort_keys=False)


async def _dry_run(settings: AgentSettings, *, once: bool, output: str, out: TextIO) -> int:
    stop = _stop_on_signals()
    first = True
    while not stop.is_set():
        text = render(settings, output=output, now=datetime.now(UTC))
        if not first and output == "yaml":
            out.write("---\n")
        out.write(text)
        out.flush()
        first = False
        if once:
            break
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=settings.interval_seconds)
    return 0


async def _publish(settings: AgentSettings, *, once: bool) -> int:
    from kubernetes_asyncio import client, config

    from scheduler.agent.publisher import KubernetesTopologyApi, run_publisher

    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException:
        await config.load_kube_config()
    stop = _stop_on_signals()
    async with client.ApiClient() as api_client:
        ok = await run_publisher(settings, KubernetesTopologyApi(api_client), stop, once=once)
    return 0 if ok else 1


def _stop_on_signals() -> asyncio.Event:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop


def _ensure_logging() -> None:
    # The CLI normally configures structlog (scheduler/obs); when run alone, keep stdout for
    # the dry-run document and send log lines to stderr.
    if not structlog.is_configured():
        structlog.configure(logger_factory=lambda *_: structlog.PrintLogger(sys.stderr))
