"""Unsupported: pods needing volume binding, or with inline disks in a cycle without storage
state (gang members), or with DRA claims in a cycle without DRA state or using alpha DRA
fields, are refused whole, never placed."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.core.framework import Code
from scheduler.core.plugins import unsupported
from scheduler.core.plugins.unsupported import NO_DRA, NO_VOLUME_BINDING, NO_VOLUME_STATE
from scheduler.core.profile import DEFAULT_PROFILE
from scheduler.core.schedule import Framework
from scheduler.core.volumes import VolumeState
from scheduler.model.errors import InvalidObjectError
from scheduler.model.pod import (
    NODE_CONSTRAINED_INLINE_SOURCES,
    Pod,
    ResourceClaimRef,
    StorageVolume,
)
from tests.builders import NodeBuilder, PodBuilder, as_pod, cluster, make_node, make_pod
from tests.core.support import only_filter, run

ADVICE = "use the default scheduler for this pod"


def nodes() -> list[NodeBuilder]:
    return [make_node(f"node-{i}", cpu="4", memory="8Gi") for i in range(3)]


def with_spec(pod: PodBuilder, **spec: Any) -> PodBuilder:
    pod.body["spec"].update(spec)
    return pod


def pvc(name: str, claim: str) -> dict[str, Any]:
    return {"name": name, "persistentVolumeClaim": {"claimName": claim}}


def ephemeral(name: str) -> dict[str, Any]:
    template = {"spec": {"accessModes": ["ReadWriteOnce"], "resources": {}}}
    return {"name": name, "ephemeral": {"volumeClaimTemplate": template}}


FINE_VOLUMES = [
    {"name": "scratch", "emptyDir": {}},
    {"name": "cfg", "configMap": {"name": "cfg"}},
    {"name": "creds", "secret": {"secretName": "s"}},
    {"name": "token", "projected": {"sources": []}},
    {"name": "info", "downwardAPI": {"items": []}},
    {"name": "host", "hostPath": {"path": "/var/log"}},
    {"name": "inline-csi", "csi": {"driver": "secrets-store.csi.k8s.io"}},
    {"name": "share", "nfs": {"server": "nfs", "path": "/"}},
]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        pytest.param(
            {"volumes": [pvc("data", "ckpt")]},
            'pod has PersistentVolumeClaim volume "data" (claim "ckpt"): '
            f"{NO_VOLUME_BINDING}; {ADVICE}",
            id="pvc",
        ),
        pytest.param(
            {"volumes": [ephemeral("scratch")]},
            'pod has generic ephemeral volume "scratch" (claim "web-0-scratch"): '
            f"{NO_VOLUME_BINDING}; {ADVICE}",
            id="generic-ephemeral",
        ),
        pytest.param(
            {"volumes": [{"name": "disk", "gcePersistentDisk": {"pdName": "d"}}]},
            f'pod has gcePersistentDisk volume "disk": {NO_VOLUME_STATE}; {ADVICE}',
            id="inline-disk-without-volume-state",
        ),
        pytest.param(
            {"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]},
            f'pod has resource claim "gpu" (ResourceClaimTemplate "one-gpu"): {NO_DRA}; {ADVICE}',
            id="dra-template",
        ),
        pytest.param(
            {"resourceClaims": [{"name": "gpu", "resourceClaimName": "shared-gpu"}]},
            f'pod has resource claim "gpu" (ResourceClaim "shared-gpu"): {NO_DRA}; {ADVICE}',
            id="dra-claim",
        ),
        pytest.param(
            {
                "volumes": [*FINE_VOLUMES, pvc("a", "x"), ephemeral("b")],
                "resourceClaims": [{"name": "nic", "resourceClaimName": "rdma"}],
            },
            'pod has PersistentVolumeClaim volume "a" (claim "x"), generic ephemeral volume "b"'
            f' (claim "web-0-b"): {NO_VOLUME_BINDING}; pod has resource claim'
            f' "nic" (ResourceClaim "rdma"): {NO_DRA}; {ADVICE}',
            id="everything-named-once",
        ),
    ],
)
def test_refused_with_what_is_unsupported(spec: dict[str, Any], message: str) -> None:
    pod = with_spec(make_pod("web-0", cpu="100m"), **spec)
    decision = run(only_filter(unsupported.NAME), pod, nodes())
    assert decision.selected is None
    rejection = decision.explanation.prefilter_rejection
    assert rejection is not None
    assert rejection.plugin == unsupported.NAME
    assert rejection.code is Code.UNSCHEDULABLE_AND_UNRESOLVABLE
    assert rejection.message == message
    assert decision.summary == f"0/3 nodes are available: {message}."
    assert decision.explanation.code is Code.UNSCHEDULABLE_AND_UNRESOLVABLE


@pytest.mark.parametrize(
    "spec",
    [
        pytest.param({}, id="plain"),
        pytest.param({"volumes": FINE_VOLUMES}, id="volumes-needing-no-decision"),
        pytest.param({"resourceClaims": []}, id="empty-resource-claims"),
    ],
)
def test_other_pods_skip_it(spec: dict[str, Any]) -> None:
    pod = with_spec(make_pod("web-0", cpu="100m"), **spec)
    decision = run(only_filter(unsupported.NAME), pod, nodes())
    assert decision.selected is not None
    assert decision.explanation.skipped_filters == (unsupported.NAME,)


def test_default_profile_refuses_before_any_filter() -> None:
    """First among the filters, so the message is about the volume even when other
    plugins would reject too (here: no node has enough cpu, and the selector matches none)."""
    assert DEFAULT_PROFILE.filters[0] == unsupported.NAME
    pod = with_spec(
        make_pod("web-0", cpu="64").node_selector({"pool": "none"}),
        volumes=[pvc("data", "ckpt")],
    )
    decision = run(Framework(), pod, nodes())
    assert decision.selected is None
    rejection = decision.explanation.prefilter_rejection
    assert rejection is not None
    assert rejection.plugin == unsupported.NAME
    assert decision.explanation.filters == ()
    assert decision.explanation.rejecting_plugins == frozenset({unsupported.NAME})


def test_parsing_keeps_only_what_constrains_placement() -> None:
    body = with_spec(
        make_pod("p"),
        volumes=[*FINE_VOLUMES, pvc("data", "ckpt"), ephemeral("tmp")],
        resourceClaims=[
            {"name": "a", "resourceClaimName": "claim-a"},
            {"name": "b", "resourceClaimTemplateName": "tmpl-b"},
        ],
    ).obj()
    body["status"] = {
        "resourceClaimStatuses": [
            {"name": "b", "resourceClaimName": "p-b-x7k2q"},
            {"name": "c", "resourceClaimName": None},
        ]
    }
    pod = Pod.from_api(body)
    assert pod.generated_claims == {"b": "p-b-x7k2q", "c": None}
    assert pod.storage_volumes == (
        StorageVolume("data", "persistentVolumeClaim", "ckpt"),
        StorageVolume("tmp", "ephemeral", "p-tmp"),
    )
    assert pod.resource_claims == (
        ResourceClaimRef("a", claim_name="claim-a"),
        ResourceClaimRef("b", template_name="tmpl-b"),
    )
    plain = Pod.from_api(make_pod("q").obj())
    assert plain.storage_volumes == ()
    assert plain.resource_claims == ()
    assert plain.generated_claims == {}
    body["status"] = {"resourceClaimStatuses": [{"name": "b", "resourceClaimName": 1}]}
    with pytest.raises(InvalidObjectError, match="resourceClaimStatuses"):
        Pod.from_api(body)
    assert unsupported.unsupported_reason(plain) is None


@pytest.mark.parametrize(
    "spec",
    [
        pytest.param({"volumes": {"name": "x"}}, id="volumes-not-a-list"),
        pytest.param({"volumes": [{"name": "x", "persistentVolumeClaim": "c"}]}, id="bad-pvc"),
        pytest.param({"resourceClaims": [{"name": 3}]}, id="bad-claim-name"),
    ],
)
def test_malformed_bodies_are_invalid_objects(spec: dict[str, Any]) -> None:
    with pytest.raises(InvalidObjectError):
        Pod.from_api(with_spec(make_pod("p"), **spec).obj())


@pytest.mark.parametrize("source", NODE_CONSTRAINED_INLINE_SOURCES)
def test_inline_disks_are_refused_only_without_volume_state(source: str) -> None:
    """With storage state (lattice run, lattice explain) VolumeRestrictions and
    NodeVolumeLimits check the disk; without it (the gang solver) the pod is refused."""
    pod = with_spec(make_pod("p"), volumes=[{"name": "disk", source: {}}])
    assert [v.source for v in as_pod(pod).storage_volumes] == [source]
    decision = run(only_filter(unsupported.NAME), pod, nodes())
    assert decision.selected is None
    assert decision.summary == (
        f'0/3 nodes are available: pod has {source} volume "disk": {NO_VOLUME_STATE}; {ADVICE}.'
    )
    placed = only_filter(unsupported.NAME).schedule(
        cluster(nodes()), as_pod(pod), volumes=VolumeState()
    )
    assert placed.selected is not None
    assert placed.explanation.skipped_filters == (unsupported.NAME,)


def test_with_volume_state_and_no_dra_state_only_dra_and_unbindable_claims_are_refused() -> None:
    pod = with_spec(
        make_pod("web-0"),
        volumes=[{"name": "disk", "awsElasticBlockStore": {"volumeID": "vol-1"}}],
        resourceClaims=[{"name": "gpu", "resourceClaimName": "shared-gpu"}],
    )
    reason = unsupported.unsupported_reason(as_pod(pod), binds_volumes=True, checks_disks=True)
    assert reason == (
        f'pod has resource claim "gpu" (ResourceClaim "shared-gpu"): {NO_DRA}; {ADVICE}'
    )
