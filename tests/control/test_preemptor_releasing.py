"""A preemptor whose victims went but whose devices are not yet released keeps waiting
(nominated) instead of finding no victim, losing its nomination and the devices' hold."""

from __future__ import annotations

import structlog

from scheduler.control.preemptor import Preemptor


def preemptor() -> Preemptor:
    return Preemptor(
        writer=None, reporter=None, scheduler_name=lambda: "lattice", log=structlog.get_logger()
    )


def test_a_victim_gone_with_its_claim_still_allocated_keeps_the_preemptor_waiting() -> None:
    p = preemptor()
    p.evicting_for(["high"], ["low"])
    assert p.still_evicting("high")
    p.forget_pod("low")  # the victim's pod is gone; its claim is deallocated a moment later
    assert not p.still_evicting("high")
    held = {"low"}
    assert p.releasing_devices("high", held.__contains__)
    held.clear()  # the resourceclaim controller deallocated it
    assert not p.releasing_devices("high", held.__contains__)
    assert "high" not in p.releasing


def test_a_failed_eviction_does_not_make_the_preemptor_wait() -> None:
    """The victim stays and keeps its devices: the preemptor may try again, as in kube."""
    p = preemptor()
    p.evicting_for(["high"], ["low"])
    p.victim_going("low")  # the eviction failed
    assert not p.releasing_devices("high", lambda _: True)


def test_the_wait_ends_when_the_preemptor_is_placed_or_gone() -> None:
    p = preemptor()
    p.evicting_for(["high", "other"], ["low"])
    p.forget_pod("low")
    p.pod_bound("high")
    p.forget_pod("other")
    assert p.releasing == {}
