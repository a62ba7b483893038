"""Kubelet resource-manager policies, read from the kubelet's config file when mounted.

The kubelet's Topology Manager decides whether a pod that the scheduler placed is admitted
(``single-numa-node`` rejects what cannot be aligned), so the scheduler wants to know the
policy per node. Nothing in sysfs tells; the ``KubeletConfiguration`` file does
(``/var/lib/kubelet/config.yaml`` on kubeadm nodes), so the DaemonSet may mount it read-only.
Fields absent from the file take the kubelet's defaults. Command-line flags that override the
file are not visible from here, which is why the result is called a hint.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import Any, TypeVar

import yaml

from scheduler.agent.sysfs import Notes, read_text
from scheduler.model.topology import (
    CpuManagerPolicy,
    KubeletHints,
    MemoryManagerPolicy,
    TopologyManagerPolicy,
    TopologyManagerScope,
)

_E = TypeVar("_E", bound=StrEnum)


def read_kubelet_hints(path: Path, notes: Notes) -> KubeletHints | None:
    text = read_text(path, notes)
    if text is None:
        return None
    try:
        raw: Any = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        notes.warn(f"{path}: not YAML ({exc.__class__.__name__})")
        return None
    if not isinstance(raw, Mapping) or raw.get("kind") != "KubeletConfiguration":
        notes.warn(f"{path}: not a KubeletConfiguration")
        return None
    return parse_kubelet_config(raw, notes, source=str(path))


def parse_kubelet_config(raw: Mapping[str, Any], notes: Notes, *, source: str) -> KubeletHints:
    def pick(key: str, kind: type[_E], default: _E) -> _E | None:
        value = raw.get(key, default.value)
        try:
            return kind(value)
        except ValueError:
            notes.warn(f"{source}: unknown {key} {value!r}")
            return None

    return KubeletHints(
        topology_manager_policy=pick(
            "topologyManagerPolicy", TopologyManagerPolicy, TopologyManagerPolicy.NONE
        ),
        topology_manager_scope=pick(
            "topologyManagerScope", TopologyManagerScope, TopologyManagerScope.CONTAINER
        ),
        cpu_manager_policy=pick("cpuManagerPolicy", CpuManagerPolicy, CpuManagerPolicy.NONE),
        memory_manager_policy=pick(
            "memoryManagerPolicy", MemoryManagerPolicy, MemoryManagerPolicy.NONE
        ),
    )
