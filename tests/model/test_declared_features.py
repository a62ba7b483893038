"""Which node declared features a pod needs (component-helpers v0.37.2
``nodedeclaredfeatures/features/*``: each feature's InferForScheduling and its tests), and
the bits a node's declared features map to."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.model.declared_features import (
    FEATURE_BITS,
    RESTART_ALL_CONTAINERS,
    SCHEDULING_FEATURES,
    USER_NAMESPACES_HOST_NETWORK,
    VOLUME_BIND_MOUNT_OPTIONS,
    feature_bits,
)
from scheduler.model.errors import InvalidObjectError
from scheduler.model.pod import Pod
from tests.builders import PodBuilder, make_pod

RESTART = RESTART_ALL_CONTAINERS
USERNS = USER_NAMESPACES_HOST_NETWORK
BIND = VOLUME_BIND_MOUNT_OPTIONS


@pytest.mark.parametrize(
    ("pod", "needed"),
    [
        pytest.param(make_pod(cpu="1"), set(), id="plain"),
        # restartallcontainers: the RestartAllContainers action, app or init containers.
        pytest.param(make_pod(cpu="1").restart_rule(), {RESTART}, id="restart-all-app"),
        pytest.param(
            make_pod(cpu="1").init_container("1").restart_rule(init=True),
            {RESTART},
            id="restart-all-init",
        ),
        pytest.param(make_pod(cpu="1").restart_rule("Restart"), set(), id="restart-one-only"),
        pytest.param(
            make_pod(cpu="1").restart_rule("Restart").restart_rule(),
            {RESTART},
            id="restart-all-among-rules",
        ),
        # usernamespaceshostnetwork: hostNetwork and hostUsers false, both.
        pytest.param(make_pod().host_network().host_users(False), {USERNS}, id="hostnet-userns"),
        pytest.param(make_pod().host_network(), set(), id="hostnet-hostusers-nil"),
        pytest.param(make_pod().host_network().host_users(True), set(), id="hostnet-hostusers"),
        pytest.param(make_pod().host_users(False), set(), id="userns-no-hostnet"),
        # volumebindmountoptions: a non-empty bindMountOptions on any kind of container.
        pytest.param(
            make_pod(cpu="1").volume_mount(bind_options=["rro"]), {BIND}, id="bind-options-app"
        ),
        pytest.param(
            make_pod(cpu="1").volume_mount(bind_options=["rro"], kind="initContainers"),
            {BIND},
            id="bind-options-init",
        ),
        pytest.param(
            make_pod(cpu="1").volume_mount(bind_options=["rro"], kind="ephemeralContainers"),
            {BIND},
            id="bind-options-ephemeral",
        ),
        pytest.param(make_pod(cpu="1").volume_mount(), set(), id="mount-without-options"),
        pytest.param(
            make_pod(cpu="1")
            .restart_rule()
            .volume_mount(bind_options=["rro"])
            .host_network()
            .host_users(False),
            {RESTART, USERNS, BIND},
            id="all-three",
        ),
    ],
)
def test_required_features(pod: PodBuilder, needed: set[str]) -> None:
    assert pod.build().required_features == needed


def test_ephemeral_containers_restart_rules_do_not_count() -> None:
    """kube reads restart rules of app and init containers only."""
    body = make_pod(cpu="1").obj()
    body["spec"]["ephemeralContainers"] = [
        {"name": "debug", "restartPolicyRules": [{"action": "RestartAllContainers"}]}
    ]
    assert Pod.from_api(body).required_features == frozenset()


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        pytest.param(
            lambda b: b["spec"]["containers"][0].update(restartPolicyRules={"action": "x"}),
            "spec.containers[0].restartPolicyRules",
            id="rules-not-a-list",
        ),
        pytest.param(
            lambda b: b["spec"]["containers"][0].update(restartPolicyRules=[{"action": 1}]),
            "spec.containers[0].restartPolicyRules[0].action",
            id="action-not-a-string",
        ),
        pytest.param(
            lambda b: b["spec"]["containers"][0].update(volumeMounts=[{"bindMountOptions": "ro"}]),
            "spec.containers[0].volumeMounts[0].bindMountOptions",
            id="options-not-a-list",
        ),
        pytest.param(
            lambda b: b["spec"]["containers"][0].update(volumeMounts="v"),
            "spec.containers[0].volumeMounts",
            id="mounts-not-a-list",
        ),
        pytest.param(
            lambda b: b["spec"].update(ephemeralContainers={}),
            "spec.ephemeralContainers",
            id="ephemeral-not-a-list",
        ),
        pytest.param(
            lambda b: b["spec"].update(hostNetwork=True, hostUsers="false"),
            "spec.hostUsers",
            id="host-users-not-a-bool",
        ),
    ],
)
def test_malformed_fields_are_typed_errors(mutate: Any, field: str) -> None:
    body = make_pod(cpu="1").obj()
    mutate(body)
    with pytest.raises(InvalidObjectError) as info:
        Pod.from_api(body)
    assert info.value.field == field


def test_each_feature_has_its_own_bit_and_unknown_names_none() -> None:
    assert sorted(FEATURE_BITS.values()) == [1 << i for i in range(len(SCHEDULING_FEATURES))]
    assert feature_bits([RESTART, BIND]) == FEATURE_BITS[RESTART] | FEATURE_BITS[BIND]
    assert feature_bits(["InPlacePodLevelResourcesVerticalScaling", "FromTheFuture"]) == 0
    assert feature_bits([]) == 0
