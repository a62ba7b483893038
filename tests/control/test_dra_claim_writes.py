"""The writes of a claim for DRA-backed extended resources against a real HTTP server on
loopback: its deletion removes the delete-protection finalizer first and deletes with the
uid as precondition; a creation whose answer is lost is looked up and undone."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from kubernetes_asyncio import client

from scheduler.control.kubeio import KubeWriter
from scheduler.control.ratelimit import TokenBucket
from scheduler.core.dra.objects import DELETE_PROTECTION_FINALIZER

BASE = "/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims"
BODY: dict[str, Any] = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceClaim",
    "metadata": {
        "generateName": "p-extended-resources-",
        "namespace": "default",
        "ownerReferences": [
            {"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "uid-p", "controller": True}
        ],
        "annotations": {"resource.kubernetes.io/extended-resource-claim": "true"},
    },
    "spec": {"devices": {"requests": []}},
}


class FakeClaims:
    """ResourceClaims of one API server: create, list, get, merge patch, delete."""

    def __init__(self) -> None:
        self.claims: dict[str, dict[str, Any]] = {}
        self.calls: list[str] = []
        self.drop_create = False
        """Store the created claim, then drop the connection without an answer."""
        self.version = 0

    def _bump(self, body: dict[str, Any]) -> None:
        self.version += 1
        body["metadata"]["resourceVersion"] = str(self.version)

    async def create(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        name = f"{body['metadata'].pop('generateName')}{len(self.claims):05d}"
        body["metadata"].update(name=name, uid=f"uid-{name}")
        self._bump(body)
        self.claims[name] = body
        self.calls.append(f"create {name}")
        if self.drop_create:
            assert request.transport is not None
            request.transport.close()
            raise ConnectionResetError  # no answer ever reaches the client
        return web.json_response(body, status=201)

    async def list(self, request: web.Request) -> web.Response:
        self.calls.append("list")
        return web.json_response({"items": list(self.claims.values())})

    async def get(self, request: web.Request) -> web.Response:
        claim = self.claims.get(request.match_info["name"])
        if claim is None:
            return web.json_response({"kind": "Status", "message": "not found"}, status=404)
        return web.json_response(claim)

    async def patch(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        patch = await request.json()
        claim = self.claims[name]
        meta = patch["metadata"]
        if meta.get("resourceVersion") != claim["metadata"]["resourceVersion"]:
            return web.json_response({"kind": "Status", "message": "conflict"}, status=409)
        claim["metadata"]["finalizers"] = meta.get("finalizers") or []
        self._bump(claim)
        self.calls.append(f"patch {name} finalizers={claim['metadata']['finalizers']}")
        return web.json_response(claim)

    async def delete(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        options = await request.json()
        claim = self.claims[name]
        if options["preconditions"]["uid"] != claim["metadata"]["uid"]:
            return web.json_response({"kind": "Status", "message": "uid"}, status=409)
        assert DELETE_PROTECTION_FINALIZER not in (claim["metadata"].get("finalizers") or [])
        del self.claims[name]
        self.calls.append(f"delete {name}")
        return web.json_response({"kind": "Status", "status": "Success"})


@pytest.fixture
async def served() -> AsyncIterator[tuple[FakeClaims, KubeWriter]]:
    fake = FakeClaims()
    app = web.Application()
    app.router.add_post(BASE, fake.create)
    app.router.add_get(BASE, fake.list)
    app.router.add_get(BASE + "/{name}", fake.get)
    app.router.add_patch(BASE + "/{name}", fake.patch)
    app.router.add_delete(BASE + "/{name}", fake.delete)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    config = client.Configuration(host=f"http://127.0.0.1:{port}")
    try:
        async with client.ApiClient(config) as api:
            limiter = TokenBucket(1000.0, 1000)
            yield fake, KubeWriter(api, component="lattice", instance="t", limiter=limiter)
    finally:
        await runner.cleanup()


async def test_the_claim_is_created_and_deleted_finalizer_first(
    served: tuple[FakeClaims, KubeWriter],
) -> None:
    fake, writer = served
    created, failed = await writer.create_claim(copy.deepcopy(BODY), pod_uid="uid-p")
    assert failed is None
    assert created is not None
    name = created["metadata"]["name"]
    assert name == "p-extended-resources-00000"
    fake.claims[name]["metadata"]["finalizers"] = [
        "other.example.com/x",
        DELETE_PROTECTION_FINALIZER,
    ]
    assert await writer.delete_claim("default", name, f"uid-{name}") is None
    assert fake.calls == [
        f"create {name}",
        f"patch {name} finalizers=['other.example.com/x']",
        f"delete {name}",
    ]
    # gone already, or another claim of that name: nothing to do
    assert await writer.delete_claim("default", name, f"uid-{name}") is None


async def test_a_lost_creation_is_looked_up_and_undone(
    served: tuple[FakeClaims, KubeWriter],
) -> None:
    fake, writer = served
    fake.drop_create = True
    other = copy.deepcopy(BODY)
    other["metadata"]["ownerReferences"][0]["uid"] = "uid-another-pod"
    other["metadata"].update(name="q-extended-resources-zzzzz", uid="uid-q", resourceVersion="1")
    fake.claims["q-extended-resources-zzzzz"] = other
    created, failed = await writer.create_claim(copy.deepcopy(BODY), pod_uid="uid-p")
    assert created is None
    assert failed is not None
    assert failed.startswith("creating the claim for extended resources: connection: ")
    assert fake.calls == [
        "create p-extended-resources-00001",
        "list",
        "delete p-extended-resources-00001",
    ]
    assert list(fake.claims) == ["q-extended-resources-zzzzz"]  # another pod's stays
