"""An independent check of a volume plan, on the API objects themselves.

Lattice's :class:`VolumePlan` for the node kube-scheduler chose is checked against what
kube-scheduler did there and against rules written here from the API's documented
semantics, without Lattice's models or matching code (so a mistake in those cannot agree
with itself):

* the claims Lattice binds to existing PVs are those kube-scheduler bound to existing PVs,
  and the claims it provisions are those kube-scheduler provisioned (a class either has
  static PVs or a provisioner in these cases), on that node;
* each PV Lattice picked satisfies its claim on that node: unbound, the claim's class,
  enough capacity, every access mode, the volume mode, the claim's selector, the PV's
  node affinity, and no other claim of the pod took it;
* where only one PV satisfies a claim there, it is kube-scheduler's; with one claim to
  bind, Lattice's PV is as small as kube-scheduler's (both take the smallest that fits).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from scheduler.core.volumes import VolumePlan
from tests.e2e.differential.gen import Body

_UNITS = {"": 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}
_QUANTITY = re.compile(r"^(\d+)(Ki|Mi|Gi|Ti|)$")


def storage_bytes(quantity: str) -> int:
    """The binary-suffixed sizes the generator writes (anything else is a generator bug)."""
    m = _QUANTITY.match(quantity)
    if m is None:
        raise ValueError(f"unexpected storage quantity {quantity!r}")
    return int(m.group(1)) * _UNITS[m.group(2)]


def _expression_holds(expr: Body, labels: Mapping[str, str]) -> bool:
    key, op, values = expr["key"], expr["operator"], expr.get("values") or []
    if op == "In":
        return key in labels and labels[key] in values
    if op == "NotIn":
        return key not in labels or labels[key] not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    raise ValueError(f"unexpected operator {op!r} in a PV's node affinity")


def affinity_holds(pv: Body, node: Body) -> bool:
    """The PV's required node affinity (terms ORed, expressions ANDed) on the node."""
    required = ((pv["spec"].get("nodeAffinity") or {}).get("required")) or {}
    terms = required.get("nodeSelectorTerms")
    if not terms:
        return True
    labels = node["metadata"].get("labels") or {}
    return any(
        all(_expression_holds(e, labels) for e in t.get("matchExpressions") or []) for t in terms
    )


def satisfies(pv: Body, claim: Body, node: Body) -> bool:
    """Whether the unbound PV can be bound to the unbound claim for a pod on ``node``."""
    spec, want = pv["spec"], claim["spec"]
    ref = spec.get("claimRef")
    if ref is not None and (ref.get("namespace"), ref.get("name")) != (
        claim["metadata"]["namespace"],
        claim["metadata"]["name"],
    ):
        return False
    if (spec.get("storageClassName") or "") != (want.get("storageClassName") or ""):
        return False
    request = want["resources"]["requests"]["storage"]
    if storage_bytes(spec["capacity"]["storage"]) < storage_bytes(request):
        return False
    if not set(want.get("accessModes") or ()) <= set(spec.get("accessModes") or ()):
        return False
    if (spec.get("volumeMode") or "Filesystem") != (want.get("volumeMode") or "Filesystem"):
        return False
    selector = want.get("selector")
    if selector is not None:
        if selector.get("matchExpressions"):
            raise ValueError("the generator writes no selector matchExpressions")
        labels = pv["metadata"].get("labels") or {}
        if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
            return False
    return affinity_holds(pv, node)


@dataclass(frozen=True)
class KubeVolumes:
    """What kube-scheduler wrote for a pod's claims on its node (read from the API)."""

    static: Mapping[str, str]
    """Claim name -> the PV whose claimRef kube-scheduler set."""
    provisioned: frozenset[str]
    """Claims kube-scheduler annotated with its selected node."""


def plan_problems(
    plan: VolumePlan | None,
    kube: KubeVolumes,
    *,
    namespace: str,
    node: Body,
    unbound: Mapping[str, Body],
    pvs: Mapping[str, Body],
) -> list[str]:
    """Why Lattice's plan for kube-scheduler's node is wrong; empty when it is valid.

    ``unbound``: the pod's claims that were not bound when the case began, by name;
    ``pvs``: every PV as it was then, by name."""
    name = node["metadata"]["name"]
    static = {s.claim_name: s.pv for s in plan.static} if plan else {}
    provisions = {p.claim_name for p in plan.provisions} if plan else set()
    problems: list[str] = []
    if plan is not None and plan.node != name:
        problems.append(f"plan for {plan.node!r}, not kube's node {name!r}")
    for s in plan.static if plan else ():
        if s.claim_namespace != namespace:
            problems.append(f"binds a claim of namespace {s.claim_namespace!r}")
    for p in plan.provisions if plan else ():
        if p.node != name:
            problems.append(f"provisions {p.claim_name!r} on {p.node!r}, not {name!r}")
    if set(static) != set(kube.static):
        problems.append(f"binds claims {sorted(static)}, kube bound {sorted(kube.static)}")
    if provisions != set(kube.provisioned):
        problems.append(f"provisions {sorted(provisions)}, kube {sorted(kube.provisioned)}")
    if len(set(static.values())) != len(static):
        problems.append(f"one PV for two claims: {static}")
    for claim_name, chosen in sorted(static.items()):
        claim = unbound.get(claim_name)
        if claim is None:
            problems.append(f"binds {claim_name!r}, which was not an unbound claim of the pod")
            continue
        others = {v for c, v in static.items() if c != claim_name}
        fits = sorted(
            v for v, body in pvs.items() if v not in others and satisfies(body, claim, node)
        )
        theirs = kube.static.get(claim_name)
        if chosen not in fits:
            problems.append(f"{claim_name!r} -> {chosen!r}, which does not fit it (fits: {fits})")
        if theirs is not None and theirs not in fits:
            problems.append(f"the check rejects kube's {claim_name!r} -> {theirs!r} ({fits})")
        if len(fits) == 1 and theirs is not None and chosen != theirs:
            problems.append(f"{claim_name!r}: only {theirs!r} fits, lattice chose {chosen!r}")
        if len(static) == 1 and theirs is not None and theirs in pvs and chosen in pvs:
            ours_size = storage_bytes(pvs[chosen]["spec"]["capacity"]["storage"])
            kube_size = storage_bytes(pvs[theirs]["spec"]["capacity"]["storage"])
            if ours_size != kube_size:
                problems.append(
                    f"{claim_name!r}: lattice's {chosen!r} ({ours_size} B) is not as small as "
                    f"kube's {theirs!r} ({kube_size} B)"
                )
    return problems
