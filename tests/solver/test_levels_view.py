"""``lattice explain --gang``'s per-level view: each domain's room against the gang's need,
the domains chosen, the ones refused and by how much, and the slices, checked against
figures worked out here from the node layout alone."""

from __future__ import annotations

from scheduler.solver.levels_view import level_views, slice_views
from tests.solver.support import gang, plan_for
from tests.solver.test_topology_levels import BLOCK, LEVELS, RACK, gpu_members, racks


def test_a_required_rack_that_fits_nowhere_names_each_racks_shortfall() -> None:
    # 5 members x 4 GPUs: r11 and r12 have 8 GPUs (2 members), r21 8 GPUs too.
    layout = {"b1": {"r11": [8], "r12": [8]}, "b2": {"r21": [4, 4]}}
    snapshot, _ = racks(layout)
    spec = gang(min_member=5, topology_key=RACK)
    problem, plan = plan_for(snapshot, gpu_members(5, gpus=4), spec=spec, levels=LEVELS)
    assert not plan.admitted
    views = {v.key: v for v in level_views(problem, plan, snapshot, spec, LEVELS)}
    assert list(views) == list(LEVELS)
    rack = views[RACK]
    assert rack.role == "required"
    by_name = {d.name: d for d in rack.domains}
    assert set(by_name) == {"r11", "r12", "r21"}
    for d in by_name.values():
        assert (d.room, d.gpus_free, d.planned) == (2, 8, 0)
        assert d.verdict == (
            f"refused: holds 2 of 5 members (short 3); 8 of 20 GPUs free (short 12) in one {RACK}"
        )
    assert {d.name: d.nodes for d in rack.domains} == {"r11": 1, "r12": 1, "r21": 2}
    # A level the gang does not constrain: rooms only.
    assert {d.name: (d.room, d.verdict) for d in views[BLOCK].domains} == {
        "b1": (4, "unused"),
        "b2": (2, "unused"),
    }


def test_the_chosen_rack_and_the_ones_that_fit_but_were_not_taken() -> None:
    # 4 members x 2 GPUs: rA (16 GPUs) and rB (8) both hold it; rB, the tightest, is taken.
    layout = {"b1": {"rA": [8, 8], "rB": [4, 4]}, "b2": {"rC": [4]}}
    snapshot, rack_of = racks(layout)
    spec = gang(min_member=4, topology_key=RACK)
    problem, plan = plan_for(snapshot, gpu_members(4), spec=spec, levels=LEVELS)
    assert plan.admitted
    views = {v.key: v for v in level_views(problem, plan, snapshot, spec, LEVELS)}
    rack = views[RACK].domains
    assert rack[0].name == "rB"  # domains with members first
    assert {d.name: d.verdict for d in rack} == {
        "rB": "chosen: 4 members",
        "rA": "fits; not chosen",
        "rC": f"refused: holds 2 of 4 members (short 2); 4 of 8 GPUs free (short 4) in one {RACK}",
    }
    assert sum(d.planned for d in rack) == 4 == len(plan.placements)
    assert {d.name: d.planned for d in views[BLOCK].domains} == {"b1": 4, "b2": 0}
    assert {rack_of[n] for _, n in plan.placements} == {"rB"}


def test_slices_name_their_domain_and_members() -> None:
    layout = {"b1": {"r11": [8], "r12": [8]}}
    snapshot, rack_of = racks(layout)
    spec = gang(min_member=4, slice_size=2, slice_key=RACK)
    problem, plan = plan_for(snapshot, gpu_members(4, gpus=4), spec=spec, levels=LEVELS)
    assert plan.admitted
    slices = slice_views(problem, plan, snapshot)
    assert len(slices) == 2
    node_of = {problem.members[i]: n for i, n in plan.placements}
    for s in slices:
        assert len(s.members) == 2
        assert {f"{RACK}={rack_of[node_of[m]]}" for m in s.members} == {s.domain}
    assert {s.domain for s in slices} == {f"{RACK}=r11", f"{RACK}=r12"}
    assert {v.key: v.role for v in level_views(problem, plan, snapshot, spec, LEVELS)}[RACK] == (
        "slices"
    )
