"""Bad input never stops the scheduler: a broken spec keeps the old settings, a broken
pod waits in the queue with its error."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.control.queue import QueueName, pod_key
from scheduler.control.queued import BrokenPod
from scheduler.control.scheduler import Scheduler
from scheduler.control.settings import SettingsError, default_spec, parse_spec
from scheduler.core.profile import GpuPolicy, ScoringStrategy
from scheduler.obs.metrics import Metrics
from tests.builders import make_node, make_pod


def test_default_spec_round_trips() -> None:
    settings = parse_spec(default_spec("lattice"), "lattice")
    assert settings.bind_concurrency == 64
    assert dict(settings.profile.scores)["TaintToleration"] == 3


def test_gang_settings_round_trip() -> None:
    spec = {"gang": {"solver": "Greedy", "partialBoostSeconds": 5}}
    assert parse_spec(spec, "lattice").gang.partial_boost_s == 5
    default = default_spec("lattice")
    assert default["gang"]["partialBoostSeconds"] == 60
    assert parse_spec(default, "lattice").gang.partial_boost_s == 60


def test_topology_levels_round_trip() -> None:
    levels = ["example.com/block", "example.com/rack", "kubernetes.io/hostname"]
    assert parse_spec({"topology": {"levels": levels}}, "lattice").topology.levels == tuple(levels)
    default = default_spec("lattice")
    assert default["topology"] == {"levels": []}
    assert parse_spec(default, "lattice").topology.levels == ()
    assert parse_spec({"topology": {}}, "lattice").topology.levels == ()


def test_topology_from_kueue_names_the_topology_and_leaves_levels_to_it() -> None:
    """The default object's empty ``levels`` beside ``fromKueue`` is not a conflict: only
    levels given in both places are."""
    for spec in ({"fromKueue": "net"}, {"fromKueue": "net", "levels": []}):
        topology = parse_spec({"topology": spec}, "lattice").topology
        assert (topology.from_kueue, topology.levels) == ("net", ())
    assert parse_spec({"topology": {"fromKueue": None}}, "lattice").topology.from_kueue is None


def test_plugins_are_applied() -> None:
    spec = {
        "plugins": [
            {"name": "NodeResourcesFit", "weight": 5, "args": {"scoringStrategy": "MostAllocated"}},
            {"name": "NodePorts", "enabled": False},
        ]
    }
    settings = parse_spec(spec, "lattice")
    assert dict(settings.profile.scores)["NodeResourcesFit"] == 5
    assert settings.profile.node_resources_fit.strategy is ScoringStrategy.MOST_ALLOCATED
    assert "NodePorts" not in settings.profile.filters


def test_dynamic_resources_scores_with_kubes_weight_unless_told() -> None:
    """Weight 2 as kube-scheduler 1.35+; a weight changes it, 0 keeps the filter only,
    disabling drops both."""
    assert dict(parse_spec({}, "lattice").profile.scores)["DynamicResources"] == 2
    assert {"name": "DynamicResources", "enabled": True, "weight": 2} in default_spec("lattice")[
        "plugins"
    ]

    def dra(item: dict[str, Any]) -> tuple[int | None, bool]:
        profile = parse_spec({"plugins": [{"name": "DynamicResources", **item}]}, "lattice").profile
        return dict(profile.scores).get("DynamicResources"), "DynamicResources" in profile.filters

    assert dra({"weight": 4}) == (4, True)
    assert dra({"weight": 0}) == (None, True)
    assert dra({"enabled": False}) == (None, False)


def test_gpu_placement_is_applied_live() -> None:
    default = parse_spec(default_spec("lattice"), "lattice")
    assert default.profile.gpu_placement.policy is GpuPolicy.FRAGMENTATION
    spec = {"gpuPlacement": {"policy": "MostAllocated", "resources": ["example.com/xpu"]}}
    settings = parse_spec(spec, "lattice")
    assert settings.profile.gpu_placement.policy is GpuPolicy.MOST_ALLOCATED
    assert settings.profile.gpu_placement.resources == ("example.com/xpu",)
    sched = Scheduler(default, writer=None, metrics=Metrics.create())
    assert "nvidia.com/gpu" in sched.cache.topology.gpu_demand.resources
    sched.apply_settings(settings)
    assert sched.cache.topology.gpu_demand.resources == ("example.com/xpu",)
    assert sched.framework.profile.gpu_placement.policy is GpuPolicy.MOST_ALLOCATED


def test_pending_gpu_pods_feed_the_request_mix() -> None:
    sched = Scheduler(parse_spec({}, "lattice"), writer=None, metrics=Metrics.create())
    body = make_pod("job", cpu="8", resources={"nvidia.com/gpu": "8"}).obj()
    body["spec"]["schedulerName"] = "lattice"
    sched.pod_upserted(body)
    demand = sched.cache.topology.gpu_demand
    assert demand.arrivals == 1
    assert {c.gpus: c.share for c in demand.classes()}[8] > 0.5
    sched.pod_deleted(body)
    assert {c.gpus: c.share for c in demand.classes()}[8] < 0.5


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        pytest.param({"gpuPlacement": {"policy": "Random"}}, "gpuPlacement.policy", id="policy"),
        pytest.param({"gpuPlacement": {"resources": []}}, "gpuPlacement.resources", id="empty"),
        pytest.param({"gpuPlacement": {"resources": ["gpu"]}}, "domain/name", id="unqualified"),
        pytest.param({"gpuPlacement": {"typo": 1}}, "unknown key 'typo'", id="unknown-key"),
        pytest.param({"gpuPlacement": "Fragmentation"}, "must be an object", id="not-object"),
        pytest.param({"plugins": [{"name": "Nope"}]}, "unknown plugin 'Nope'", id="unknown"),
        pytest.param({"plugins": [{"name": "NodeAffinity", "weight": 500}]}, "weight", id="weight"),
        pytest.param(
            {"plugins": [{"name": "NodePorts", "weight": 3}]}, "does not score", id="no-score"
        ),
        pytest.param({"bindConcurrency": 0}, "bindConcurrency", id="concurrency"),
        pytest.param({"gang": {"partialBoostSeconds": -1}}, "partialBoostSeconds", id="boost"),
        pytest.param({"gang": {"partialBoostSeconds": 1.5}}, "partialBoostSeconds", id="boost-f"),
        pytest.param({"clientQPS": "fast"}, "clientQPS", id="qps"),
        pytest.param({"topology": ["rack"]}, "spec.topology must be", id="topo-list"),
        pytest.param({"topology": {"levels": "rack"}}, "levels: 'rack' is not a list", id="lv"),
        pytest.param(
            {"topology": {"levels": ["rack", "bad key"]}}, r"levels\[1\]: 'bad key'", id="key"
        ),
        pytest.param({"topology": {"levels": ["a", "a"]}}, "listed twice", id="twice"),
        pytest.param({"topology": {"levels": [3]}}, "not a node label key", id="int"),
        pytest.param({"topology": {"levels": [f"l{i}" for i in range(9)]}}, "at most", id="many"),
        pytest.param({"topology": {"fromkueue": "t"}}, "unknown key 'fromkueue'", id="typo"),
        pytest.param(
            {"topology": {"levels": ["rack"], "fromKueue": "t"}},
            "levels and fromKueue are both set",
            id="kueue-and-levels",
        ),
        pytest.param({"topology": {"fromKueue": "Net_1"}}, "fromKueue: 'Net_1'", id="kueue-name"),
        pytest.param({"topology": {"fromKueue": ""}}, "must be non-empty", id="kueue-empty"),
        pytest.param({"topology": {"fromKueue": 7}}, "not a string", id="kueue-int"),
        pytest.param({"schedulerName": "other"}, "differs", id="name"),
        pytest.param(
            {"plugins": [{"name": "NodeResourcesFit", "args": {"scoringStrategy": "Random"}}]},
            "scoringStrategy",
            id="strategy",
        ),
    ],
)
def test_invalid_specs_say_why(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        parse_spec(spec, "lattice")


def test_unparsable_pod_waits_with_its_error() -> None:
    sched = Scheduler(parse_spec({}, "lattice"), writer=None, metrics=Metrics.create())
    sched.node_upserted(make_node("n1").obj())
    body = make_pod("bad", "1").obj()
    body["spec"]["schedulerName"] = "lattice"
    body["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "lots"
    sched.pod_upserted(body)
    info = sched.queue.try_pop()
    assert info is not None
    assert isinstance(info.pod, BrokenPod)
    assert "lots" in info.pod.error
    sched.schedule_one(info)  # no exception: it is reported and backs off
    # An error, not Unschedulable: no cluster event would wake it, so it retries on backoff.
    assert sched.queue.where(pod_key("default", "bad")) is QueueName.BACKOFF
    assert sched.counters.errors == 1


def test_gpu_gauges_count_stranded_gpus() -> None:
    """Two GPUs left on a node whose cpu is gone are stranded; a whole free node is not."""
    sched = Scheduler(parse_spec({}, "lattice"), writer=None, metrics=Metrics.create())
    for name in ("full", "whole"):
        sched.node_upserted(
            make_node(name, cpu="16", memory="64Gi").allocatable(**{"nvidia.com/gpu": 8}).obj()
        )
    hog = make_pod("hog", cpu="16", resources={"nvidia.com/gpu": "6"}).obj()
    hog["spec"]["nodeName"] = "full"
    sched.pod_upserted(hog)
    for i in range(50):  # the mix: 2-GPU pods that bring 4 cores each
        sched.cache.topology.gpu_demand.observe(
            make_pod(f"seen{i}", cpu="4", resources={"nvidia.com/gpu": "2"}).build()
        )
    sched.set_gpu_gauges()
    registry = sched.metrics.registry

    def value(state: str) -> float | None:
        return registry.get_sample_value("lattice_gpu_devices", {"state": state})

    assert value("allocatable") == 16
    assert value("free") == 10
    assert value("stranded") == 2


def test_dra_node_selector_is_parsed_and_bad_ones_say_why() -> None:
    default = parse_spec(default_spec("lattice"), "lattice")
    assert default.profile.dynamic_resources.node_selector.is_empty
    spec = {"dra": {"nodeSelector": {"matchLabels": {"pool": "lattice"}}}}
    selector = parse_spec(spec, "lattice").profile.dynamic_resources.node_selector
    assert selector.matches({"pool": "lattice"})
    assert not selector.matches({"pool": "kube"})
    cases: list[tuple[dict[str, Any], str]] = [
        ({"dra": "x"}, "spec.dra must be an object"),
        ({"dra": {"nodeSelectr": {}}}, "unknown key 'nodeSelectr'"),
        ({"dra": {"nodeSelector": {"matchExpressions": [{"key": "a", "operator": "Gt"}]}}}, "Gt"),
    ]
    for bad, message in cases:
        with pytest.raises(SettingsError, match=message):
            parse_spec(bad, "lattice")
