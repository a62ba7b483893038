"""DRA-backed extended resources (DRAExtendedResource: beta and on in 1.36, GA in 1.37).

A DeviceClass serves an extended resource name: its ``spec.extendedResourceName`` and,
always, ``deviceclass.resource.kubernetes.io/<class>``. A pod asking for such a name in its
containers' requests, unchanged, is served on a node whose allocatable lacks the resource
(0 or absent) from devices of that class, as kube-scheduler 1.37's DynamicResources does
(``extendeddynamicresources.go``); a node whose allocatable has it (a device plugin) is
NodeResourcesFit's, which skips the resource elsewhere (``shouldDelegateResourceToDRA``).

Per node, the names that node must serve by DRA become the requests of one claim
(:func:`requests_and_mappings`, kube's ``createRequestsAndMappings``): per resource and
container a request ``container-<i>-request-<j>`` (``i`` the container's position in
initContainers then containers, ``j`` the resource's position in the container's sorted
requests) for the container's whole count; a short-lived init container first reuses the
requests of the long-lived containers at or after its position, and of several short-lived
requests only the largest is kept, the others' mappings renamed to it. The claim is
allocated with the pod's own claims, created in PreBind (:func:`claim_body`: generated name
``<pod>-extended-resources-``, controlled by the pod so that it goes with the pod, annotated
``resource.kubernetes.io/extended-resource-claim: "true"``), then allocated and reserved
like any claim, and the pod's ``status.extendedResourceClaimStatus`` names it with the
container-to-request mappings (:func:`status_body`).

This module is pure: the plugin calls it per cycle and node, the controller writes what it
builds.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from scheduler.core.dra.objects import (
    EXACT_COUNT,
    EXTENDED_RESOURCE_CLAIM_ANNOTATION,
    DeviceClass,
    DeviceRequest,
    ExactRequest,
    ResourceClaim,
)
from scheduler.core.dra.state import placeholder_key
from scheduler.model.pod import ContainerRequests, Pod

SINCE_MINOR: Final = 36
"""DRAExtendedResource is on by default from Kubernetes 1.36 (alpha and off in 1.35)."""
STALE: Final = "cannot schedule extended resource claim"
"""kube's Filter reason while a claim made in an earlier cycle still exists (PostFilter
deletes it, and the pod is tried anew)."""
CANNOT_FIT: Final = "cannot fit resource"
"""kube's Filter reason for an extended resource neither the node's allocatable nor a
DeviceClass provides (NodeResourcesFit says it first unless it ignores the resource)."""


@dataclass(frozen=True, slots=True)
class RequestMapping:
    """One ``ContainerExtendedResourceRequest``: which claim request serves a container's
    extended resource."""

    container: str
    resource: str
    request: str

    def body(self) -> dict[str, str]:
        return {
            "containerName": self.container,
            "resourceName": self.resource,
            "requestName": self.request,
        }


def _container_request(
    container: ContainerRequests,
    resource: str,
    device_class: str,
    reusable: Iterable[DeviceRequest | None],
) -> tuple[DeviceRequest | None, list[RequestMapping]]:
    """kube's ``createResourceRequestAndMappings`` for one container and resource."""
    wanted = container.counts.get(resource, 0)
    if wanted == 0:
        return None, []
    mappings: list[RequestMapping] = []
    reused = 0
    for r in reusable:
        if r is None or r.exactly is None:
            continue
        reused += r.exactly.count
        mappings.append(RequestMapping(container.name, resource, r.name))
        if reused >= wanted:
            return None, mappings
    name = f"container-{container.index}-request-{container.names.index(resource)}"
    request = DeviceRequest(
        name, ExactRequest(device_class, mode=EXACT_COUNT, count=wanted - reused)
    )
    mappings.append(RequestMapping(container.name, resource, name))
    return request, mappings


def requests_and_mappings(
    pod: Pod, resources: Iterable[str], classes: Mapping[str, DeviceClass]
) -> tuple[tuple[DeviceRequest, ...], tuple[RequestMapping, ...]]:
    """The requests of the claim serving ``resources`` (names the node provides by DRA)
    and the pod's mappings, in kube's order: requests by name, mappings per resource (in
    name order), long-lived containers' before short-lived ones'."""
    containers = pod.container_requests
    long_lived = [c for c in containers if not c.short_lived]
    short_lived = [c for c in containers if c.short_lived]
    requests: list[DeviceRequest] = []
    mappings: list[RequestMapping] = []
    for resource in sorted(resources):
        cls = classes.get(resource)
        if cls is None:
            continue
        by_index: list[DeviceRequest | None] = [None] * len(containers)
        long_mappings: list[RequestMapping] = []
        for c in long_lived:
            made, found = _container_request(c, resource, cls.name, ())
            by_index[c.index] = made
            long_mappings += found
        largest: DeviceRequest | None = None
        short_names: set[str] = set()
        short_mappings: list[RequestMapping] = []
        for c in short_lived:
            made, found = _container_request(c, resource, cls.name, by_index[c.index :])
            if made is not None and made.exactly is not None:
                short_names.add(made.name)
                if (
                    largest is None
                    or largest.exactly is None
                    or largest.exactly.count < made.exactly.count
                ):
                    largest = made
            short_mappings += found
        if largest is not None and len(short_names) > 1:
            short_names.discard(largest.name)
            short_mappings = [
                RequestMapping(m.container, m.resource, largest.name)
                if m.request in short_names
                else m
                for m in short_mappings
            ]
        if largest is not None:
            requests.append(largest)
        requests += [r for r in by_index if r is not None]
        mappings += long_mappings + short_mappings
    requests.sort(key=lambda r: r.name)
    return tuple(requests), tuple(mappings)


def node_claim(pod: Pod, requests: tuple[DeviceRequest, ...]) -> ResourceClaim:
    """The claim as the allocator sees it before it exists (under the pod's placeholder)."""
    namespace, name = placeholder_key(pod.namespace, pod.uid)
    return ResourceClaim(namespace=namespace, name=name, requests=requests)


def claim_body(pod: Pod, requests: tuple[DeviceRequest, ...]) -> dict[str, Any]:
    """The ResourceClaim PreBind creates: controlled by the pod (garbage-collected with it;
    no ``blockOwnerDeletion``, as kube), annotated, with a generated name."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "generateName": f"{pod.name}-extended-resources-",
            "namespace": pod.namespace,
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": pod.name,
                    "uid": pod.uid,
                    "controller": True,
                }
            ],
            "annotations": {EXTENDED_RESOURCE_CLAIM_ANNOTATION: "true"},
        },
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": r.name,
                        "exactly": {
                            "deviceClassName": r.exactly.device_class,
                            "allocationMode": r.exactly.mode,
                            "count": r.exactly.count,
                        },
                    }
                    for r in requests
                    if r.exactly is not None
                ]
            }
        },
    }


def status_body(claim_name: str, mappings: Iterable[Mapping[str, str]]) -> dict[str, Any]:
    """The pod status change naming the created claim (``extendedResourceClaimStatus``)."""
    return {
        "extendedResourceClaimStatus": {
            "requestMappings": [dict(m) for m in mappings],
            "resourceClaimName": claim_name,
        }
    }
