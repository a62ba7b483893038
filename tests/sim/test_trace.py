"""Trace loaders: Alibaba's CSVs and kubectl dumps become the core's own records."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler.model.selectors import Operator
from scheduler.sim.trace import GPU_MODEL_LABEL, TraceError, load_alibaba, load_dump
from tests.sim.traces import (
    DEFAULT_HEADER,
    MULTIGPU_HEADER,
    NODES_HEADER,
    TINY_NODES,
    TINY_TASKS,
    node_item,
    pod_item,
    tiny,
    write_csv,
    write_dump,
)

GPU = "nvidia.com/gpu"


def test_alibaba_nodes_are_api_nodes_with_gpus_and_model_label(tmp_path: Path) -> None:
    trace = load_alibaba(*tiny(tmp_path))
    assert [n.name for n in trace.nodes] == ["node-a", "node-b", "node-c"]
    a, _, c = trace.nodes
    assert a.allocatable["cpu"] == 64000
    assert a.allocatable["memory"] == 262144 * 2**20
    assert a.allocatable[GPU] == 8
    assert a.allocatable["pods"] == 1000
    assert c.allocatable[GPU] == 2
    assert a.labels == {"kubernetes.io/hostname": "node-a", GPU_MODEL_LABEL: "V100M32"}
    assert c.labels[GPU_MODEL_LABEL] == "T4"
    assert trace.gpus == 18
    assert trace.placed == []
    assert trace.name == "tasks"


def test_alibaba_tasks_skip_gpu_sharing_and_keep_times(tmp_path: Path) -> None:
    trace = load_alibaba(*tiny(tmp_path))
    assert trace.skipped == 1
    assert [t.pod.name for t in trace.tasks] == ["task-0", "task-2", "task-3", "task-4", "task-5"]
    assert [t.gpus for t in trace.tasks] == [1, 2, 0, 8, 4]
    assert [t.created for t in trace.tasks] == [0, 20, 30, 40, 50]
    assert [t.deleted for t in trace.tasks] == [100, None, 90, 200, 300]
    first = trace.tasks[0].pod
    assert first.scheduler_name == "lattice"
    assert first.resources.requests["cpu"] == 8000
    assert first.resources.requests["memory"] == 32768 * 2**20
    assert first.resources.requests[GPU] == 1
    assert GPU not in trace.tasks[2].pod.resources.requests
    assert len({t.pod.uid for t in trace.tasks}) == len(trace.tasks)
    assert all(t.pod.uid for t in trace.tasks)


def test_gpu_spec_becomes_required_node_affinity(tmp_path: Path) -> None:
    trace = load_alibaba(*tiny(tmp_path))
    by_name = {t.pod.name: t.pod for t in trace.tasks}
    assert by_name["task-0"].required_node_affinity is None
    selector = by_name["task-2"].required_node_affinity
    assert selector is not None
    (term,) = selector.terms
    (req,) = term.match_expressions
    assert (req.key, req.operator, tuple(req.values)) == (
        GPU_MODEL_LABEL,
        Operator.IN,
        ("T4", "P100"),
    )
    selector = by_name["task-5"].required_node_affinity
    assert selector is not None
    assert tuple(selector.terms[0].match_expressions[0].values) == ("V100M32",)


def test_multigpu_list_has_no_times(tmp_path: Path) -> None:
    nodes = write_csv(tmp_path / "n.csv", NODES_HEADER, TINY_NODES)
    tasks = write_csv(
        tmp_path / "multigpu40.csv",
        MULTIGPU_HEADER,
        ["t0,1000,1024,2,1000", "t1,1000,1024,1,500", "t2,500,512,0,0"],
    )
    trace = load_alibaba(nodes, tasks)
    assert [(t.pod.name, t.gpus, t.created, t.deleted) for t in trace.tasks] == [
        ("t0", 2, None, None),
        ("t2", 0, None, None),
    ]
    assert trace.skipped == 1


@pytest.mark.parametrize(
    ("which", "header", "rows", "expected"),
    [
        ("tasks", "name,cpu_milli,memory_mib,num_gpu", ["t,1,1,0"], "tasks.csv:1: missing column"),
        (
            "tasks",
            DEFAULT_HEADER,
            [*TINY_TASKS[:2], "t,abc,1,0,0,,,,,,"],
            "tasks.csv:4: column 'cpu_milli': not an integer: 'abc'",
        ),
        (
            "tasks",
            DEFAULT_HEADER,
            ["t,1,1,1.5,1000,,,,,,"],
            "tasks.csv:2: column 'num_gpu': not an integer: '1.5'",
        ),
        (
            "tasks",
            DEFAULT_HEADER,
            ["t,1,-4,0,0,,,,,,"],
            "tasks.csv:2: column 'memory_mib': must not be negative",
        ),
        ("tasks", DEFAULT_HEADER, ["t,1,1,0"], "tasks.csv:2: column 'gpu_milli': missing value"),
        (
            "tasks",
            DEFAULT_HEADER,
            ["t,1,1,0,0,,,,soon,,"],
            "tasks.csv:2: column 'creation_time': not a number",
        ),
        ("nodes", NODES_HEADER, ["n,1,1,x,T4"], "nodes.csv:2: column 'gpu': not an integer: 'x'"),
        (
            "nodes",
            NODES_HEADER,
            ["n,1,1,1,T4", "n,1,1,1,T4"],
            "nodes.csv:3: column 'sn': node 'n' already on line 2",
        ),
        (
            "nodes",
            "sn,cpu_milli,memory_mib,gpu",
            ["n,1,1,1"],
            "nodes.csv:1: missing column(s) model",
        ),
        (
            "nodes",
            NODES_HEADER,
            ["n,1,1,1,not a label!"],
            "nodes.csv:2: column 'model': 'not a label!' is not a label value",
        ),
        (
            "tasks",
            DEFAULT_HEADER,
            ["t,1,1,1,1000,T4|A 10,,,,,"],
            "tasks.csv:2: column 'gpu_spec': 'A 10' is not a label value",
        ),
    ],
)
def test_bad_csv_is_one_line_naming_file_line_and_column(
    tmp_path: Path, which: str, header: str, rows: list[str], expected: str
) -> None:
    nodes, tasks = tiny(tmp_path)
    write_csv(nodes if which == "nodes" else tasks, header, rows)
    with pytest.raises(TraceError) as info:
        load_alibaba(nodes, tasks)
    message = str(info.value)
    assert expected in message
    assert str(tmp_path) in message
    assert "\n" not in message


def test_missing_file_is_a_trace_error(tmp_path: Path) -> None:
    nodes, _ = tiny(tmp_path)
    with pytest.raises(TraceError, match=r"absent\.csv: cannot read"):
        load_alibaba(nodes, tmp_path / "absent.csv")


def test_empty_file_names_the_expected_header(tmp_path: Path) -> None:
    nodes, tasks = tiny(tmp_path)
    tasks.write_text("")
    with pytest.raises(TraceError, match="empty file, expected a header name,cpu_milli"):
        load_alibaba(nodes, tasks)


def test_dump_splits_placed_pods_from_arrivals_in_creation_order(tmp_path: Path) -> None:
    path = write_dump(
        tmp_path / "cluster.json",
        [
            node_item("n1", gpus=8),
            node_item("n2"),
            pod_item("running", node="n1", gpus=4, phase="Running"),
            pod_item("late", created="2024-05-01T11:00:00Z", gpus=2),
            pod_item("b-early", created="2024-05-01T10:00:00Z"),
            pod_item("a-early", created="2024-05-01T10:00:00Z", gpus=1),
            pod_item("done", node="n2", phase="Succeeded"),
            pod_item("failed", phase="Failed"),
            pod_item("going", node="n1", gpus=4, deleting=True),
            {"kind": "Service", "metadata": {"name": "ignored"}},
        ],
    )
    trace = load_dump(path)
    assert [n.name for n in trace.nodes] == ["n1", "n2"]
    assert [(p.name, node) for p, node in trace.placed] == [("running", "n1")]
    assert [t.pod.name for t in trace.tasks] == ["a-early", "b-early", "late"]
    assert [t.gpus for t in trace.tasks] == [1, 0, 2]
    created = [t.created for t in trace.tasks]
    assert created[0] == created[1] is not None
    assert created[2] == pytest.approx(created[0] + 3600)  # type: ignore[operator]
    assert all(t.deleted is None for t in trace.tasks)
    assert (trace.skipped, trace.gpus, trace.name) == (0, 8, "cluster")


def test_dump_of_one_kind_infers_the_items_kind(tmp_path: Path) -> None:
    path = tmp_path / "nodes.json"
    item = node_item("n1", gpus=2)
    del item["kind"]
    path.write_text(f'{{"kind": "NodeList", "items": [{__import__("json").dumps(item)}]}}')
    assert [n.name for n in load_dump(path).nodes] == ["n1"]


def test_dump_errors_name_the_place(tmp_path: Path) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text('{"kind": "List",\n "items": [}')
    with pytest.raises(TraceError, match=r"broken\.json:2:\d+: not JSON"):
        load_dump(broken)
    bad_pod = pod_item("p")
    bad_pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "lots"
    path = write_dump(tmp_path / "bad.json", [node_item("n1"), bad_pod])
    with pytest.raises(TraceError, match=r"bad\.json: items\[1\] \(Pod p\): invalid .*cpu"):
        load_dump(path)
    not_list = tmp_path / "pod.json"
    not_list.write_text('{"kind": "Pod"}')
    with pytest.raises(TraceError, match="expected a List"):
        load_dump(not_list)
