"""An independent judge of a written DRA allocation against its random case.

It never calls Lattice's allocator nor any CEL: each selector's truth comes from
:meth:`~tests.e2e.differential.dra_gen.Sel.truth` on the published attributes. For the
claims of one pod on one node it checks what kube-scheduler of the plane's release
guarantees:

* every result names a request (or ``request/subrequest``, one subrequest per request) of
  the claim, the driver of that request's class, the pool published on this node (the
  current generation) and a device of that pool's current slice;
* the class's and the request's selectors hold on the device (and do not error);
* the count: ExactCount gives ``count`` results, All every matching device of the pool;
* every matchAttribute constraint holds over the results in its scope (all have the
  attribute, with the same type and value; the driver-domain fallback for bare names);
* no device twice in one claim, none twice across the pod's claims unless adminAccess,
  ``adminAccess: true`` exactly on adminAccess results;
* ``devices.config`` as the release writes it: each class's config once per class naming the
  requests that used it (in request order), then each claim config, once when it names no
  request, else once per used request it names (1.35-1.36) or once (1.37, which also drops
  ``requests`` from an entry naming every request of the claim);
* device taints (kube 1.36+): no result is a device with a ``NoSchedule`` or ``NoExecute``
  taint its request (or subrequest) does not tolerate (:func:`tolerates`: kube's matching
  rules), and each result carries a copy of its request's ``tolerations`` (none: absent);
* shared counters (1.36+): over all the case's claims on the node, the devices allocated
  from a pool with a counter set (adminAccess results apart) consume no counter beyond its
  value;
* consumable capacity (1.36+): a result on a device with ``allowMultipleAllocations`` is a
  share: it has a UUID ``shareID`` and ``consumedCapacity`` equal to the request rounded by
  the device's policy (:func:`expected_share`, worked out here), such a device may appear
  in several results, and over all the case's claims on the node the shares of a device
  consume no more than its capacity; a result on another device has neither field, and the
  request's capacity fits in the device's; ``distinctAttribute`` constraints hold (every
  result in scope has the attribute, no value twice);
* ``nodeSelector`` pins the node (every slice here is node-local);
* (:func:`check_reserved`) each bound pod is in ``status.reservedFor`` of every claim it
  names, and every claim a scheduler allocated carries the delete-protection finalizer.
"""

from __future__ import annotations

import uuid
from typing import Any

from lattice_dev.devcluster.build import kubernetes_version
from tests.e2e.differential.dra_gen import (
    BLOCKING_EFFECTS,
    COUNTER_SET,
    FINALIZER,
    Case,
    Claim,
    SelectorError,
    Sub,
    _quantity,
    claim_config,
    class_config,
    lookup,
)


def tolerates(toleration: dict[str, Any], taint: dict[str, Any]) -> bool:
    """Whether ``toleration`` matches ``taint``: an effect and a key, where given, must be
    the taint's; ``Exists`` matches any value, ``Equal`` (the default) only the same one
    (absent = empty); another operator matches nothing."""
    if toleration.get("effect", "") not in ("", taint.get("effect", "")):
        return False
    if toleration.get("key", "") not in ("", taint.get("key", "")):
        return False
    operator = toleration.get("operator") or "Equal"
    if operator == "Exists":
        return True
    if operator == "Equal":
        return bool(toleration.get("value", "") == taint.get("value", ""))
    return False


def untolerated(device: dict[str, Any], tolerations: list[dict[str, Any]]) -> list[str]:
    """The device's taints that keep it from a request with ``tolerations`` (only
    ``NoSchedule`` and ``NoExecute`` ones block; ``None`` and any other effect do not)."""
    return [
        f"{t.get('key')}={t.get('value', '')}:{t.get('effect')}"
        for t in device.get("taints") or []
        if t.get("effect") in BLOCKING_EFFECTS and not any(tolerates(x, t) for x in tolerations)
    ]


def over_spent(case: Case, node: str, allocations: list[dict[str, Any] | None]) -> list[str]:
    """Counters of a pool's set that the case's allocations on ``node`` together spend
    beyond its value (each non-adminAccess result of a consuming device counts once per
    claim)."""
    problems: list[str] = []
    for d in case.drivers:
        if d.counters is None:
            continue
        spent = dict.fromkeys(d.counters, 0)
        by_name = {x["name"]: x for x in d.devices}
        for allocation in allocations:
            for r in ((allocation or {}).get("devices") or {}).get("results") or []:
                if r.get("adminAccess") or (r.get("driver"), r.get("pool")) != (
                    d.name,
                    d.pool(node),
                ):
                    continue
                device = by_name.get(r.get("device", ""))
                for use in (device or {}).get("consumesCounters") or []:
                    if use["counterSet"] != COUNTER_SET:
                        problems.append(f"{r['device']} consumes from {use['counterSet']}")
                        continue
                    for name, value in use["counters"].items():
                        if name not in spent:
                            problems.append(f"{r['device']} consumes an unknown counter {name}")
                            continue
                        spent[name] += _quantity(value["value"])
        for name, total in spent.items():
            if total > _quantity(d.counters[name]):
                problems.append(
                    f"pool {d.pool(node)}: counter {name} spent {total} > {d.counters[name]}"
                )
    return problems


def _matches(case: Case, sub: Sub, device: dict[str, Any]) -> bool:
    d = case.driver_of(sub.cls)
    assert d is not None
    return all(s.truth(device, d.name) for s in (*d.class_selectors, *sub.selectors))


def check_pod(case: Case, node: str, allocations: list[dict[str, Any] | None]) -> list[str]:
    """Problems with the allocations written for ``case``'s claims (in ``case.claims``
    order) on ``node``; empty when all is valid."""
    problems: list[str] = []
    held: dict[tuple[str, str, str], str] = {}
    for claim, allocation in zip(case.claims, allocations, strict=True):
        where = f"{case.claim_name(claim, node)}"
        if allocation is None:
            problems.append(f"{where}: pod bound but claim not allocated")
            continue
        problems += [f"{where}: {p}" for p in _check_claim(case, claim, node, allocation, held)]
    problems += over_spent(case, node, allocations)
    problems += capacity_over_spent(case, node, allocations)
    return problems


def expected_share(sub: Sub, device: dict[str, Any]) -> int | None:
    """The memory a share of ``device`` for ``sub`` consumes (bytes), worked out from
    KEP-5075's rules: an omitted request takes the policy's default, else the whole
    capacity; a request below a range's min takes the min, else rounds up to the next
    step; between valid values, to the next one. None: the policy refuses it (above the
    range's max, above every valid value)."""
    memory = device["capacity"]["memory"]
    policy = memory.get("requestPolicy") or {}
    ask = (sub.capacity or {}).get("memory")
    if ask is None:
        return _quantity(policy["default"]) if "default" in policy else _quantity(memory["value"])
    value = _quantity(ask)
    if "validRange" in policy:
        rng = policy["validRange"]
        low, step = _quantity(rng["min"]), _quantity(rng["step"])
        value = low if value < low else low + -(-(value - low) // step) * step
        return None if value > _quantity(rng["max"]) else value
    if "validValues" in policy:
        bigger = [v for v in map(_quantity, policy["validValues"]) if v >= value]
        return min(bigger) if bigger else None
    return value


def capacity_over_spent(
    case: Case, node: str, allocations: list[dict[str, Any] | None]
) -> list[str]:
    """Devices whose shares, over the case's allocations on ``node``, consume more memory
    than the device has."""
    spent: dict[tuple[str, str], int] = {}
    for allocation in allocations:
        for r in ((allocation or {}).get("devices") or {}).get("results") or []:
            written = (r.get("consumedCapacity") or {}).get("memory")
            if written is not None:
                key = (r.get("pool", ""), r.get("device", ""))
                spent[key] = spent.get(key, 0) + _quantity(written)
    problems: list[str] = []
    for d in case.drivers:
        for x in d.devices:
            if (d.pool(node), x["name"]) not in spent:
                continue
            used = spent[(d.pool(node), x["name"])]
            if used > _quantity(x["capacity"]["memory"]["value"]):
                problems.append(f"{x['name']}: shares consume {used} > its memory")
    return problems


def _is_uuid(value: object) -> bool:
    try:
        return isinstance(value, str) and str(uuid.UUID(value)) == value
    except ValueError:
        return False


def _check_share(sub: Sub, device: dict[str, Any], r: dict[str, Any]) -> list[str]:
    """A result's share fields against its device and request (see the module doc)."""
    problems: list[str] = []
    share = r.get("shareID")
    written = r.get("consumedCapacity")
    if not device.get("allowMultipleAllocations"):
        if share is not None or written is not None:
            problems.append(f"{r}: a share of a device that allows one allocation")
        ask = (sub.capacity or {}).get("memory")
        if ask is not None and _quantity(ask) > _quantity(device["capacity"]["memory"]["value"]):
            problems.append(f"{r}: asks {ask}, more than the device's memory")
        return problems
    if not _is_uuid(share):
        problems.append(f"{r}: shareID should be a UUID")
    want = expected_share(sub, device)
    got = None if written is None else _quantity(written["memory"])
    if want is None or got != want:
        problems.append(f"{r}: consumes {got}, the policy gives {want}")
    return problems


def check_reserved(
    pod: dict[str, Any], claims: list[tuple[Claim, dict[str, Any] | None]]
) -> list[str]:
    """Problems with the claims (``(claim, its object)``) a bound ``pod`` names: the pod must
    be in each one's ``reservedFor``; a claim the scheduler allocated (every one but a held
    claim it found allocated for its node) must carry kube's finalizer."""
    meta = pod["metadata"]
    problems: list[str] = []
    for claim, body in claims:
        if body is None:
            problems.append(f"{meta['name']}: the claim{claim.suffix} it names does not exist")
            continue
        where = f"{meta['name']}: {body['metadata']['name']}"
        reserved = (body.get("status") or {}).get("reservedFor") or []
        entry = {"resource": "pods", "name": meta["name"], "uid": meta["uid"]}
        if not any({k: r.get(k) for k in entry} == entry for r in reserved):
            problems.append(f"{where}: reservedFor {reserved} lacks the pod")
        by_scheduler = claim.held is None or claim.held_elsewhere
        if by_scheduler and FINALIZER not in (body["metadata"].get("finalizers") or []):
            problems.append(f"{where}: allocated without the {FINALIZER} finalizer")
    return problems


def _check_claim(
    case: Case,
    claim: Claim,
    node: str,
    allocation: dict[str, Any],
    held: dict[tuple[str, str, str], str],
) -> list[str]:
    problems: list[str] = []
    devices = allocation.get("devices") or {}
    results: list[dict[str, Any]] = devices.get("results") or []
    chosen: dict[str, Sub] = {}
    by_request: dict[str, list[dict[str, Any]]] = {}
    seen: set[tuple[str, str, str]] = set()
    for r in results:
        base, _, subname = r.get("request", "").partition("/")
        request = next((q for q in claim.requests if q.name == base), None)
        if request is None or bool(subname) != request.first_available:
            problems.append(f"result names no request of the claim: {r}")
            continue
        sub = next((s for s in request.alternatives if s.name == subname), None)
        if sub is None:
            problems.append(f"result names no subrequest of {base}: {r}")
            continue
        if chosen.setdefault(base, sub) is not sub:
            problems.append(f"request {base} has results of two subrequests")
            continue
        by_request.setdefault(base, []).append(r)
        d = case.driver_of(sub.cls)
        if d is None:
            problems.append(f"request {base} names class {sub.cls}, which does not exist")
            continue
        key = (r.get("driver", ""), r.get("pool", ""), r.get("device", ""))
        multiple = any(x["name"] == key[2] and x.get("allowMultipleAllocations") for x in d.devices)
        if key in seen and not multiple:
            problems.append(f"device {key} twice in the claim")
        seen.add(key)
        if key[0] != d.name or key[1] != d.pool(node):
            problems.append(f"{r} is not from {d.name}/{d.pool(node)} (the pool on {node})")
            continue
        device = next((x for x in d.devices if x["name"] == key[2]), None)
        if device is None:
            problems.append(f"{key[2]} is not in the current slice of {d.pool(node)}")
            continue
        try:
            ok = _matches(case, sub, device)
        except SelectorError as err:
            problems.append(f"{key[2]}: a selector errors on it ({err}), yet it was allocated")
            continue
        if not ok:
            problems.append(f"{key[2]} does not match request {r['request']}'s selectors")
        problems += _check_share(sub, device, r)
        blocking = untolerated(device, sub.tolerations)
        if blocking:
            problems.append(f"{key[2]}: untolerated taints {blocking}, yet allocated")
        if r.get("tolerations", []) != sub.tolerations or r.get("tolerations") == []:
            problems.append(
                f"{r}: tolerations should be {sub.tolerations or 'absent'} (the request's)"
            )
        if bool(r.get("adminAccess")) != sub.admin or (
            "adminAccess" in r and r["adminAccess"] is not True
        ):
            problems.append(f"{r}: adminAccess should be {sub.admin or 'absent'}")
        if not sub.admin and not multiple:
            other = held.get(key)
            if other is not None:
                problems.append(f"device {key} also held by {other}")
            held[key] = f"{case.claim_name(claim, node)}/{r['request']}"
    for request in claim.requests:
        got = by_request.get(request.name, [])
        sub = chosen.get(request.name)
        if sub is None:
            problems.append(f"request {request.name} has no results")
            continue
        if sub.mode == "All":
            d = case.driver_of(sub.cls)
            assert d is not None
            want = {x["name"] for x in d.devices if _matches(case, sub, x)}
            have = {r["device"] for r in got}
            if have != want:
                problems.append(
                    f"All request {request.name}: got {sorted(have)}, want {sorted(want)}"
                )
        elif len(got) != sub.count:
            problems.append(f"request {request.name}: {len(got)} results, count is {sub.count}")
    for c in claim.constraints:
        values = set()
        distinct: list[str] = []
        for r in results:
            base, _, subname = r.get("request", "").partition("/")
            if c.requests and base not in c.requests and r.get("request") not in c.requests:
                continue
            value = lookup(_published(case, r), r.get("driver", ""), c.attribute)
            if value is None:
                problems.append(f"constraint {c.attribute}: {r['device']} lacks it")
            values.add(json_key(value))
            distinct.append(json_key(value))
        if c.distinct:
            if len(set(distinct)) != len(distinct):
                problems.append(f"distinct {c.attribute} over {c.requests or 'all'}: {distinct}")
            continue
        if len(values) > 1:
            problems.append(f"constraint {c.attribute} over {c.requests or 'all'}: {values}")
    want_config = expected_config(case, claim, chosen)
    if (devices.get("config") or []) != want_config:
        problems.append(f"config {devices.get('config')} != expected {want_config}")
    want_selector = {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
        ]
    }
    if allocation.get("nodeSelector") != want_selector:
        problems.append(f"nodeSelector {allocation.get('nodeSelector')} does not pin {node}")
    return problems


def json_key(value: object) -> str:
    return repr(value)


def _published(case: Case, result: dict[str, Any]) -> dict[str, Any]:
    for d in case.drivers:
        if d.name == result.get("driver"):
            for x in d.devices:
                if x["name"] == result.get("device"):
                    return x
    return {}


def expected_config(case: Case, claim: Claim, chosen: dict[str, Sub]) -> list[dict[str, Any]]:
    """``devices.config`` as the plane's release writes it: from 1.37 a claim config naming
    requests once, and ``requests`` dropped where a config names every request."""
    compact = kubernetes_version() >= "v1.37"
    out: list[dict[str, Any]] = []
    by_class: dict[str, dict[str, Any]] = {}
    used: list[tuple[str, str]] = []
    for request in claim.requests:
        sub = chosen.get(request.name)
        if sub is None:
            continue
        name = f"{request.name}/{sub.name}" if sub.name else request.name
        used.append((request.name, name))
        entry = by_class.get(sub.cls)
        if entry is not None:
            entry["requests"].append(name)
            continue
        d = case.driver_of(sub.cls)
        assert d is not None
        entry = {"source": "FromClass", "requests": [name], **class_config(d)}
        by_class[sub.cls] = entry
        out.append(entry)
    for i, names in enumerate(claim.config_for):
        body = claim_config(case, claim, i)
        if not names:
            out.append({"source": "FromClaim", **body})
            continue
        for base, name in used:
            if base in names or name in names:
                out.append({"source": "FromClaim", "requests": names, **body})
                if compact:
                    break
    if compact:
        for entry in out:
            listed = entry.get("requests")
            if listed and all(base in listed or name in listed for base, name in used):
                del entry["requests"]
    return out
