"""Small trace files for the simulator's tests, written the way the real ones are laid out."""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from scheduler.model.node import Node
from scheduler.model.pod import Pod
from scheduler.sim.trace import Task, Trace, node_body, pod_body

NODES_HEADER = "sn,cpu_milli,memory_mib,gpu,model"
DEFAULT_HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
    "creation_time,deletion_time,scheduled_time"
)
MULTIGPU_HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli"

TINY_NODES = [
    "node-a,64000,262144,8,V100M32",
    "node-b,64000,262144,8,V100M32",
    "node-c,32000,131072,2,T4",
]
"""18 GPUs on three nodes, two models."""
TINY_TASKS = [
    "task-0,8000,32768,1,1000,,LS,Running,0,100,0",
    "task-1,4000,16384,1,460,,LS,Running,10,50,10",  # shares a GPU: skipped
    "task-2,8000,32768,2,1000,T4|P100,LS,Running,20,,20",
    "task-3,2000,4096,0,0,,BE,Running,30,90,30",  # CPU only
    "task-4,16000,65536,8,1000,,LS,Running,40,200,40",
    "task-5,8000,32768,4,1000,V100M32,LS,Running,50,300,50",
]


def write_csv(path: Path, header: str, rows: Sequence[str]) -> Path:
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


def tiny(tmp_path: Path) -> tuple[Path, Path]:
    """The tiny node and task lists (default-list columns)."""
    return (
        write_csv(tmp_path / "nodes.csv", NODES_HEADER, TINY_NODES),
        write_csv(tmp_path / "tasks.csv", DEFAULT_HEADER, TINY_TASKS),
    )


def node_item(name: str, *, cpu: str = "16", memory: str = "64Gi", gpus: int = 0) -> dict[str, Any]:
    allocatable = {"cpu": cpu, "memory": memory, "pods": "110"}
    if gpus:
        allocatable["nvidia.com/gpu"] = str(gpus)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "status": {"allocatable": allocatable, "capacity": allocatable},
    }


def pod_item(
    name: str,
    *,
    created: str = "2024-05-01T10:00:00Z",
    node: str = "",
    gpus: int = 0,
    cpu: str = "1",
    phase: str = "Pending",
    deleting: bool = False,
) -> dict[str, Any]:
    requests: dict[str, str] = {"cpu": cpu, "memory": "1Gi"}
    limits: dict[str, str] = {}
    if gpus:
        requests["nvidia.com/gpu"] = limits["nvidia.com/gpu"] = str(gpus)
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": "team",
        "uid": f"uid-{name}",
        "creationTimestamp": created,
    }
    if deleting:
        metadata["deletionTimestamp"] = "2024-05-01T12:00:00Z"
    spec: dict[str, Any] = {
        "containers": [{"name": "c", "resources": {"requests": requests, "limits": limits}}]
    }
    if node:
        spec["nodeName"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": spec,
        "status": {"phase": phase},
    }


def write_dump(path: Path, items: Sequence[dict[str, Any]]) -> Path:
    """What ``kubectl get nodes,pods -o json`` writes."""
    document = {"apiVersion": "v1", "kind": "List", "metadata": {}, "items": list(items)}
    path.write_text(json.dumps(document, indent=4))
    return path


# ------------------------------------------------------------ records for replays
_uids = itertools.count()


def gpu_node(name: str, gpus: int = 8) -> Node:
    return Node.from_api(
        node_body(name, cpu_milli=64000, memory_mib=262144, gpus=gpus, model="V100M32")
    )


def gpu_pod(name: str, gpus: int, *, cpu_milli: int = 4000) -> Pod:
    uid = f"uid-{next(_uids)}"
    return Pod.from_api(pod_body(name, uid=uid, cpu_milli=cpu_milli, memory_mib=16384, gpus=gpus))


def task(name: str, gpus: int, created: float | None = None, deleted: float | None = None) -> Task:
    return Task(gpu_pod(name, gpus), created, deleted)


def small_then_whole() -> Trace:
    """Two 8-GPU nodes; four 1-GPU tasks, then one 8-GPU task."""
    tasks = [task(f"small-{i}", 1) for i in range(4)] + [task("whole", 8)]
    return Trace([gpu_node("n1"), gpu_node("n2")], [], tasks, 0, name="toy")
