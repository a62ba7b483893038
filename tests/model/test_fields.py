"""The raw-body accessors' fast path for decoded JSON keeps their contract."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import pytest

from scheduler.model._fields import mapping, object_list
from scheduler.model.errors import InvalidObjectError


def test_a_list_of_dicts_comes_back_as_a_new_list_of_the_same_items() -> None:
    raw: list[Any] = [{"a": 1}, {"b": 2}]
    got = object_list(raw, "f")
    assert got == raw
    assert got is not raw
    assert all(x is y for x, y in zip(got, raw, strict=True))


def test_other_mappings_and_null_items_still_take_the_checked_path() -> None:
    proxy: Mapping[str, Any] = MappingProxyType({"a": 1})
    assert object_list([{"x": 0}, proxy], "f") == [{"x": 0}, proxy]
    assert object_list([{"x": 0}, None], "f", allow_null_items=True) == [{"x": 0}, {}]
    with pytest.raises(InvalidObjectError) as err:
        object_list([{"x": 0}, None], "spec.containers")
    assert err.value.field == "spec.containers[1]"
    with pytest.raises(InvalidObjectError):
        object_list([{"x": 0}, "no"], "f")


def test_mapping_returns_a_dict_as_is_and_refuses_what_is_not_one() -> None:
    body = {"a": 1}
    assert mapping(body, "f") is body
    assert mapping(None, "f") == {}
    with pytest.raises(InvalidObjectError):
        mapping(["a"], "f")
