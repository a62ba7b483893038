"""`lattice cleanup`: remove what a running Lattice created (the chart's post-delete hook).

`helm uninstall` deletes the objects the chart rendered; the software itself created more:
the ``LatticeScheduler`` object the scheduler writes with its defaults at first start, one
``NodeTopology`` per node from the agent (both cluster-scoped, so no namespace deletion
takes them), and the leader-election Lease; and Helm keeps ``helm test``'s hook objects
after an uninstall. This deletes exactly those, by name or by the agent's ``managed-by``
label, never anything a user made. An agent still terminating may
publish once more after a deletion, so the rounds repeat until two in a row find nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client

from scheduler.control.kubeconfig import StartupError, describe_api_error, load_credentials
from scheduler.control.settings import API_GROUP, API_VERSION, PLURAL
from scheduler.control.transient import TRANSPORT_ERRORS, describe
from scheduler.model.topology import GROUP as TOPOLOGY_GROUP
from scheduler.model.topology import MANAGED_BY, MANAGED_BY_LABEL
from scheduler.model.topology import PLURAL as TOPOLOGY_PLURAL
from scheduler.model.topology import VERSION as TOPOLOGY_VERSION


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kubeconfig", type=Path, default=None)
    parser.add_argument(
        "--scheduler-name", default="lattice", help="the LatticeScheduler object to delete"
    )
    parser.add_argument(
        "--namespace",
        default=None,
        help="the scheduler's namespace, when it outlives the release (the release's own): "
        "the Lease and `helm test`'s objects there are deleted (default: none)",
    )
    parser.add_argument("--lease-name", default=None, help="the leader-election Lease")
    parser.add_argument(
        "--test-name",
        default=None,
        help="`helm test`'s Pod, ServiceAccount, Role and RoleBinding (Helm keeps test "
        "hooks after uninstall)",
    )
    parser.add_argument(
        "--keep-topologies",
        action="store_true",
        help="leave the agent's NodeTopology objects (another agent install still runs)",
    )
    parser.add_argument(
        "--timeout", type=float, default=60.0, help="seconds until the rounds give up"
    )


async def _gone(call: Callable[[], Awaitable[Any]]) -> bool:
    """Run a delete; True if it deleted something, False if it was already gone."""
    try:
        await call()
    except client.ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


async def one_round(api: client.ApiClient, args: argparse.Namespace) -> list[str]:
    """Delete whatever of ours is there now; the names of what was deleted."""
    objects = client.CustomObjectsApi(api)
    deleted: list[str] = []
    name = args.scheduler_name
    if await _gone(
        lambda: objects.delete_cluster_custom_object(API_GROUP, API_VERSION, PLURAL, name)
    ):
        deleted.append(f"latticescheduler/{name}")
    if not args.keep_topologies:
        listed = await objects.list_cluster_custom_object(
            TOPOLOGY_GROUP,
            TOPOLOGY_VERSION,
            TOPOLOGY_PLURAL,
            label_selector=f"{MANAGED_BY_LABEL}={MANAGED_BY}",
        )
        for item in listed.get("items") or []:
            node = str(item["metadata"]["name"])
            delete = functools.partial(
                objects.delete_cluster_custom_object,
                TOPOLOGY_GROUP,
                TOPOLOGY_VERSION,
                TOPOLOGY_PLURAL,
                node,
            )
            if await _gone(delete):
                deleted.append(f"nodetopology/{node}")
    ns = args.namespace
    if ns and args.lease_name:
        leases = client.CoordinationV1Api(api)
        if await _gone(functools.partial(leases.delete_namespaced_lease, args.lease_name, ns)):
            deleted.append(f"lease/{ns}/{args.lease_name}")
    if ns and args.test_name:
        core, rbac, test = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api), args.test_name
        deletes: list[tuple[str, Callable[[str, str], Awaitable[Any]]]] = [
            ("pod", core.delete_namespaced_pod),
            ("rolebinding", rbac.delete_namespaced_role_binding),
            ("role", rbac.delete_namespaced_role),
            ("serviceaccount", core.delete_namespaced_service_account),
        ]
        for kind, remove in deletes:
            if await _gone(functools.partial(remove, test, ns)):
                deleted.append(f"{kind}/{ns}/{test}")
    return deleted


async def cleanup(args: argparse.Namespace) -> int:
    creds = await load_credentials(args.kubeconfig)
    deadline = time.monotonic() + args.timeout
    quiet = 0
    async with client.ApiClient(creds.configuration) as api:
        try:
            while quiet < 2:
                deleted = await one_round(api, args)
                for what in deleted:
                    print(f"deleted {what}")
                quiet = 0 if deleted else quiet + 1
                if quiet < 2:
                    if time.monotonic() >= deadline:
                        print(
                            f"lattice cleanup: objects kept coming back for {args.timeout:g}s "
                            "(is a scheduler or agent still running?)",
                            file=sys.stderr,
                        )
                        return 1
                    await asyncio.sleep(2.0)
        except client.ApiException as exc:
            print(
                f"lattice cleanup: {describe_api_error(exc, creds, 'the cleanup')}", file=sys.stderr
            )
            return 1
        except TRANSPORT_ERRORS as exc:  # deletes are idempotent: running it again is safe
            print(
                f"lattice cleanup: the API server did not answer ({describe(exc)}); run it again",
                file=sys.stderr,
            )
            return 1
    print("ok: nothing of Lattice's runtime objects is left")
    return 0


def run(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(cleanup(args))
    except StartupError as exc:
        print(f"lattice cleanup: {exc}", file=sys.stderr)
        return 1
