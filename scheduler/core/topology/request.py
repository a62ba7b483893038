"""What a pod asks of a node's topology, read from its requests and Lattice's annotations.

Annotations Lattice defines (all optional):

``lattice.dev/gpu-alignment: strict | numa | preferred``
    How hard the pod's GPUs (and NIC) must sit together; default ``preferred`` (see
    :class:`~scheduler.core.profile.GpuAlignment`).
``lattice.dev/rdma: "true"``
    The pod wants one RDMA NIC near its GPUs without requesting the RDMA resource, as on
    clusters whose RDMA device plugin shares NICs. Such a NIC is chosen and recorded but not
    consumed. Requesting the resource (``rdma/hca: n``) instead asks for n NICs of one unit
    each, which no other pod may then get.
``lattice.dev/devices``
    Written by Lattice with the binding, never by users: see
    :mod:`scheduler.core.topology.ledger`.

Requests: GPUs are the pod's request of the GPU resource (``nvidia.com/gpu``); pinned CPUs
are :attr:`Pod.exclusive_cpus` (whole CPUs of a Guaranteed pod).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from scheduler.core.profile import GpuAlignment, TopologyArgs
from scheduler.model.pod import Pod

ALIGNMENT_ANNOTATION: Final = "lattice.dev/gpu-alignment"
RDMA_ANNOTATION: Final = "lattice.dev/rdma"
DEVICES_ANNOTATION: Final = "lattice.dev/devices"

_TRUE: Final = frozenset({"true", "1", "yes"})
_FALSE: Final = frozenset({"false", "0", "no", ""})


class InvalidTopologyRequest(ValueError):
    """A Lattice annotation on the pod has a value Lattice does not understand."""


@dataclass(frozen=True, slots=True)
class TopologyRequest:
    gpus: int = 0
    nics: int = 0
    """RDMA NICs wanted (exclusive unless :attr:`shared_nic`)."""
    shared_nic: bool = False
    """The NIC was asked for by annotation: placed near the GPUs but not consumed."""
    cpus: int = 0
    """Whole CPUs a static CPU manager pins; matters only on single-numa-node nodes."""
    alignment: GpuAlignment = GpuAlignment.PREFERRED

    @property
    def wants_devices(self) -> bool:
        return self.gpus > 0 or self.nics > 0

    @property
    def key(self) -> tuple[int, int, bool, int]:
        """What the device choice depends on (alignment is applied separately)."""
        return (self.gpus, self.nics, self.shared_nic, self.cpus)

    @classmethod
    def from_pod(cls, pod: Pod, args: TopologyArgs) -> TopologyRequest:
        requests = pod.resources.requests
        annotations = pod.annotations
        raw_alignment = annotations.get(ALIGNMENT_ANNOTATION)
        alignment = args.default_alignment
        if raw_alignment is not None:
            try:
                alignment = GpuAlignment(raw_alignment.strip().lower())
            except ValueError:
                raise InvalidTopologyRequest(
                    f"annotation {ALIGNMENT_ANNOTATION}={raw_alignment!r} is not one of "
                    f"{', '.join(a.value for a in GpuAlignment)}"
                ) from None
        nics = requests.get(args.rdma_resource, 0)
        shared = False
        raw_rdma = annotations.get(RDMA_ANNOTATION)
        if raw_rdma is not None:
            value = raw_rdma.strip().lower()
            if value not in _TRUE | _FALSE:
                raise InvalidTopologyRequest(
                    f'annotation {RDMA_ANNOTATION}={raw_rdma!r} is not "true" or "false"'
                )
            if value in _TRUE and nics == 0:
                nics, shared = 1, True
        return cls(
            gpus=requests.get(args.gpu_resource, 0),
            nics=nics,
            shared_nic=shared,
            cpus=pod.exclusive_cpus,
            alignment=alignment,
        )
