"""`lattice selftest`: is the installed scheduler alive and binding? (`helm test` runs it.)

Two checks a user would make by hand: the scheduler's Service answers ``/readyz``, and a
pod with our ``schedulerName`` gets a node. The Service is found through the API (its
ClusterIP), not by DNS, so the check also works in clusters without cluster DNS. The probe
pod meets Pod Security ``restricted`` (it runs in the scheduler's namespace) and is deleted
whatever the outcome.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from pathlib import Path
from typing import Any, Final, cast

import aiohttp
from kubernetes_asyncio import client

from scheduler.control.kubeconfig import StartupError, describe_api_error, load_credentials

PROBE_PREFIX: Final = "lattice-selftest-"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kubeconfig", type=Path, default=None)
    parser.add_argument("--namespace", required=True, help="where the probe pod is created")
    parser.add_argument(
        "--service",
        default=None,
        help="the scheduler's Service in --namespace: its /readyz must answer 200 "
        "(default: skip that check)",
    )
    parser.add_argument("--port", type=int, default=10260, help="the Service's metrics port")
    parser.add_argument("--scheduler-name", default="lattice")
    parser.add_argument("--image", required=True, help="the probe pod's image (it runs --version)")
    parser.add_argument("--image-pull-policy", default="IfNotPresent")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds for each check")


def probe_pod(scheduler_name: str, image: str, pull_policy: str) -> dict[str, Any]:
    """Tiny and restricted-compliant; any node Lattice finds feasible will do."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": PROBE_PREFIX,
            "labels": {"app.kubernetes.io/component": "selftest-probe"},
        },
        "spec": {
            "schedulerName": scheduler_name,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 65532,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": "probe",
                    "image": image,
                    "imagePullPolicy": pull_policy,
                    "args": ["--version"],
                    "resources": {
                        "requests": {"cpu": "1m", "memory": "16Mi"},
                        "limits": {"memory": "64Mi"},
                    },
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "readOnlyRootFilesystem": True,
                        "capabilities": {"drop": ["ALL"]},
                    },
                }
            ],
        },
    }


async def check_ready(
    core: client.CoreV1Api, ns: str, service: str, port: int, within: float
) -> str:
    """GET /readyz on the Service's ClusterIP until 200 or ``within`` seconds pass."""
    svc = await core.read_namespaced_service(service, ns)
    ip = svc.spec.cluster_ip
    if not ip or ip == "None":
        raise RuntimeError(f"Service {ns}/{service} has no ClusterIP")
    url = f"http://{ip}:{port}/readyz"
    deadline = time.monotonic() + within
    last = "no answer"
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http:
        while True:
            try:
                async with http.get(url) as reply:
                    if reply.status == 200:
                        return url
                    last = f"HTTP {reply.status}: {(await reply.text())[:200]}"
            except (aiohttp.ClientError, TimeoutError) as exc:
                last = f"{type(exc).__name__}: {exc}"
            if time.monotonic() >= deadline:
                raise RuntimeError(f"{url} did not answer 200 within {within:g}s ({last})")
            await asyncio.sleep(1.0)


def _unscheduled_reason(pod: client.V1Pod) -> str:
    for cond in pod.status.conditions or [] if pod.status else []:
        if cond.type == "PodScheduled" and cond.status == "False":
            return f"{cond.reason}: {cond.message}"
    return "no PodScheduled condition yet: is a scheduler named that running and leading?"


async def check_binds(core: client.CoreV1Api, args: argparse.Namespace) -> tuple[str, str, float]:
    """Create the probe, wait for its nodeName; delete it in any case."""
    body = probe_pod(args.scheduler_name, args.image, args.image_pull_policy)
    created = await core.create_namespaced_pod(args.namespace, cast(client.V1Pod, body))
    name = created.metadata.name
    started = time.monotonic()
    try:
        while True:
            pod = await core.read_namespaced_pod(name, args.namespace)
            if pod.spec.node_name:
                return name, str(pod.spec.node_name), time.monotonic() - started
            if time.monotonic() - started >= args.timeout:
                raise RuntimeError(
                    f"probe pod {args.namespace}/{name} (schedulerName {args.scheduler_name}) "
                    f"not bound within {args.timeout:g}s: {_unscheduled_reason(pod)}"
                )
            await asyncio.sleep(0.5)
    finally:
        with contextlib.suppress(client.ApiException):
            await core.delete_namespaced_pod(name, args.namespace, grace_period_seconds=0)


async def selftest(args: argparse.Namespace) -> int:
    creds = await load_credentials(args.kubeconfig)
    async with client.ApiClient(creds.configuration) as api:
        core = client.CoreV1Api(api)
        try:
            if args.service:
                url = await check_ready(core, args.namespace, args.service, args.port, args.timeout)
                print(f"ok: {url} answered 200")
            name, node, took = await check_binds(core, args)
        except client.ApiException as exc:
            print(
                f"lattice selftest: {describe_api_error(exc, creds, 'the checks')}", file=sys.stderr
            )
            return 1
        except RuntimeError as exc:
            print(f"lattice selftest: {exc}", file=sys.stderr)
            return 1
    print(f"ok: {args.scheduler_name} bound probe pod {name} to {node} in {took:.1f}s")
    return 0


def run(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(selftest(args))
    except StartupError as exc:
        print(f"lattice selftest: {exc}", file=sys.stderr)
        return 1
