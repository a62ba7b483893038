"""``lattice agent``: the node agent's command line.

The agent samples CPU and memory use every ``--sample-interval`` seconds (5), writes the
status (heartbeat, PSI, load over the window) every ``--report-interval`` seconds (15; at
least 1, and below 15 it warns, since every report is an API write from every node) and
re-reads the hardware every ``--topology-interval`` seconds (60; ``--interval`` is its old
name); see :mod:`scheduler.agent.runner`. Without ``--dry-run`` it connects to the API server
(in-cluster config, else kubeconfig) and publishes until SIGTERM/SIGINT.

``--dry-run`` prints the NodeTopology object (YAML or JSON) at each report instead of
publishing it; with ``--once`` a single time, which is how to see what the agent would report
on a machine (``lattice agent --once --dry-run``). The first report comes one sample interval
after start, from two samples, so even a single one includes the load; pass a small
``--sample-interval`` for a quicker answer. The node name comes from ``--node-name`` or
``NODE_NAME`` (the downward API's ``spec.nodeName``); a dry run falls back to the host name.

An agent that cannot start says why in one line on stderr, never with a traceback: bad flags
exit 2; no credentials, an API server that does not answer within 15 s, credentials it rejects
or a missing NodeTopology CRD exit 1 (the DaemonSet's pod restarts and tries again). Once
publishing, a failed report is retried at the next one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import socket
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any, TextIO

import structlog
import yaml

from scheduler.agent.pci import ResourceNaming
from scheduler.agent.reader import DEFAULT_PROCFS, DEFAULT_SYSFS, NodeReading
from scheduler.agent.resource import node_topology_object
from scheduler.agent.runner import ADVISED_REPORT_INTERVAL, AgentSettings, run_agent
from scheduler.model.topology import GPU_RESOURCE, RDMA_RESOURCE

NODE_NAME_ENV = "NODE_NAME"
API_WAIT_SECONDS = 15.0
CRD_WAIT_SECONDS = 5.0

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
        "--topology-interval",
        "--interval",
        dest="topology_interval",
        type=float,
        default=60.0,
        help="seconds between readings of the hardware (default: 60; --interval is the old name)",
    )
    parser.add_argument(
        "--report-interval",
        type=float,
        default=15.0,
        help="seconds between status writes: heartbeat, PSI, load (default: 15; at least 1)",
    )
    parser.add_argument(
        "--sample-interval",
        type=float,
        default=5.0,
        help="seconds between CPU/memory samples, at most --report-interval (default: 5)",
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
        print(
            f"lattice agent: no node name: pass --node-name or set {NODE_NAME_ENV}", file=sys.stderr
        )
        return 2
    try:
        settings = AgentSettings(
            node_name=node_name,
            sysfs_root=args.sysfs_root,
            procfs_root=args.procfs_root,
            kubelet_config=args.kubelet_config,
            naming=ResourceNaming(gpu=args.gpu_resource, rdma_nic=args.rdma_resource),
            topology_interval_seconds=args.topology_interval,
            report_interval_seconds=args.report_interval,
            sample_interval_seconds=args.sample_interval,
        )
    except ValueError as exc:
        print(f"lattice agent: invalid intervals: {exc}", file=sys.stderr)
        return 2
    if settings.report_interval_seconds < ADVISED_REPORT_INTERVAL and not args.dry_run:
        log.warning(
            "report interval below the advised minimum: every report is an API write per node",
            report_interval=settings.report_interval_seconds,
            advised=ADVISED_REPORT_INTERVAL,
        )
    if args.dry_run:
        return asyncio.run(_dry_run(settings, once=args.once, output=args.output, out=sys.stdout))
    try:
        return asyncio.run(_publish(settings, once=args.once))
    except Refusal as exc:
        print(f"lattice agent: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C before the signal handlers are installed
        return 130


def render(node_name: str, reading: NodeReading, *, output: str, now: datetime) -> str:
    """One reading as the document ``--dry-run`` prints: what would be published."""
    body: dict[str, Any] = dict(
        node_topology_object(node_name, reading.topology, reading.status(now))
    )
    if output == "json":
        return json.dumps(body, indent=2) + "\n"
    return yaml.safe_dump(body, sort_keys=False)


async def _dry_run(settings: AgentSettings, *, once: bool, output: str, out: TextIO) -> int:
    printed = 0

    async def show(reading: NodeReading, now: datetime) -> None:
        nonlocal printed
        if printed and output == "yaml":
            out.write("---\n")
        out.write(render(settings.node_name, reading, output=output, now=now))
        out.flush()
        printed += 1

    await run_agent(settings, show, _stop_on_signals(), once=once)
    return 0


class Refusal(Exception):
    """The agent cannot start; the message is the one line the operator reads."""


def _one_line(text: object) -> str:
    flat = re.sub(r"\s+", " ", str(text)).strip()
    return flat if len(flat) <= 300 else flat[:297] + "..."


async def _publish(settings: AgentSettings, *, once: bool) -> int:
    from kubernetes_asyncio import client

    from scheduler.agent.publisher import KubernetesTopologyApi, run_publisher

    configuration, source = await _credentials()
    async with client.ApiClient(configuration=configuration) as api_client:
        await _preflight(api_client, str(configuration.host), source)
        stop = _stop_on_signals()
        ok = await run_publisher(settings, KubernetesTopologyApi(api_client), stop, once=once)
    return 0 if ok else 1


async def _credentials() -> tuple[Any, str]:
    """The service account in a pod, else $KUBECONFIG or ~/.kube/config (any credential
    kubernetes-asyncio reads: tokens, certificates, embedded data, exec plugins)."""
    from kubernetes_asyncio import client, config

    configuration = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        return configuration, "the in-cluster service account"
    except config.ConfigException:
        pass
    path = _default_kubeconfig()
    try:
        await config.load_kube_config(
            config_file=path, client_configuration=configuration, persist_config=False
        )
    except (config.ConfigException, OSError, KeyError, TypeError, ValueError) as exc:
        raise Refusal(f"cannot load credentials from kubeconfig {path}: {_one_line(exc)}") from exc
    return configuration, f"kubeconfig {path}"


def _default_kubeconfig() -> str:
    path = os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
    if not os.path.isfile(path.split(os.pathsep)[0]):
        raise Refusal(
            "no credentials: not running in a pod (no service account token), and no "
            "$KUBECONFIG or ~/.kube/config"
        )
    return path


async def _preflight(api_client: Any, server: str, source: str) -> None:
    """The API server answers (bounded retry) and serves the NodeTopology CRD."""
    import aiohttp
    from kubernetes_asyncio import client

    from scheduler.model.topology import GROUP, PLURAL, VERSION

    deadline = time.monotonic() + API_WAIT_SECONDS
    delay, attempts = 0.5, 0
    while True:
        attempts += 1
        try:
            await client.VersionApi(api_client).get_code(_request_timeout=5)
            break
        except client.ApiException as exc:
            if exc.status == 401:
                raise Refusal(
                    f"the API server at {server} rejected the credentials of {source} (401)"
                ) from exc
            if exc.status not in (429, 500, 502, 503, 504):
                raise Refusal(
                    f"the API server at {server} answered {exc.status} {exc.reason}"
                ) from exc
            reason = f"{exc.status} {exc.reason}"
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            reason = _one_line(exc) or type(exc).__name__
        left = deadline - time.monotonic()
        if left <= 0:
            raise Refusal(
                f"cannot reach the API server at {server} ({source}) after {attempts} attempts "
                f"over {API_WAIT_SECONDS:.0f}s: {reason}"
            )
        await asyncio.sleep(min(delay, left))
        delay = min(delay * 2, 4.0)

    deadline = time.monotonic() + CRD_WAIT_SECONDS  # a CRD applied with the DaemonSet
    while True:
        try:
            found = await client.CustomObjectsApi(api_client).get_api_resources(GROUP, VERSION)
            if PLURAL in {r.name for r in (found.resources or [])}:
                return
        except client.ApiException as exc:
            if exc.status == 403:
                raise Refusal(
                    f"forbidden to look up {GROUP}/{VERSION} ({source}): grant the agent's RBAC "
                    "in manifests/agent.yaml (or install the chart)"
                ) from exc
            if exc.status != 404:
                raise Refusal(f"the API server answered {exc.status} {exc.reason}") from exc
        if time.monotonic() >= deadline:
            raise Refusal(
                f"the API server at {server} does not serve {PLURAL}.{GROUP}/{VERSION}: install "
                "Lattice's CRDs first: kubectl apply -f crds/ (or install the chart)"
            )
        await asyncio.sleep(1.0)


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
