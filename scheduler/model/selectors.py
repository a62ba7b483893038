"""Label selectors and node selectors with apimachinery semantics.

Three shapes appear in pods:

* ``metav1.LabelSelector`` (pod affinity terms, topology spread): ``None`` selects nothing,
  ``{}`` selects everything, otherwise matchLabels AND matchExpressions (In, NotIn, Exists,
  DoesNotExist). See ``LabelSelectorAsSelector``.
* ``v1.NodeSelector`` (required node affinity): OR over terms, each term ANDs label
  expressions (also Gt and Lt) and field expressions (``metadata.name`` In/NotIn with a
  single value). Empty terms are dropped; a selector with no remaining term matches nothing.
* ``spec.nodeSelector``: a plain map, i.e. equality requirements.

Everything is validated at parse time like ``labels.NewRequirement``: bad operators, wrong
value counts, Gt/Lt values that are not int64, invalid keys or values raise
:class:`InvalidObjectError`. Matching on one label map lives here; the vectorised matching
over all nodes lives in :mod:`scheduler.core.snapshot`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from scheduler.model._fields import object_list as _object_list
from scheduler.model._fields import string_list as _string_list
from scheduler.model.errors import InvalidObjectError
from scheduler.model.names import label_value_error, qualified_name_error
from scheduler.model.quantity import parse_int64

Labels = Mapping[str, str]
NODE_NAME_FIELD = "metadata.name"


class Operator(StrEnum):
    IN = "In"
    NOT_IN = "NotIn"
    EXISTS = "Exists"
    DOES_NOT_EXIST = "DoesNotExist"
    GT = "Gt"
    LT = "Lt"


_LABEL_SELECTOR_OPERATORS = (Operator.IN, Operator.NOT_IN, Operator.EXISTS, Operator.DOES_NOT_EXIST)
_NODE_SELECTOR_OPERATORS = (*_LABEL_SELECTOR_OPERATORS, Operator.GT, Operator.LT)


@dataclass(frozen=True, slots=True)
class Requirement:
    """One label requirement; ``int_value`` caches the parsed Gt/Lt operand."""

    key: str
    operator: Operator
    values: tuple[str, ...]
    int_value: int = 0

    @classmethod
    def build(
        cls,
        key: object,
        operator: object,
        values: object,
        *,
        field: str,
        allowed: Sequence[Operator] = _NODE_SELECTOR_OPERATORS,
    ) -> Requirement:
        if not isinstance(key, str):
            raise InvalidObjectError(f"{field}.key", key, "must be a string")
        if (error := qualified_name_error(key)) is not None:
            raise InvalidObjectError(f"{field}.key", key, error)
        if operator not in [op.value for op in allowed]:
            supported = ", ".join(f'"{op.value}"' for op in allowed)
            raise InvalidObjectError(
                f"{field}.operator",
                operator,
                f"not a valid selector operator (supported: {supported})",
            )
        op = Operator(str(operator))
        vals = _string_list(values, f"{field}.values")
        int_value = 0
        if op in (Operator.IN, Operator.NOT_IN) and not vals:
            raise InvalidObjectError(
                f"{field}.values",
                list(vals),
                "for 'In', 'NotIn' operators, values set can't be empty",
            )
        if op in (Operator.EXISTS, Operator.DOES_NOT_EXIST) and vals:
            raise InvalidObjectError(
                f"{field}.values",
                list(vals),
                "values set must be empty for exists and does not exist",
            )
        if op in (Operator.GT, Operator.LT):
            if len(vals) != 1:
                raise InvalidObjectError(
                    f"{field}.values",
                    list(vals),
                    "for 'Gt', 'Lt' operators, exactly one value is required",
                )
            parsed = parse_int64(vals[0])
            if parsed is None:
                raise InvalidObjectError(
                    f"{field}.values[0]",
                    vals[0],
                    "for 'Gt', 'Lt' operators, the value must be an integer",
                )
            int_value = parsed
        for i, value in enumerate(vals):
            if (error := label_value_error(value)) is not None:
                raise InvalidObjectError(f"{field}.values[{i}]", value, error)
        return cls(key, op, vals, int_value)

    def matches(self, labels: Labels) -> bool:
        value = labels.get(self.key)
        match self.operator:
            case Operator.IN:
                return value is not None and value in self.values
            case Operator.NOT_IN:
                return value is None or value not in self.values
            case Operator.EXISTS:
                return value is not None
            case Operator.DOES_NOT_EXIST:
                return value is None
            case Operator.GT | Operator.LT:
                if value is None:
                    return False
                parsed = parse_int64(value)
                if parsed is None:
                    return False
                if self.operator is Operator.GT:
                    return parsed > self.int_value
                return parsed < self.int_value


@dataclass(frozen=True, slots=True)
class LabelSelector:
    """A parsed ``metav1.LabelSelector``.

    ``selects_nothing`` is the nil selector. An empty requirement list with
    ``selects_nothing=False`` is ``labels.Everything()``, which kube-scheduler calls *empty*.
    """

    requirements: tuple[Requirement, ...] = ()
    selects_nothing: bool = False

    @classmethod
    def from_api(cls, body: object, *, field: str) -> LabelSelector:
        if body is None:
            return NOTHING
        if not isinstance(body, Mapping):
            raise InvalidObjectError(field, body, "a label selector must be an object")
        match_labels = body.get("matchLabels") or {}
        expressions = body.get("matchExpressions") or []
        if not isinstance(match_labels, Mapping):
            raise InvalidObjectError(f"{field}.matchLabels", match_labels, "must be a map")
        if not isinstance(expressions, list):
            raise InvalidObjectError(f"{field}.matchExpressions", expressions, "must be a list")
        requirements: list[Requirement] = []
        # Go sorts requirements by key; order does not change the result of an AND.
        for key, value in sorted(match_labels.items()):
            if not isinstance(value, str):
                raise InvalidObjectError(f"{field}.matchLabels[{key}]", value, "must be a string")
            requirements.append(
                Requirement.build(key, "In", [value], field=f"{field}.matchLabels[{key}]")
            )
        for i, expr in enumerate(expressions):
            path = f"{field}.matchExpressions[{i}]"
            if not isinstance(expr, Mapping):
                raise InvalidObjectError(path, expr, "must be an object")
            requirements.append(
                Requirement.build(
                    expr.get("key"),
                    expr.get("operator"),
                    expr.get("values"),
                    field=path,
                    allowed=_LABEL_SELECTOR_OPERATORS,
                )
            )
        return cls(tuple(requirements))

    @property
    def is_empty(self) -> bool:
        """kube's ``Selector.Empty()``: true only for Everything (not for the nil selector)."""
        return not self.selects_nothing and not self.requirements

    def matches(self, labels: Labels) -> bool:
        if self.selects_nothing:
            return False
        return all(r.matches(labels) for r in self.requirements)

    def with_requirements(self, extra: Sequence[Requirement]) -> LabelSelector:
        """AND extra requirements in (matchLabelKeys merging); the nil selector stays nil."""
        if self.selects_nothing or not extra:
            return self
        return LabelSelector(tuple(extra) + self.requirements)


NOTHING = LabelSelector((), selects_nothing=True)
EVERYTHING = LabelSelector(())


@dataclass(frozen=True, slots=True)
class FieldRequirement:
    """``matchFields`` entry; only ``metadata.name`` exists for nodes."""

    key: str
    operator: Operator
    value: str

    def matches(self, node_name: str) -> bool:
        actual = node_name if self.key == NODE_NAME_FIELD else ""
        if self.operator is Operator.IN:
            return actual == self.value
        return actual != self.value


@dataclass(frozen=True, slots=True)
class NodeSelectorTerm:
    match_expressions: tuple[Requirement, ...]
    match_fields: tuple[FieldRequirement, ...]

    @classmethod
    def from_api(cls, body: object, *, field: str) -> NodeSelectorTerm:
        if body is None:
            body = {}
        if not isinstance(body, Mapping):
            raise InvalidObjectError(field, body, "a node selector term must be an object")
        exprs = _object_list(body.get("matchExpressions"), f"{field}.matchExpressions")
        fields = _object_list(body.get("matchFields"), f"{field}.matchFields")
        expressions = tuple(
            Requirement.build(
                e.get("key"),
                e.get("operator"),
                e.get("values"),
                field=f"{field}.matchExpressions[{i}]",
            )
            for i, e in enumerate(exprs)
        )
        field_reqs: list[FieldRequirement] = []
        for i, f in enumerate(fields):
            path = f"{field}.matchFields[{i}]"
            key, op = f.get("key"), f.get("operator")
            if not isinstance(key, str):
                raise InvalidObjectError(f"{path}.key", key, "must be a string")
            if op not in ("In", "NotIn"):
                raise InvalidObjectError(
                    f"{path}.operator",
                    op,
                    'not a valid field selector operator (supported: "In", "NotIn")',
                )
            values = _string_list(f.get("values"), f"{path}.values")
            if len(values) != 1:
                raise InvalidObjectError(f"{path}.values", list(values), "must have one element")
            field_reqs.append(FieldRequirement(key, Operator(op), values[0]))
        return cls(expressions, tuple(field_reqs))

    @property
    def is_empty(self) -> bool:
        return not self.match_expressions and not self.match_fields

    def matches(self, labels: Labels, node_name: str) -> bool:
        return all(r.matches(labels) for r in self.match_expressions) and all(
            f.matches(node_name) for f in self.match_fields
        )


@dataclass(frozen=True, slots=True)
class NodeSelector:
    """Required node affinity: OR of non-empty terms; no terms matches no node.

    ``raw_term_count`` and ``has_empty_term`` remember the terms as written, which
    NodeAffinity's PreFilter inspects before empty terms are dropped.
    """

    terms: tuple[NodeSelectorTerm, ...]
    raw_term_count: int = 0
    has_empty_term: bool = False

    @classmethod
    def from_api(cls, body: object, *, field: str) -> NodeSelector:
        if not isinstance(body, Mapping):
            raise InvalidObjectError(field, body, "a node selector must be an object")
        raw_terms = _object_list(
            body.get("nodeSelectorTerms"), f"{field}.nodeSelectorTerms", allow_null_items=True
        )
        terms = [
            NodeSelectorTerm.from_api(t, field=f"{field}.nodeSelectorTerms[{i}]")
            for i, t in enumerate(raw_terms)
        ]
        return cls(
            tuple(t for t in terms if not t.is_empty),
            raw_term_count=len(terms),
            has_empty_term=any(t.is_empty for t in terms),
        )

    def matches(self, labels: Labels, node_name: str) -> bool:
        return any(t.matches(labels, node_name) for t in self.terms)


@dataclass(frozen=True, slots=True)
class PreferredSchedulingTerm:
    weight: int
    term: NodeSelectorTerm
