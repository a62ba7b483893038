"""Micro-benchmark: the CPU of filling the cache from the initial lists, with the cyclic
collector on and paused (:func:`scheduler.control.app.collector_paused`), no cluster.

``python -m lattice_dev.benchmarks.startup [--nodes 5000] [--pods 30000] [--repeat 2]``

Why. A scheduler's start-up (and a standby's, before it can take over) lists every node
and bound pod; at 5000 nodes and 30 000 pods that was about 20 s of Lattice's CPU against
kube-scheduler's 6-7 s (``just bench``). This measures the part that is Lattice's own:
the bound pods' pages as the intake hands them over (orjson-decoded, 500 a page, each
page dropped once applied), applied through :class:`~scheduler.control.feed.Feed` into a
:class:`~scheduler.control.scheduler.Scheduler`, after the nodes. Bodies have the shape
the API server returns for a kwok-run pod (managedFields, the service-account volume,
status with conditions): ~3 KB each. Each mode runs in a fresh interpreter, so neither
sees the other's heap. Printed per run: CPU seconds of the sync (the apply and the final
collection and freeze in "on" mode, the freeze in "paused"), and the process's peak RSS.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import resource
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any

import orjson

from lattice_dev.devcluster.profiles import get_profile

MODES = ("on", "paused")
PAGE = 500
STAMP = "2026-12-07T10:00:00Z"


def node_body(i: int) -> dict[str, Any]:
    body = get_profile("standard").node_body(f"kwok-node-{i:04d}", i)
    body["metadata"].update(uid=f"node-{i}", resourceVersion=str(i + 1), creationTimestamp=STAMP)
    body["status"]["conditions"] = [
        {
            "type": kind,
            "status": "True" if kind == "Ready" else "False",
            "lastHeartbeatTime": STAMP,
            "lastTransitionTime": STAMP,
            "reason": "KubeletReady" if kind == "Ready" else "KubeletHasSufficient",
            "message": "kwok",
        }
        for kind in ("Ready", "MemoryPressure", "DiskPressure", "PIDPressure")
    ]
    return body


def pod_body(i: int, nodes: int) -> dict[str, Any]:
    """A bound, running plain pod as a list returns it."""
    volume = "kube-api-access-x7k2p"
    return {
        "metadata": {
            "name": f"existing-{i:05d}",
            "namespace": "bench",
            "uid": f"00000000-0000-4000-8000-{i:012d}",
            "resourceVersion": str(100_000 + i),
            "creationTimestamp": STAMP,
            "labels": {"app": "plain"},
            "managedFields": [
                {
                    "manager": "bench",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "time": STAMP,
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:spec": {"f:containers": {}, "f:nodeName": {}}},
                },
                {
                    "manager": "kwok",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "time": STAMP,
                    "fieldsType": "FieldsV1",
                    "subresource": "status",
                    "fieldsV1": {"f:status": {"f:conditions": {}, "f:phase": {}}},
                },
            ],
        },
        "spec": {
            "nodeName": f"kwok-node-{i % nodes:04d}",
            "schedulerName": "default-scheduler",
            "containers": [
                {
                    "name": "c",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
                    "terminationMessagePath": "/dev/termination-log",
                    "terminationMessagePolicy": "File",
                    "imagePullPolicy": "IfNotPresent",
                    "volumeMounts": [
                        {
                            "name": volume,
                            "readOnly": True,
                            "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                        }
                    ],
                }
            ],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default",
            "securityContext": {},
            "priority": 0,
            "enableServiceLinks": True,
            "preemptionPolicy": "PreemptLowerPriority",
            "tolerations": [
                {
                    "key": f"node.kubernetes.io/{key}",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                }
                for key in ("not-ready", "unreachable")
            ],
            "volumes": [
                {
                    "name": volume,
                    "projected": {
                        "defaultMode": 420,
                        "sources": [
                            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                            {
                                "configMap": {
                                    "name": "kube-root-ca.crt",
                                    "items": [{"key": "ca.crt", "path": "ca.crt"}],
                                }
                            },
                        ],
                    },
                }
            ],
        },
        "status": {
            "phase": "Running",
            "hostIP": "10.0.0.1",
            "podIP": "10.0.1.1",
            "podIPs": [{"ip": "10.0.1.1"}],
            "qosClass": "Burstable",
            "startTime": STAMP,
            "conditions": [
                {"type": kind, "status": "True", "lastProbeTime": None, "lastTransitionTime": STAMP}
                for kind in ("Initialized", "Ready", "ContainersReady", "PodScheduled")
            ],
            "containerStatuses": [
                {
                    "name": "c",
                    "state": {"running": {"startedAt": STAMP}},
                    "ready": True,
                    "restartCount": 0,
                    "image": "registry.k8s.io/pause:3.10",
                    "imageID": "",
                    "started": True,
                }
            ],
        },
    }


def sync(nodes: int, pods: int, mode: str) -> dict[str, float]:
    """Fill a scheduler's cache as ``lattice run``'s start-up does; CPU s and peak RSS."""
    from scheduler.control import intake
    from scheduler.control.app import collector_paused
    from scheduler.control.feed import PODGROUPS, Feed
    from scheduler.control.scheduler import Scheduler
    from scheduler.control.settings import parse_spec
    from scheduler.obs.metrics import Metrics

    node_list = orjson.dumps([node_body(i) for i in range(nodes)])
    pages = [
        orjson.dumps([pod_body(i, nodes) for i in range(k, min(k + PAGE, pods))])
        for k in range(0, pods, PAGE)
    ]
    gc.collect()
    gc.freeze()  # the bodies to decode are the wire's, not the heap's
    feed = Feed(Scheduler(parse_spec({}, "lattice"), writer=None, metrics=Metrics.create()))

    @contextlib.contextmanager
    def collector_on() -> Iterator[None]:
        """Before: the collector left on; start-up's collection and freeze came after."""
        yield
        gc.collect()
        gc.freeze()

    t0 = time.process_time()
    with collector_paused() if mode == "paused" else collector_on():
        feed.apply(
            [
                intake.Unavailable(PODGROUPS, 404, "no CRD"),
                intake.Relisted(intake.NODES, tuple(orjson.loads(node_list)), "1", initial=True),
                intake.Relisted(
                    intake.NAMESPACES, ({"metadata": {"name": "bench"}},), "1", initial=True
                ),
            ]
        )
        for k, page in enumerate(pages):
            feed.apply([intake.Page(intake.ASSIGNED_PODS, tuple(orjson.loads(page)), "2", k == 0)])
        feed.apply(
            [
                intake.Relisted(intake.ASSIGNED_PODS, (), "3", initial=True, paged=True),
                intake.Relisted(intake.PENDING_PODS, (), "3", initial=True),
            ]
        )
    cpu = time.process_time() - t0
    cache = feed.scheduler.cache
    if len(cache.pod_keys()) != pods or cache.snapshot.num_nodes != nodes:
        raise AssertionError(f"cached {len(cache.pod_keys())} pods on {cache.snapshot.num_nodes}")
    return {"cpu_s": cpu, "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lattice_dev.benchmarks.startup",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=30_000)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)  # one child's run
    args = parser.parse_args(argv)
    if args.mode is not None:
        print(json.dumps(sync(args.nodes, args.pods, args.mode)))
        return 0
    print(f"{args.nodes} nodes, {args.pods} bound pods; the sync's CPU and the peak RSS")
    print(f"{'run':>3} {'collector':<10} {'CPU s':>7} {'peak RSS MiB':>13}")
    for run in range(1, args.repeat + 1):
        for mode in MODES if run % 2 else MODES[::-1]:
            child = ["--nodes", str(args.nodes), "--pods", str(args.pods), "--mode", mode]
            out = subprocess.run(
                [sys.executable, "-m", "lattice_dev.benchmarks.startup", *child],
                check=True,
                capture_output=True,
                text=True,
            )
            got = json.loads(out.stdout.strip().splitlines()[-1])
            print(f"{run:>3} {mode:<10} {got['cpu_s']:>7.2f} {got['rss_mib']:>13.0f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
