"""The structured allocator: kube-scheduler 1.34's search, results and errors, deterministic."""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence
from typing import Any

import networkx as nx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.core.dra.allocator import (
    FILTER_TIMEOUT,
    AllocationError,
    Allocator,
    NodeAllocationError,
    SliceIndex,
    _hall_violated,
)
from scheduler.core.dra.cel import SelectorCompiler
from scheduler.core.dra.objects import DeviceClass, DeviceId, ResourceClaim, ResourceSlice
from tests.core.dra.builders import (
    GPU_DRIVER,
    NIC_DRIVER,
    claim,
    device,
    device_class,
    exactly,
    first_available,
    opaque,
    request,
    resource_slice,
)

GPU_CLASS = device_class("gpu")
NIC_CLASS = device_class("nic", driver=NIC_DRIVER)


def gpus(node: str, n: int, **per: Any) -> dict[str, Any]:
    return resource_slice(
        f"{node}-gpus", [device(f"gpu-{i}", numa=i // 4, **per) for i in range(n)], node=node
    )


def allocate(
    claims: Sequence[dict[str, Any]],
    slices: Sequence[dict[str, Any]],
    *,
    classes: Sequence[dict[str, Any]] = (GPU_CLASS, NIC_CLASS),
    node: str = "n1",
    labels: dict[str, str] | None = None,
    allocated: Sequence[DeviceId] = (),
    compact_config: bool = True,
    kube_minor: int = 37,
) -> list[dict[str, Any]] | None:
    allocator = Allocator(
        classes={c.name: c for c in (DeviceClass.from_api(b) for b in classes)},
        slices=SliceIndex(ResourceSlice.from_api(s) for s in slices),
        allocated=frozenset(allocated),
        compiler=SelectorCompiler(),
        compact_config=compact_config,
        kube_minor=kube_minor,
    )
    return allocator.allocate(node, labels or {}, [ResourceClaim.from_api(c) for c in claims])


def devices_of(allocation: dict[str, Any]) -> list[str]:
    return [r["device"] for r in allocation["devices"]["results"]]


def node_selector(node: str) -> dict[str, Any]:
    return {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
        ]
    }


@pytest.mark.parametrize("compact", [True, False], ids=["1.37", "1.35-1.36"])
def test_one_gpu_is_the_first_free_device_in_the_v1_shape(compact: bool) -> None:
    """1.37 drops ``requests`` from a config that applies to every request of the claim."""
    config = [opaque(GPU_DRIVER, mode="shared")]
    result = allocate(
        [claim("c", request("gpu", exactly("gpu")))],
        [gpus("n1", 4)],
        classes=[device_class("gpu", config=config)],
        allocated=[DeviceId(GPU_DRIVER, "n1", "gpu-0")],
        compact_config=compact,
    )
    named = {} if compact else {"requests": ["gpu"]}
    assert result == [
        {
            "devices": {
                "results": [
                    {"request": "gpu", "driver": GPU_DRIVER, "pool": "n1", "device": "gpu-1"}
                ],
                "config": [{"source": "FromClass", **named, **config[0]}],
            },
            "nodeSelector": node_selector("n1"),
        }
    ]


def test_count_and_an_unservable_count() -> None:
    two = allocate([claim("c", request("gpu", exactly("gpu", count=2)))], [gpus("n1", 4)])
    assert two is not None
    assert devices_of(two[0]) == ["gpu-0", "gpu-1"]
    assert allocate([claim("c", request("gpu", exactly("gpu", count=5)))], [gpus("n1", 4)]) is None
    assert allocate([claim("c", request("gpu", exactly("gpu")))], [gpus("n2", 4)]) is None


def test_devices_are_not_shared_between_the_claims_of_one_pod() -> None:
    result = allocate(
        [
            claim("a", request("gpu", exactly("gpu", count=2))),
            claim("b", request("gpu", exactly("gpu"))),
        ],
        [gpus("n1", 3)],
    )
    assert result is not None
    assert [devices_of(r) for r in result] == [["gpu-0", "gpu-1"], ["gpu-2"]]
    assert (
        allocate(
            [
                claim("a", request("gpu", exactly("gpu", count=2))),
                claim("b", request("gpu", exactly("gpu", count=2))),
            ],
            [gpus("n1", 3)],
        )
        is None
    )


def test_admin_access_ignores_other_claims_devices_but_not_its_own() -> None:
    used = [DeviceId(GPU_DRIVER, "n1", f"gpu-{i}") for i in range(2)]
    result = allocate(
        [claim("c", request("gpu", exactly("gpu", count=2, admin=True)))],
        [gpus("n1", 2)],
        allocated=used,
    )
    assert result is not None
    assert result[0]["devices"]["results"] == [
        {
            "request": "gpu",
            "driver": GPU_DRIVER,
            "pool": "n1",
            "device": f"gpu-{i}",
            "adminAccess": True,
        }
        for i in range(2)
    ]
    assert (
        allocate([claim("c", request("gpu", exactly("gpu", count=3, admin=True)))], [gpus("n1", 2)])
        is None
    )


def test_all_takes_every_matching_device() -> None:
    result = allocate(
        [
            claim(
                "c",
                request(
                    "gpu",
                    exactly("gpu", 'device.attributes["gpu.example.com"].numa == 1', mode="All"),
                ),
            )
        ],
        [gpus("n1", 8)],
    )
    assert result is not None
    assert devices_of(result[0]) == [f"gpu-{i}" for i in range(4, 8)]


def test_all_with_a_device_in_use_or_nothing_matching_does_not_fit() -> None:
    all_gpus = claim("c", request("gpu", exactly("gpu", mode="All")))
    assert (
        allocate([all_gpus], [gpus("n1", 2)], allocated=[DeviceId(GPU_DRIVER, "n1", "gpu-1")])
        is None
    )
    assert allocate([all_gpus], []) is None


def test_all_over_an_incomplete_pool_is_an_error_exact_count_skips_it() -> None:
    """kube 1.35+ (dynamic-resource-allocation v0.35 ``allocateOne``): ExactCount takes no
    device from an incomplete pool and goes on to the next; All over it is an error."""
    incomplete = resource_slice("s0", [device("gpu-0")], node="n1", count=2)
    with pytest.raises(AllocationError, match="currently being updated"):
        allocate([claim("c", request("gpu", exactly("gpu", mode="All")))], [incomplete])
    assert allocate([claim("c", request("gpu", exactly("gpu")))], [incomplete]) is None
    other = resource_slice("s1", [device("gpu-1")], node="n1", pool="q")
    result = allocate([claim("c", request("gpu", exactly("gpu")))], [incomplete, other])
    assert result is not None
    assert devices_of(result[0]) == ["gpu-1"]


def test_an_invalid_pool_is_skipped_and_named_when_the_node_does_not_fit() -> None:
    """kube 1.35+: no device from an invalid pool, no error while another pool serves the
    claim; a node that does not fit says ``invalid resource pools were encountered``
    (``ErrFailedAllocationOnNode``: Unschedulable there, the attempt goes on)."""
    dup = [
        resource_slice("s0", [device("gpu-0")], node="n1", pool="p", count=2),
        resource_slice("s1", [device("gpu-0")], node="n1", pool="p", count=2),
    ]
    with pytest.raises(NodeAllocationError, match="invalid resource pools were encountered"):
        allocate([claim("c", request("gpu", exactly("gpu")))], dup)
    other = resource_slice("s2", [device("gpu-9")], node="n1", pool="q")
    result = allocate([claim("c", request("gpu", exactly("gpu")))], [*dup, other])
    assert result is not None
    assert devices_of(result[0]) == ["gpu-9"]


def test_only_the_newest_pool_generation_counts() -> None:
    slices = [
        resource_slice("old", [device("gpu-old")], node="n1", pool="p", generation=1),
        resource_slice("new", [device("gpu-new")], node="n1", pool="p", generation=2),
    ]
    result = allocate([claim("c", request("gpu", exactly("gpu")))], slices)
    assert result is not None
    assert devices_of(result[0]) == ["gpu-new"]


def test_more_than_32_devices_is_an_error() -> None:
    with pytest.raises(AllocationError, match="exceeds the claim limit of 32"):
        allocate([claim("c", request("gpu", exactly("gpu", count=33)))], [gpus("n1", 40)])
    result = allocate([claim("c", request("gpu", exactly("gpu", count=32)))], [gpus("n1", 40)])
    assert result is not None
    assert len(devices_of(result[0])) == 32


def test_a_missing_class_and_a_cel_runtime_error_are_errors() -> None:
    with pytest.raises(AllocationError, match="device class missing"):
        allocate([claim("c", request("gpu", exactly("missing")))], [gpus("n1", 1)])
    with pytest.raises(AllocationError, match="CEL runtime error"):
        allocate(
            [
                claim(
                    "c",
                    request(
                        "gpu", exactly("gpu", 'device.attributes["gpu.example.com"].uuid == "x"')
                    ),
                )
            ],
            [gpus("n1", 1)],
        )


def test_an_unknown_domain_is_false_not_an_error() -> None:
    assert (
        allocate(
            [
                claim(
                    "c", request("gpu", exactly("gpu", 'device.attributes["other.io"].size() > 0'))
                )
            ],
            [gpus("n1", 1)],
        )
        is None
    )


@pytest.mark.parametrize("compact", [True, False], ids=["1.37", "1.35-1.36"])
def test_first_available_falls_back_in_order_and_names_the_subrequest(compact: bool) -> None:
    """A config naming the chosen ``gpu/small`` applies to every request of the claim: 1.37
    drops its ``requests``."""
    h100 = 'device.attributes["gpu.example.com"].model == "H100"'
    slices = [
        resource_slice(
            "s", [device("gpu-0", model="A100"), device("gpu-1", model="A100")], node="n1"
        )
    ]
    claims = [
        claim(
            "c",
            first_available(
                "gpu", ("big", exactly("gpu", h100)), ("small", exactly("gpu", count=2))
            ),
            config=[
                {"requests": ["gpu/small"], **opaque(GPU_DRIVER, a=1)},
                {"requests": ["gpu/big"], **opaque(GPU_DRIVER, b=1)},
            ],
        )
    ]
    result = allocate(
        claims,
        slices,
        classes=[device_class("gpu", config=[opaque(GPU_DRIVER, c=1)])],
        compact_config=compact,
    )
    assert result is not None
    assert [r["request"] for r in result[0]["devices"]["results"]] == ["gpu/small", "gpu/small"]
    named = {} if compact else {"requests": ["gpu/small"]}
    assert result[0]["devices"]["config"] == [
        {"source": "FromClass", **named, **opaque(GPU_DRIVER, c=1)},
        {"source": "FromClaim", **named, **opaque(GPU_DRIVER, a=1)},
    ]


def test_class_config_appears_once_per_class_and_claim_config_once_per_matching_request() -> None:
    """kube 1.35-1.36: a claim config naming two used requests goes in twice."""
    claims = [
        claim(
            "c",
            request("a", exactly("gpu")),
            request("b", exactly("gpu")),
            config=[{"requests": ["a", "b"], **opaque(GPU_DRIVER, x=1)}, opaque(GPU_DRIVER, y=1)],
        )
    ]
    result = allocate(
        claims,
        [gpus("n1", 2)],
        classes=[device_class("gpu", config=[opaque(GPU_DRIVER, c=1)])],
        compact_config=False,
    )
    assert result is not None
    assert result[0]["devices"]["config"] == [
        {"source": "FromClass", "requests": ["a", "b"], **opaque(GPU_DRIVER, c=1)},
        {"source": "FromClaim", "requests": ["a", "b"], **opaque(GPU_DRIVER, x=1)},
        {"source": "FromClaim", "requests": ["a", "b"], **opaque(GPU_DRIVER, x=1)},
        {"source": "FromClaim", **opaque(GPU_DRIVER, y=1)},
    ]


def test_1_37_writes_a_claim_config_once_and_drops_requests_that_name_every_request() -> None:
    """dynamic-resource-allocation v0.37: one copy of a claim config, ``requests`` cleared
    where it names every request (its name or the chosen ``req/sub``), kept otherwise."""
    claims = [
        claim(
            "c",
            request("a", exactly("gpu")),
            request("b", exactly("gpu")),
            config=[
                {"requests": ["a", "b"], **opaque(GPU_DRIVER, x=1)},
                {"requests": ["b"], **opaque(GPU_DRIVER, z=1)},
                opaque(GPU_DRIVER, y=1),
            ],
        )
    ]
    result = allocate(
        claims, [gpus("n1", 2)], classes=[device_class("gpu", config=[opaque(GPU_DRIVER, c=1)])]
    )
    assert result is not None
    assert result[0]["devices"]["config"] == [
        {"source": "FromClass", **opaque(GPU_DRIVER, c=1)},
        {"source": "FromClaim", **opaque(GPU_DRIVER, x=1)},
        {"source": "FromClaim", "requests": ["b"], **opaque(GPU_DRIVER, z=1)},
        {"source": "FromClaim", **opaque(GPU_DRIVER, y=1)},
    ]


def test_match_attribute_backtracks_to_a_common_value() -> None:
    # gpu-0..3 on numa 0, gpu-4..7 on numa 1; the first three are taken.
    used = [DeviceId(GPU_DRIVER, "n1", f"gpu-{i}") for i in range(3)]
    result = allocate(
        [
            claim(
                "c",
                request("gpu", exactly("gpu", count=2)),
                constraints=[{"matchAttribute": f"{GPU_DRIVER}/numa"}],
            )
        ],
        [gpus("n1", 8)],
        allocated=used,
    )
    assert result is not None
    assert devices_of(result[0]) == ["gpu-4", "gpu-5"]


def test_match_attribute_needs_the_attribute_and_the_same_type() -> None:
    slices = [
        resource_slice(
            "s",
            [
                device("gpu-0", numa=0),
                device("gpu-1"),
                device("gpu-2", numa="0"),
                device("gpu-3", numa=0),
            ],
            node="n1",
        )
    ]
    result = allocate(
        [
            claim(
                "c",
                request("gpu", exactly("gpu", count=2)),
                constraints=[{"matchAttribute": f"{GPU_DRIVER}/numa"}],
            )
        ],
        slices,
    )
    assert result is not None
    assert devices_of(result[0]) == ["gpu-0", "gpu-3"]


def test_match_attribute_on_a_version_and_scoped_to_requests() -> None:
    v = {"version": "1.0.0"}
    slices = [
        resource_slice(
            "s",
            [
                device("gpu-0", fw={"version": "2.0.0"}),
                device("gpu-1", fw=v),
                device("gpu-2", fw=v),
            ],
            node="n1",
        )
    ]
    claims = [
        claim(
            "c",
            request("a", exactly("gpu")),
            request("b", exactly("gpu")),
            request("free", exactly("gpu")),
            constraints=[{"requests": ["a", "b"], "matchAttribute": f"{GPU_DRIVER}/fw"}],
        )
    ]
    result = allocate(
        claims, [*slices, resource_slice("t", [device("gpu-9")], node="n1", pool="other")]
    )
    assert result is not None
    assert devices_of(result[0]) == ["gpu-1", "gpu-2", "gpu-0"]


def test_gpu_and_nic_on_one_pcie_root_across_two_drivers() -> None:
    root = "resource.kubernetes.io/pcieRoot"
    gpu_slice = resource_slice(
        "n1-gpus",
        [device(f"gpu-{i}", qualified={root: f"pci000{i}:00"}) for i in range(3)],
        node="n1",
    )
    nic_slice = resource_slice(
        "n1-nics", [device("nic-0", qualified={root: "pci0002:00"})], node="n1", driver=NIC_DRIVER
    )
    claims = [
        claim(
            "c",
            request("gpu", exactly("gpu")),
            request("nic", exactly("nic")),
            constraints=[{"requests": ["gpu", "nic"], "matchAttribute": root}],
        )
    ]
    result = allocate(claims, [gpu_slice, nic_slice])
    assert result is not None
    assert [(r["driver"], r["device"]) for r in result[0]["devices"]["results"]] == [
        (GPU_DRIVER, "gpu-2"),
        (NIC_DRIVER, "nic-0"),
    ]


def test_the_driver_domain_fallback_applies_only_to_the_drivers_own_domain() -> None:
    slices = [resource_slice("s", [device("gpu-0", numa=0), device("gpu-1", numa=0)], node="n1")]
    constrained = [
        claim(
            "c",
            request("gpu", exactly("gpu", count=2)),
            constraints=[{"matchAttribute": "other.io/numa"}],
        )
    ]
    assert allocate(constrained, slices) is None


def test_node_selector_slices_allnodes_slices_and_their_node_selectors() -> None:
    zone = {
        "nodeSelectorTerms": [
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
        ]
    }
    slices = [
        resource_slice("net", [device("gpu-0")], pool="net", node_selector=zone),
        resource_slice("everywhere", [device("gpu-1")], pool="everywhere", all_nodes=True),
    ]
    two = [claim("c", request("gpu", exactly("gpu", count=2)))]
    result = allocate(two, slices, labels={"zone": "a"})
    assert result is not None
    assert devices_of(result[0]) == ["gpu-1", "gpu-0"]  # pools sorted by name
    assert result[0]["nodeSelector"] == zone
    assert allocate(two, slices, labels={"zone": "b"}) is None
    one = allocate([claim("c", request("gpu", exactly("gpu")))], slices, labels={"zone": "b"})
    assert one is not None
    assert "nodeSelector" not in one[0]


def test_partitionable_fields_are_refused_on_1_35_and_read_on_1_37() -> None:
    """1.35 (DRAPartitionableDevices off) passes over a device with counters and skips a
    per-device slice; 1.37 finds the counter set missing, so the pool is invalid, and the
    per-device slice's device names no node."""
    slices = [
        resource_slice(
            "s",
            [
                {**device("gpu-1"), "consumesCounters": [{"counterSet": "x", "counters": {}}]},
            ],
            node="n1",
        ),
        {
            **resource_slice("p", [device("gpu-2")], pool="p"),
            "spec": {
                **resource_slice("p", [device("gpu-2")], pool="p")["spec"],
                "perDeviceNodeSelection": True,
            },
        },
    ]
    claims = [claim("c", request("gpu", exactly("gpu")))]
    assert allocate(claims, slices, kube_minor=35) is None
    with pytest.raises(NodeAllocationError, match="invalid resource pools"):
        allocate(claims, slices, kube_minor=37)


def test_the_same_cluster_always_gives_the_same_allocation() -> None:
    slices = [gpus(f"n{i}", 4) for i in range(3)] + [
        resource_slice(
            f"shared-{p}",
            [device(f"gpu-{p}{i}") for i in range(2)],
            pool=f"pool-{p}",
            all_nodes=True,
        )
        for p in "cab"
    ]
    claims = [claim("c", request("gpu", exactly("gpu", count=6)))]
    first = allocate(claims, slices)
    rng = random.Random(7)
    for _ in range(10):
        rng.shuffle(slices)
        assert allocate(claims, slices) == first


# --- properties: every allocation is valid, and None only when none exists ---------------

_ATTRS = st.fixed_dictionaries(
    {"numa": st.integers(0, 1), "model": st.sampled_from(["A100", "H100"])}
)
_SELECTORS = st.sampled_from(
    [
        None,
        'device.attributes["gpu.example.com"].model == "A100"',
        'device.attributes["gpu.example.com"].numa == 1',
    ]
)


@st.composite
def _cases(draw: st.DrawFn) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[DeviceId]]:
    n = draw(st.integers(0, 6))
    attrs: list[dict[str, Any]] = [draw(_ATTRS) for _ in range(n)]
    split = draw(st.integers(0, n))
    slices = [
        resource_slice(
            "a", [device(f"d{i}", **attrs[i]) for i in range(split)], node="n1", pool="a"
        ),
        resource_slice(
            "b", [device(f"d{i}", **attrs[i]) for i in range(split, n)], node="n1", pool="b"
        ),
    ]
    requests = []
    for r in range(draw(st.integers(1, 2))):
        selector = draw(_SELECTORS)
        requests.append(
            request(
                f"r{r}",
                exactly("gpu", *([selector] if selector else []), count=draw(st.integers(1, 2))),
            )
        )
    constraints = [{"matchAttribute": f"{GPU_DRIVER}/numa"}] if draw(st.booleans()) else None
    used = [
        DeviceId(GPU_DRIVER, "a" if i < split else "b", f"d{i}")
        for i in range(n)
        if draw(st.booleans()) and i % 3 == 0
    ]
    return [claim("c", *requests, constraints=constraints)], slices, used


def _brute_force_exists(
    claims: list[dict[str, Any]], slices: list[dict[str, Any]], used: list[DeviceId]
) -> bool:
    """Try every assignment of distinct free devices to the request slots (tiny cases)."""
    compiler = SelectorCompiler()
    parsed = [ResourceSlice.from_api(s) for s in slices]
    free = [
        (DeviceId(s.driver, s.pool, d.name), d)
        for s in parsed
        for d in s.devices
        if DeviceId(s.driver, s.pool, d.name) not in used
    ]
    c = ResourceClaim.from_api(claims[0])
    cls = DeviceClass.from_api(GPU_CLASS)
    slots: list[tuple[str, tuple[str | None, ...]]] = []
    for r in c.requests:
        assert r.exactly is not None
        slots += [(r.name, r.exactly.selectors)] * r.exactly.count
    for combo in itertools.permutations(free, len(slots)):
        if not all(
            all(e is not None and d.matches(e, compiler) for e in (*cls.selectors, *sel))
            for (_, sel), (_, d) in zip(slots, combo, strict=True)
        ):
            continue
        if c.constraints:
            values = {d.attribute(f"{GPU_DRIVER}/numa") for _, d in combo}
            if len(values) > 1 or None in values:
                continue
        return True
    return False


def _check_valid(
    result: list[dict[str, Any]],
    claims: list[dict[str, Any]],
    slices: list[dict[str, Any]],
    used: list[DeviceId],
) -> None:
    compiler = SelectorCompiler()
    by_id = {
        DeviceId(s.driver, s.pool, d.name): d
        for s in map(ResourceSlice.from_api, slices)
        for d in s.devices
    }
    c = ResourceClaim.from_api(claims[0])
    cls = DeviceClass.from_api(GPU_CLASS)
    results = result[0]["devices"]["results"]
    ids = [DeviceId(r["driver"], r["pool"], r["device"]) for r in results]
    assert len(set(ids)) == len(ids)
    assert not set(ids) & set(used)
    wanted = [r.name for r in c.requests for _ in range(r.exactly.count if r.exactly else 0)]
    assert [r["request"] for r in results] == wanted
    for r, device_id in zip(results, ids, strict=True):
        spec = next(q.exactly for q in c.requests if q.name == r["request"])
        assert spec is not None
        assert all(
            e is not None and by_id[device_id].matches(e, compiler)
            for e in (*cls.selectors, *spec.selectors)
        )
    if c.constraints:
        assert len({by_id[i].attribute(f"{GPU_DRIVER}/numa") for i in ids}) == 1
    assert result[0]["nodeSelector"] == node_selector("n1")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_cases())
def test_allocations_are_valid_and_complete(
    case: tuple[list[dict[str, Any]], list[dict[str, Any]], list[DeviceId]],
) -> None:
    claims, slices, used = case
    result = allocate(claims, slices, allocated=used)
    if result is None:
        assert not _brute_force_exists(claims, slices, used)
    else:
        _check_valid(result, claims, slices, used)


@pytest.mark.parametrize("kube_minor", [35, 37])
def test_a_search_past_the_filter_timeout_is_what_the_release_makes_of_it(
    kube_minor: int,
) -> None:
    """Two claims of 9 devices each on 16, each a firstAvailable list of one (the count
    check leaves those to the search): each alone fits, so only the search can tell, and it
    walks the subsets of 16 devices (orders before 1.36); kube gives up after its 10 s
    filterTimeout: the node does not fit in 1.35, the attempt is a SchedulerError from
    1.36. So does Lattice."""
    ticks = itertools.count()

    def make(timeout: float | None) -> Allocator:
        return Allocator(
            classes={"gpu": DeviceClass.from_api(GPU_CLASS)},
            slices=SliceIndex([ResourceSlice.from_api(gpus("n1", 16))]),
            allocated=frozenset(),
            compiler=SelectorCompiler(),
            timeout=timeout,
            clock=lambda: float(next(ticks)),
            kube_minor=kube_minor,
        )

    too_many = [
        ResourceClaim.from_api(
            claim(name, first_available("gpu", ("nine", exactly("gpu", count=9))))
        )
        for name in ("a", "b")
    ]
    if kube_minor == 35:
        with pytest.raises(NodeAllocationError, match=r"^timed out trying to allocate devices$"):
            make(50.0).allocate("n1", {}, too_many)
    else:
        with pytest.raises(AllocationError, match=r"^node n1: timed out trying to allocate"):
            make(50.0).allocate("n1", {}, too_many)
    seen = next(ticks)
    assert 50 <= seen < 1000, "gave up at the deadline, not after the whole search"
    fits = [ResourceClaim.from_api(claim("c", request("gpu", exactly("gpu", count=16))))]
    result = make(50.0).allocate("n1", {}, fits)
    assert result is not None
    assert devices_of(result[0]) == [f"gpu-{i}" for i in range(16)]
    assert FILTER_TIMEOUT == 10.0, (
        "kube-scheduler 1.34's DynamicResourcesArgs.filterTimeout default"
    )


@pytest.mark.parametrize("kube_minor", [35, 36, 37])
def test_an_unmeetable_first_alternative_falls_through_from_1_36_and_times_out_before(
    kube_minor: int,
) -> None:
    """firstAvailable [11 of 10 devices, 2]: from 1.36 kube's search takes each request's
    next device after the last one taken (subsets: 2^10 steps to learn 11 do not fit), so
    the second alternative is reached and allocated; 1.35's walks the orders (10! steps)
    into its filter timeout, and the node does not fit (random differential, seed
    1715971532, c117: kube 1.37.2 bound it, Lattice did not)."""
    ticks = itertools.count()
    allocator = Allocator(
        classes={"gpu": DeviceClass.from_api(GPU_CLASS)},
        slices=SliceIndex([ResourceSlice.from_api(gpus("n1", 10))]),
        allocated=frozenset(),
        compiler=SelectorCompiler(),
        timeout=100.0,
        clock=lambda: float(next(ticks)),
        kube_minor=kube_minor,
    )
    subs = [("big", exactly("gpu", count=11)), ("two", exactly("gpu", count=2))]
    claims = [ResourceClaim.from_api(claim("c", first_available("gpu", *subs)))]
    if kube_minor == 35:
        with pytest.raises(NodeAllocationError, match="timed out"):
            allocator.allocate("n1", {}, claims)
        return
    result = allocator.allocate("n1", {}, claims)
    assert result is not None
    assert devices_of(result[0]) == ["gpu-0", "gpu-1"]
    assert [r["request"] for r in result[0]["devices"]["results"]] == ["gpu/two"] * 2
    assert next(ticks) < 100, "within the deadline"


def test_fewer_free_matching_devices_than_asked_does_not_fit_without_a_search() -> None:
    """16 of 16 devices with one taken (or 17, or 9 of the 8 a selector accepts): kube
    walks orders until its 10 s filter timeout, holding its loop; counting the free devices
    the selectors accept gives the same 'does not fit' at once (the clock is read once, for
    the deadline). Where a selector fails at runtime on a free device the search decides,
    as kube's may reach it: an error."""
    calls = 0

    def clock() -> float:
        nonlocal calls
        calls += 1
        return float(calls)

    def make(slices: list[dict[str, Any]], used: frozenset[DeviceId]) -> Allocator:
        return Allocator(
            classes={"gpu": DeviceClass.from_api(GPU_CLASS)},
            slices=SliceIndex([ResourceSlice.from_api(b) for b in slices]),
            allocated=used,
            compiler=SelectorCompiler(),
            timeout=5.0,
            clock=clock,
        )

    one_taken = frozenset({DeviceId(GPU_DRIVER, "n1", "gpu-0")})
    for count, used, selectors in [
        (16, one_taken, ()),
        (17, frozenset[DeviceId](), ()),
        (9, frozenset[DeviceId](), (f'device.attributes["{GPU_DRIVER}"].numa < 2',)),
    ]:
        calls = 0
        ask = exactly("gpu", *selectors, count=count)
        claims = [ResourceClaim.from_api(claim("c", request("gpu", ask)))]
        assert make([gpus("n1", 16)], used).allocate("n1", {}, claims) is None
        assert calls == 1, (count, "the search ran")
    # gpu-15 lacks "numa": the selector fails at runtime on it, as kube's search would find.
    odd = gpus("n1", 16)
    del odd["spec"]["devices"][15]["attributes"]["numa"]
    ask = exactly("gpu", f'device.attributes["{GPU_DRIVER}"].numa < 2', count=9)
    with pytest.raises(AllocationError, match="runtime error"):
        make([odd], frozenset()).allocate(
            "n1", {}, [ResourceClaim.from_api(claim("c", request("gpu", ask)))]
        )


def test_requests_that_fit_alone_but_not_together_do_not_fit_without_a_search() -> None:
    """16 + 2 on 16 devices, in either claim order (the random differential, seed
    977507055, c213: kube 1.37.2 said Unschedulable at once; Lattice's search of the
    subsets ran past its 10 s budget under CI load), 9 + 9, and sets of requests that ask
    more of the devices their selectors share than there are: the sets of requests are
    counted against the free devices they accept together (Hall's condition), so no search
    runs. Where the requests fit together the search allocates as before."""
    calls = 0

    def clock() -> float:
        nonlocal calls
        calls += 1
        return float(calls)

    allocator = Allocator(
        classes={"gpu": DeviceClass.from_api(GPU_CLASS)},
        slices=SliceIndex([ResourceSlice.from_api(gpus("n1", 16))]),
        allocated=frozenset(),
        compiler=SelectorCompiler(),
        timeout=5.0,
        clock=clock,
    )
    numa0 = f'device.attributes["{GPU_DRIVER}"].numa == 0'

    def claims(*asks: dict[str, Any]) -> list[ResourceClaim]:
        return [
            ResourceClaim.from_api(claim(f"c{i}", request("gpu", ask)))
            for i, ask in enumerate(asks)
        ]

    for asks in [
        (exactly("gpu", count=16), exactly("gpu", count=2)),
        (exactly("gpu", count=2), exactly("gpu", count=16)),
        (exactly("gpu", count=9), exactly("gpu", count=9)),
        # Each alone fits and all three together have 16 devices; the first two ask 5 of
        # numa 0's 4.
        (exactly("gpu", count=1), exactly("gpu", numa0, count=3), exactly("gpu", numa0, count=2)),
        (exactly("gpu", numa0, count=3), exactly("gpu", numa0, count=2)),
    ]:
        calls = 0
        assert allocator.allocate("n1", {}, claims(*asks)) is None
        assert calls == 1, (asks, "the search ran")
    result = allocator.allocate(
        "n1", {}, claims(exactly("gpu", numa0, count=3), exactly("gpu", count=13))
    )
    assert result is not None
    assert [devices_of(r) for r in result] == [
        ["gpu-0", "gpu-1", "gpu-2"],
        [f"gpu-{i}" for i in range(3, 16)],
    ]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 4), st.frozensets(st.integers(0, 7), max_size=8)),
        min_size=1,
        max_size=5,
    )
)
def test_the_joint_count_check_is_exactly_a_matching(
    requests: list[tuple[int, frozenset[int]]],
) -> None:
    """``_hall_violated`` says short exactly when no assignment gives every request its
    count of devices it accepts, no device twice (a max flow decides it independently)."""
    graph = nx.DiGraph()
    for i, (count, wanted) in enumerate(requests):
        graph.add_edge("s", ("r", i), capacity=count)
        for d in wanted:
            graph.add_edge(("r", i), ("d", d), capacity=1)
            graph.add_edge(("d", d), "t", capacity=1)
    graph.add_nodes_from(["s", "t"])
    flow = nx.maximum_flow_value(graph, "s", "t")
    counts = [c for c, _ in requests]
    accepted = [frozenset(DeviceId(GPU_DRIVER, "n1", f"gpu-{d}") for d in a) for _, a in requests]
    assert _hall_violated(counts, accepted) == (flow < sum(counts))
