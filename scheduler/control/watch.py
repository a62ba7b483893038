"""kopf as the operator framework for our own LatticeScheduler object: its events are
handed to the app as plain dicts. The busy streams (pods, nodes, namespaces and the other
custom resources) bypass kopf through the intake (intake.py): kopf cannot filter pods
server-side, and its per-event machinery cost about three times the CPU per pod.

Only ``on.event`` handlers are used: they persist nothing onto the objects (no
finalizers, no progress annotations), and kopf's k8s-event posting and peering
are off. Scanning is off too, so kopf needs no permission on CRDs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, cast

import kopf

from scheduler.control.settings import API_GROUP, API_VERSION, PLURAL


class NoDiffBase(kopf.DiffBaseStorage):
    """Lattice has no change-detecting handlers, so kopf's per-event essence (a deep
    copy and a diff of every body) is pure overhead: about a third of the CPU spent
    per pod event in a profile. Report no essence and store nothing."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return cast(kopf.BodyEssence, None)

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        return None


def operator_settings() -> kopf.OperatorSettings:
    settings = kopf.OperatorSettings()
    settings.persistence.diffbase_storage = NoDiffBase()
    settings.posting.enabled = False
    settings.scanning.disabled = True
    settings.peering.standalone = True
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = 30
    settings.networking.request_timeout = 60
    return settings


def build_registry(
    *,
    login: Callable[..., kopf.ConnectionInfo | None],
    on_settings: Callable[[str | None, Mapping[str, Any]], None],
) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    logging.getLogger("kopf").setLevel(logging.WARNING)

    @kopf.on.login(registry=registry)
    def _login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        return login(**kwargs)

    @kopf.on.event(API_GROUP, API_VERSION, PLURAL, registry=registry)
    async def _settings(*, event: kopf.RawEvent, **_: Any) -> None:
        on_settings(event.get("type"), event["object"])

    return registry
