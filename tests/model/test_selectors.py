"""Label and node selector parsing (apimachinery validation) and matching."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.model.errors import InvalidObjectError
from scheduler.model.selectors import LabelSelector, NodeSelector, Requirement
from tests.builders import expr

LABELS = {"zone": "a", "gen": "5", "bad-int": "x1", "empty": ""}


@pytest.mark.parametrize(
    ("requirement", "matches"),
    [
        pytest.param(expr("zone", "In", "a", "b"), True, id="in-hit"),
        pytest.param(expr("zone", "In", "b"), False, id="in-miss"),
        pytest.param(expr("missing", "In", "a"), False, id="in-absent"),
        pytest.param(expr("zone", "NotIn", "a"), False, id="notin-hit"),
        pytest.param(expr("zone", "NotIn", "b"), True, id="notin-miss"),
        pytest.param(expr("missing", "NotIn", "a"), True, id="notin-absent"),
        pytest.param(expr("zone", "Exists"), True, id="exists"),
        pytest.param(expr("missing", "Exists"), False, id="exists-absent"),
        pytest.param(expr("empty", "Exists"), True, id="exists-empty-value"),
        pytest.param(expr("zone", "DoesNotExist"), False, id="dne"),
        pytest.param(expr("missing", "DoesNotExist"), True, id="dne-absent"),
        pytest.param(expr("gen", "Gt", "4"), True, id="gt"),
        pytest.param(expr("gen", "Gt", "5"), False, id="gt-equal"),
        pytest.param(expr("gen", "Lt", "6"), True, id="lt"),
        pytest.param(expr("gen", "Lt", "0"), False, id="lt-zero"),
        pytest.param(expr("bad-int", "Gt", "0"), False, id="gt-label-not-int"),
        pytest.param(expr("missing", "Lt", "10"), False, id="lt-absent"),
    ],
)
def test_requirement_matching(requirement: dict[str, Any], matches: bool) -> None:
    req = Requirement.build(
        requirement["key"], requirement["operator"], requirement.get("values"), field="expr"
    )
    assert req.matches(LABELS) is matches


@pytest.mark.parametrize(
    ("requirement", "message"),
    [
        pytest.param(expr("zone", "Equals", "a"), "not a valid selector operator", id="bad-op"),
        pytest.param(expr("zone", "In"), "values set can't be empty", id="in-no-values"),
        pytest.param(expr("zone", "Exists", "a"), "values set must be empty", id="exists-values"),
        pytest.param(expr("gen", "Gt", "1", "2"), "exactly one value", id="gt-two-values"),
        pytest.param(expr("gen", "Gt", "1.5"), "must be an integer", id="gt-float"),
        pytest.param(expr("gen", "Lt", "ten"), "must be an integer", id="lt-word"),
        pytest.param(expr("gen", "Gt", "99999999999999999999"), "integer", id="gt-overflow"),
        # Like Go, Gt/Lt values must also be label values, so negatives are refused.
        pytest.param(expr("gen", "Gt", "-1"), "valid label value", id="gt-negative"),
        pytest.param(expr("bad key!", "Exists"), "name part must consist", id="bad-key"),
        pytest.param(expr("zone", "In", "not ok"), "valid label value", id="bad-value"),
        pytest.param(
            {"key": 3, "operator": "In", "values": ["a"]}, "must be a string", id="key-type"
        ),
    ],
)
def test_malformed_requirement_raises(requirement: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidObjectError, match=message):
        Requirement.build(
            requirement["key"], requirement["operator"], requirement.get("values"), field="expr"
        )


def test_label_selector_nil_empty_and_requirements() -> None:
    nothing = LabelSelector.from_api(None, field="s")
    everything = LabelSelector.from_api({}, field="s")
    assert not nothing.matches(LABELS)
    assert not nothing.is_empty
    assert everything.matches(LABELS)
    assert everything.is_empty
    both = LabelSelector.from_api(
        {"matchLabels": {"zone": "a"}, "matchExpressions": [expr("gen", "Exists")]}, field="s"
    )
    assert both.matches(LABELS)
    assert not both.matches({"zone": "a"})


def test_label_selector_refuses_gt() -> None:
    # metav1.LabelSelector only knows In/NotIn/Exists/DoesNotExist.
    with pytest.raises(InvalidObjectError, match="not a valid selector operator"):
        LabelSelector.from_api({"matchExpressions": [expr("gen", "Gt", "1")]}, field="s")


def test_node_selector_terms_are_ored_and_empty_terms_dropped() -> None:
    ns = NodeSelector.from_api(
        {
            "nodeSelectorTerms": [
                {},
                {"matchExpressions": [expr("zone", "In", "b")]},
                {"matchFields": [expr("metadata.name", "In", "n1")]},
            ]
        },
        field="t",
    )
    assert len(ns.terms) == 2
    assert ns.has_empty_term
    assert ns.matches({"zone": "b"}, "other")
    assert ns.matches({}, "n1")
    assert not ns.matches({"zone": "a"}, "n2")


def test_node_selector_without_terms_matches_nothing() -> None:
    ns = NodeSelector.from_api({"nodeSelectorTerms": [{}]}, field="t")
    assert not ns.matches({"zone": "a"}, "n1")


@pytest.mark.parametrize(
    ("field", "message"),
    [
        pytest.param(expr("metadata.name", "In", "a", "b"), "must have one element", id="two"),
        pytest.param(expr("metadata.name", "Exists"), "field selector operator", id="exists"),
    ],
)
def test_match_fields_validation(field: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidObjectError, match=message):
        NodeSelector.from_api({"nodeSelectorTerms": [{"matchFields": [field]}]}, field="t")
