"""Small typed accessors for raw API bodies; every failure is an InvalidObjectError."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from scheduler.model.errors import InvalidObjectError


def mapping(raw: object, field: str) -> Mapping[str, Any]:
    if type(raw) is dict:  # what JSON decodes to: skip the ABC check, the costly part
        return raw
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise InvalidObjectError(field, raw, "must be an object")
    return raw


def string_map(raw: object, field: str) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in raw.items()
    ):
        raise InvalidObjectError(field, raw, "must be a map of strings to strings")
    return dict(raw)


def string(raw: object, field: str, default: str = "") -> str:
    if raw is None:
        return default
    if not isinstance(raw, str):
        raise InvalidObjectError(field, raw, "must be a string")
    return raw


def string_list(raw: object, field: str) -> tuple[str, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list) or not all(isinstance(v, str) for v in raw):
        raise InvalidObjectError(field, raw, "must be a list of strings")
    return tuple(raw)


def object_list(
    raw: object, field: str, *, allow_null_items: bool = False
) -> list[Mapping[str, Any]]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise InvalidObjectError(field, raw, "must be a list")
    if all(type(item) is dict for item in raw):
        # Decoded JSON: every item a dict. Checking exact types skips an ABC isinstance
        # per item, which was most of a listed pod's parse (18 lists a pod, 30 000 pods).
        return list(raw)
    out: list[Mapping[str, Any]] = []
    for i, item in enumerate(raw):
        if item is None and allow_null_items:
            out.append({})
            continue
        if not isinstance(item, Mapping):
            raise InvalidObjectError(f"{field}[{i}]", item, "must be an object")
        out.append(item)
    return out


def integer(
    raw: object,
    field: str,
    *,
    default: int,
    minimum: int | None = None,
    maximum: int | None = None,
) -> int:
    if raw is None:
        return default
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise InvalidObjectError(field, raw, "must be an integer")
    if minimum is not None and raw < minimum:
        raise InvalidObjectError(field, raw, f"must be greater than or equal to {minimum}")
    if maximum is not None and raw > maximum:
        raise InvalidObjectError(field, raw, f"must be less than or equal to {maximum}")
    if not -(2**31) <= raw < 2**31:
        raise InvalidObjectError(field, raw, "must fit in a 32-bit integer")
    return raw
