"""What a placed pod holds on its node under in-place resize, per release.

The cases mirror component-helpers' own ``helpers_test.go`` (``TestPodResourceRequests``,
``TestAggregateContainerRequestsAndLimits``, ``TestPodRequestsAndLimitsVerticalScalingWrappers``
at v0.37.2) run with the options kube-scheduler passes when it accounts a pod
(``PodInfo.CalculateResource``: ``UseStatusResources`` on; InPlacePodLevelResourcesVerticalScaling
off in 1.35, on since 1.36), plus the cases where 1.35/1.36 (a max per container) and 1.37
(the max of whole-pod aggregates, kubernetes#140047) disagree. Expected values were worked
out by hand from the Go source of each release (v0.35.4, v0.36.3, v0.37.2).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from scheduler.model.pod import Pod
from scheduler.model.release import DEFAULT_KUBE_MINOR, NEWEST_KUBE_MINOR, OLDEST_KUBE_MINOR
from scheduler.model.resources import StatusRules

RELEASES = tuple(range(OLDEST_KUBE_MINOR, NEWEST_KUBE_MINOR + 1))
MI = 1024**2


def container(name: str, *, sidecar: bool = False, **requests: str) -> dict[str, Any]:
    body: dict[str, Any] = {"name": name, "resources": {"requests": dict(requests)}}
    if sidecar:
        body["restartPolicy"] = "Always"
    return body


def status(
    name: str,
    actuated: dict[str, str] | None = None,
    allocated: dict[str, str] | None = None,
    *,
    resources: bool = True,
) -> dict[str, Any]:
    """A container status; ``resources=False`` leaves ``status.resources`` unset."""
    body: dict[str, Any] = {"name": name}
    if resources:
        body["resources"] = {} if actuated is None else {"requests": actuated}
    if allocated is not None:
        body["allocatedResources"] = allocated
    return body


def pod(
    containers: Sequence[dict[str, Any]],
    statuses: Sequence[dict[str, Any]] = (),
    *,
    init: Sequence[dict[str, Any]] = (),
    init_statuses: Sequence[dict[str, Any]] = (),
    pod_requests: dict[str, str] | None = None,
    pod_actuated: dict[str, str] | None = None,
    pod_allocated: dict[str, str] | None = None,
    infeasible: bool = False,
    overhead: dict[str, str] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"nodeName": "n1", "containers": list(containers)}
    if init:
        spec["initContainers"] = list(init)
    if pod_requests is not None:
        spec["resources"] = {"requests": pod_requests}
    if overhead is not None:
        spec["overhead"] = overhead
    st: dict[str, Any] = {"phase": "Running"}
    if statuses:
        st["containerStatuses"] = list(statuses)
    if init_statuses:
        st["initContainerStatuses"] = list(init_statuses)
    if pod_actuated is not None:
        st["resources"] = {"requests": pod_actuated}
    if pod_allocated is not None:
        st["allocatedResources"] = pod_allocated
    if infeasible:
        st["conditions"] = [{"type": "PodResizePending", "status": "True", "reason": "Infeasible"}]
    return {
        "metadata": {"name": "p", "namespace": "default", "uid": "u"},
        "spec": spec,
        "status": st,
    }


def every(expected: dict[str, int]) -> dict[int, dict[str, int]]:
    return dict.fromkeys(RELEASES, expected)


def by_release(
    r35: dict[str, int], r36: dict[str, int], r37: dict[str, int]
) -> dict[int, dict[str, int]]:
    return {35: r35, 36: r36, 37: r37}


CASES: dict[str, tuple[dict[str, Any], dict[int, dict[str, int]]]] = {
    # -- TestPodResourceRequests (UseStatusResources: true) ----------------------------------
    "resized, infeasible": (
        pod([container("c1", cpu="4")], [status("c1", {"cpu": "2"})], infeasible=True),
        every({"cpu": 2000}),
    ),
    "resized, infeasible & in-progress": (
        pod(
            [container("c1", cpu="6")],
            [status("c1", {"cpu": "2"}, {"cpu": "4"})],
            infeasible=True,
        ),
        every({"cpu": 4000}),
    ),
    "resized, no resize status": (
        pod([container("c1", cpu="4")], [status("c1", {"cpu": "2"})]),
        every({"cpu": 4000}),
    ),
    "actuated above spec": (
        pod([container("c1", cpu="1")], [status("c1", {"cpu": "3"}, {"cpu": "1"})]),
        every({"cpu": 3000}),
    ),
    "allocated above spec": (
        pod([container("c1", cpu="1")], [status("c1", {"cpu": "1"}, {"cpu": "2"})]),
        every({"cpu": 2000}),
    ),
    "resized: per-resource 3-way maximum": (
        pod(
            [
                {
                    "name": "c1",
                    "resources": {
                        "requests": {"cpu": "30m", "memory": "20M", "ephemeral-storage": "10G"}
                    },
                }
            ],
            [
                status(
                    "c1",
                    {"cpu": "10m", "memory": "30M", "ephemeral-storage": "20G"},
                    {"cpu": "20m", "memory": "10M", "ephemeral-storage": "30G"},
                )
            ],
        ),
        every({"cpu": 30, "memory": 30_000_000, "ephemeral-storage": 30_000_000_000}),
    ),
    "resized, restartable init container, infeasible": (
        pod(
            [],
            init=[container("sc", sidecar=True, cpu="4")],
            init_statuses=[status("sc", {"cpu": "2"})],
            infeasible=True,
        ),
        every({"cpu": 2000}),
    ),
    "resized, restartable init container, no resize status": (
        pod(
            [],
            init=[container("sc", sidecar=True, cpu="4")],
            init_statuses=[status("sc", {"cpu": "2"})],
        ),
        every({"cpu": 4000}),
    ),
    # 1.35/1.36 ignore allocatedResources without status.resources: the spec (1 + 2) wins
    # there too.
    "aggregate request resolves max of sums instead of sum of maxes": (
        pod(
            [container("c1", cpu="1"), container("c2", cpu="2")],
            [
                status("c1", allocated={"cpu": "2"}, resources=False),
                status("c2", allocated={"cpu": "1"}, resources=False),
            ],
        ),
        every({"cpu": 3000}),
    ),
    # -- TestAggregateContainerRequestsAndLimits --------------------------------------------
    "regular containers with empty requests, but status with non-empty requests": (
        pod([{"name": "c1"}], [status("c1", {"cpu": "2"})]),
        every({"cpu": 2000}),
    ),
    "always-restart init containers with empty requests, but status with non-empty requests": (
        pod(
            [],
            init=[{"name": "sc", "restartPolicy": "Always"}],
            init_statuses=[status("sc", {"cpu": "2"})],
        ),
        every({"cpu": 2000}),
    ),
    # The pod-level status stands for the container aggregates in 1.37 only.
    "aggregate request resolves directly from pod status": (
        pod([container("c1", cpu="1")], pod_actuated={"cpu": "3"}, pod_allocated={"cpu": "4"}),
        by_release({"cpu": 1000}, {"cpu": 1000}, {"cpu": 4000}),
    ),
    "falls back to container status aggregation when pod allocatedResources is nil": (
        pod(
            [container("c1", cpu="1")],
            [status("c1", {"cpu": "5"}, {"cpu": "6"})],
            pod_actuated={"cpu": "3"},
        ),
        every({"cpu": 6000}),
    ),
    "falls back to container status aggregation when pod resources is nil": (
        pod(
            [container("c1", cpu="1")],
            [status("c1", {"cpu": "5"}, {"cpu": "6"})],
            pod_allocated={"cpu": "6"},
        ),
        every({"cpu": 6000}),
    ),
    # -- TestPodRequestsAndLimitsVerticalScalingWrappers -------------------------------------
    "pod-level requests with status populated": (
        pod(
            [container("c1", cpu="1")],
            pod_requests={"cpu": "2"},
            pod_actuated={"cpu": "3.5"},
            pod_allocated={"cpu": "3"},
        ),
        by_release({"cpu": 2000}, {"cpu": 3500}, {"cpu": 3500}),
    ),
    "pod-level requests with an infeasible resize": (
        pod(
            [container("c1", cpu="1")],
            pod_requests={"cpu": "10"},
            pod_actuated={"cpu": "4"},
            pod_allocated={"cpu": "3"},
            infeasible=True,
        ),
        by_release({"cpu": 10000}, {"cpu": 4000}, {"cpu": 4000}),
    ),
    # -- where the releases part ------------------------------------------------------------
    # Each container's max is summed in 1.35/1.36 (2 + 2); 1.37 takes max(1+2, 2+1).
    "per-container max vs max of aggregates": (
        pod(
            [container("c1", cpu="1"), container("c2", cpu="2")],
            [status("c1", {"cpu": "2"}), status("c2", {"cpu": "1"})],
        ),
        by_release({"cpu": 4000}, {"cpu": 4000}, {"cpu": 3000}),
    ),
    # 1.37 reads the status of plain init containers too.
    "init container status": (
        pod(
            [container("c1", cpu="1")],
            [status("c1", {"cpu": "1"}, {"cpu": "1"})],
            init=[container("i1", cpu="4")],
            init_statuses=[status("i1", {"cpu": "6"}, {"cpu": "6"})],
        ),
        by_release({"cpu": 4000}, {"cpu": 4000}, {"cpu": 6000}),
    ),
    # A sidecar's status adds to the pod and to the peak of later init containers.
    "sidecar status": (
        pod(
            [container("c1", cpu="1")],
            [status("c1", {"cpu": "1"})],
            init=[container("sc", sidecar=True, cpu="1"), container("i1", cpu="2")],
            init_statuses=[status("sc", {"cpu": "3"}, {"cpu": "3"})],
        ),
        every({"cpu": 5000}),
    ),
    # Infeasible: 1.37 drops the spec even of a container that reports no status.
    "infeasible, a container without status": (
        pod(
            [container("c1", cpu="4"), container("c2", cpu="3")],
            [status("c1", {"cpu": "2"})],
            infeasible=True,
        ),
        by_release({"cpu": 5000}, {"cpu": 5000}, {"cpu": 2000}),
    ),
    # 1.36 sets every resource the pod-level spec names, zero when the status lacks it; 1.37
    # sets what the status has and leaves the rest to the containers.
    "pod-level resource the status lacks, infeasible": (
        pod(
            [container("c1", memory="512Mi")],
            [status("c1", allocated={"memory": "512Mi"}, resources=False)],
            pod_requests={"cpu": "2", "memory": "1Gi"},
            pod_actuated={"cpu": "1"},
            infeasible=True,
        ),
        by_release(
            {"cpu": 2000, "memory": 1024 * MI},
            {"cpu": 1000, "memory": 0},
            {"cpu": 1000, "memory": 512 * MI},
        ),
    ),
    # The steady state: a running pod's status repeats its spec.
    "status repeats the spec": (
        pod(
            [container("c1", cpu="1", memory="1Gi")],
            [status("c1", {"cpu": "1000m", "memory": "1Gi"}, {"cpu": "1", "memory": "1Gi"})],
            init=[container("sc", sidecar=True, cpu="500m")],
            init_statuses=[status("sc", {"cpu": "500m"}, {"cpu": "500m"})],
        ),
        every({"cpu": 1500, "memory": 1024 * MI}),
    ),
    # A 1.36+ kubelet writes the pod's status as PodRequests with the overhead in it
    # (kubelet_pods.go getEffectiveAllocatedResources); 1.37 adds the overhead again.
    "pod status with the overhead in it": (
        pod(
            [container("c1", cpu="1")],
            [status("c1", {"cpu": "1"}, {"cpu": "1"})],
            pod_actuated={"cpu": "1250m"},
            pod_allocated={"cpu": "1250m"},
            overhead={"cpu": "250m"},
        ),
        by_release({"cpu": 1250}, {"cpu": 1250}, {"cpu": 1500}),
    ),
    "overhead on top of the status": (
        pod(
            [container("c1", cpu="1")],
            [status("c1", {"cpu": "2"}, {"cpu": "2"})],
            overhead={"cpu": "250m"},
        ),
        every({"cpu": 2250}),
    ),
}


@pytest.mark.parametrize(("body", "expected"), CASES.values(), ids=CASES.keys())
@pytest.mark.parametrize("kube_minor", RELEASES)
def test_accounted_request(
    body: dict[str, Any], expected: dict[int, dict[str, int]], kube_minor: int
) -> None:
    assert (
        dict(Pod.from_api(body, kube_minor=kube_minor).resources.accounted) == expected[kube_minor]
    )


@pytest.mark.parametrize(("body", "expected"), CASES.values(), ids=CASES.keys())
def test_a_pod_being_scheduled_asks_for_its_spec(
    body: dict[str, Any], expected: dict[int, dict[str, int]]
) -> None:
    """NodeResourcesFit's PreFilter reads no status in any release."""
    spec_only = Pod.from_api({**body, "status": {}}).resources.accounted
    for kube_minor in RELEASES:
        assert Pod.from_api(body, kube_minor=kube_minor).resources.requests == spec_only


def test_without_status_every_release_agrees() -> None:
    body = pod(
        [container("c1", cpu="1"), container("c2", cpu="2")],
        init=[container("sc", sidecar=True, cpu="1"), container("i1", cpu="5")],
        pod_requests={"memory": "1Gi"},
        overhead={"cpu": "100m"},
    )
    parsed = [Pod.from_api(body, kube_minor=m).resources for m in RELEASES]
    assert all(r == parsed[0] for r in parsed)
    assert dict(parsed[0].accounted) == {"cpu": 6100, "memory": 1024 * MI}


def test_non_zero_requests_follow_the_status() -> None:
    """The scorers' non-zero view (100m / 200Mi for what a container does not name) is
    computed with the same status rules."""
    body = pod([container("c1", cpu="1")], [status("c1", {"cpu": "3"}, {"cpu": "3"})])
    resources = Pod.from_api(body).resources
    assert resources.non_zero_cpu == 3000
    assert resources.non_zero_memory == 200 * MI
    # Infeasible in 1.37: a container without status contributes only the defaults.
    body = pod(
        [container("c1", cpu="4"), container("c2", cpu="3")],
        [status("c1", {"cpu": "2"})],
        infeasible=True,
    )
    assert Pod.from_api(body, kube_minor=37).resources.non_zero_cpu == 2100
    assert Pod.from_api(body, kube_minor=36).resources.non_zero_cpu == 5000


def test_only_the_first_resize_condition_counts() -> None:
    body = pod([container("c1", cpu="4")], [status("c1", {"cpu": "2"})], infeasible=True)
    body["status"]["conditions"].insert(0, {"type": "PodResizePending", "reason": "Deferred"})
    assert Pod.from_api(body).resources.accounted["cpu"] == 4000


def test_status_rules_by_release() -> None:
    assert StatusRules.of(35) == StatusRules(max_of_aggregates=False, pod_level_status=False)
    assert StatusRules.of(36) == StatusRules(max_of_aggregates=False, pod_level_status=True)
    assert StatusRules.of(37) == StatusRules(max_of_aggregates=True, pod_level_status=True)
    body = pod([container("c1", cpu="1"), container("c2", cpu="2")], [status("c1", {"cpu": "2"})])
    assert Pod.from_api(body) == Pod.from_api(body, kube_minor=DEFAULT_KUBE_MINOR)
