"""Typed errors raised while turning API bodies into model records.

Malformed objects are a normal outcome of scheduling, not a bug: the API server validates
most of what we parse, but bodies can come from files, fixtures or future API versions. Every
parse failure is an :class:`InvalidObjectError` naming the field, the offending value and the
reason, so the controller can surface it verbatim as a FailedScheduling message instead of
crashing.
"""

from __future__ import annotations


class InvalidObjectError(ValueError):
    """A field of an API object could not be parsed or is out of range."""

    def __init__(self, field: str, value: object, reason: str) -> None:
        self.field = field
        self.value = value
        self.reason = reason
        super().__init__(f"invalid {field} {value!r}: {reason}")
