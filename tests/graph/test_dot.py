"""DOT export and the neighbourhoods that explain a placement."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from scheduler.graph.affinity import AffinityGraph
from scheduler.graph.cli import graph_from_api, render
from scheduler.graph.dot import namespace_view, pod_view, to_dot
from scheduler.graph.indexes import domain_vid, namespace_vid, node_vid, pod_vid
from scheduler.model.names import LABEL_HOSTNAME
from tests.builders import make_namespace, make_node, make_pod


def small_cluster() -> AffinityGraph:
    graph = AffinityGraph()
    graph.on_namespace(make_namespace("default", team="a"))
    for i in range(4):
        graph.on_node_upserted(make_node(f"n{i}", zone=f"z{i % 2}", rack="r1").build())
    for i in range(3):
        web = make_pod(f"web-{i}").uid(f"web-{i}").label("app", "web")
        graph.on_pod_placed(web.pod_anti_affinity("zone", {"app": "web"}).build(), f"n{i}")
    graph.on_pod_placed(make_pod("db").uid("db").label("app", "db").build(), "n3")
    other = make_pod("lonely", namespace="other").uid("lonely").label("app", "x").build()
    graph.on_pod_placed(other, "n3")
    pending = make_pod('we"ird').uid("pending").pod_affinity("zone", {"app": "db"}, weight=5)
    graph.on_pod_pending(pending.build())
    return graph


def edges_of(dot: str) -> set[tuple[str, str]]:
    return set(re.findall(r'^  "([^"]+)" -> "([^"]+)"', dot, flags=re.MULTILINE))


def test_whole_graph_is_valid_deterministic_dot() -> None:
    graph = small_cluster()
    dot = to_dot(graph.graph)
    assert dot == to_dot(graph.graph)
    assert dot.startswith('digraph "lattice" {')
    assert dot.rstrip().endswith("}")
    assert '\\"' in dot  # the pod name's quote is escaped
    assert (pod_vid("web-0"), node_vid("n0")) in edges_of(dot)
    assert dot.count(" -> ") == graph.graph.number_of_edges()
    assert 'label="preferred-affinity w=5"' in dot


def test_pod_view_walks_terms_to_the_pods_and_domains_they_involve() -> None:
    graph = small_cluster()
    view = pod_view(graph, pod_vid("web-0"), depth=2)
    term = next(t for t in graph.indexes.terms if "app in (web)" in t)
    assert {pod_vid("web-0"), pod_vid("web-1"), pod_vid("web-2"), term} <= view.vertices
    assert node_vid("n0") in view.vertices
    assert namespace_vid("default") in view.vertices
    # Zone domains explain the anti-affinity; rack and hostname domains do not.
    assert domain_vid("zone", "z0") in view.vertices
    assert domain_vid("rack", "r1") not in view.vertices
    assert domain_vid(LABEL_HOSTNAME, "n0") not in view.vertices
    assert pod_vid("lonely") not in view.vertices
    assert node_vid("n1") in view.vertices  # where the other replicas run explains it
    assert domain_vid("zone", "z1") in view.vertices
    shallow = pod_view(graph, pod_vid("web-0"), depth=1)
    assert pod_vid("web-1") not in shallow.vertices


def test_pod_view_caps_fan_out() -> None:
    graph = small_cluster()
    view = pod_view(graph, pod_vid("web-0"), depth=2, max_fanout=1)
    term = next(t for t in graph.indexes.terms if "app in (web)" in t)
    assert view.truncated
    dot = to_dot(graph.graph, view.vertices, truncated=view.truncated)
    assert "more" in dot
    with pytest.raises(LookupError):
        pod_view(graph, pod_vid("nope"))
    assert term in pod_view(graph, pod_vid("web-0"), depth=1, max_fanout=5).vertices


def test_namespace_view() -> None:
    graph = small_cluster()
    view = namespace_view(graph, "other")
    assert view.vertices == {pod_vid("lonely"), node_vid("n3")}
    view = namespace_view(graph, "default")
    assert pod_vid("pending") in view.vertices
    assert pod_vid("db") in view.vertices
    assert pod_vid("lonely") not in view.vertices


def test_render_selects_by_flags() -> None:
    graph = small_cluster()
    assert render(graph) == to_dot(graph.graph)
    one = render(graph, pod="default/web-1", depth=1)
    assert pod_vid("web-1") in one
    assert pod_vid("db") not in one
    assert pod_vid("db") in render(graph, namespace="default")
    with pytest.raises(ValueError, match="NAMESPACE/POD"):
        render(graph, pod="web-1")
    with pytest.raises(LookupError):
        render(graph, pod="default/missing")


def test_graph_from_raw_api_lists() -> None:
    nodes = [make_node("n0", zone="z0").obj(), {"metadata": {}}]
    bound = make_pod("a").label("app", "web").node_name("n0").obj()
    pending = make_pod("b").pod_anti_affinity("zone", {"app": "web"}).obj()
    done = make_pod("c").node_name("n0").obj()
    done["status"] = {"phase": "Succeeded"}
    broken = make_pod("d").obj()
    broken["spec"]["tolerations"] = [{"operator": "Sometimes"}]
    graph, skipped = graph_from_api(
        nodes, [bound, pending, done, broken], [{"metadata": {"name": "default"}}]
    )
    assert len(skipped) == 2
    assert skipped[0].startswith("node/")
    assert graph.find_pod("default", "a") is not None
    assert graph.find_pod("default", "b") is not None
    assert graph.find_pod("default", "c") is None
    term = next(iter(graph.indexes.terms))
    assert dict(graph.indexes.match_domain[term]) == {"z0": 1}


def test_graph_package_does_no_io() -> None:
    code = (
        "import sys\n"
        "import scheduler.graph, scheduler.graph.dot, lattice_dev.graph.bench\n"
        "bad = [m for m in sys.modules if m.startswith(('kubernetes_asyncio', 'kopf', "
        "'aiohttp', 'scheduler.control', 'lattice_dev.devcluster'))]\n"
        "print(','.join(sorted(bad)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == ""
