"""Fixtures every e2e module with a control plane of its own shares.

A module defines ``plane`` (its own control plane, see ``test_scheduler.lattice_plane``);
``api`` is an admin client for it and ``ns`` a fresh namespace per test, deleted after.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import AsyncIterator
from typing import cast

import pytest
from kubernetes_asyncio import client

from lattice_dev.devcluster.kube import api_client
from tests.e2e.test_scheduler import Plane

_names = itertools.count()


@pytest.fixture(scope="module")
async def api(plane: Plane) -> AsyncIterator[client.ApiClient]:
    async with api_client(plane.cluster.kubeconfig) as a:
        yield a


@pytest.fixture
async def ns(api: client.ApiClient) -> AsyncIterator[str]:
    name = f"t-{os.getpid()}-{next(_names)}"
    core = client.CoreV1Api(api)
    await core.create_namespace(cast(client.V1Namespace, {"metadata": {"name": name}}))
    yield name
    await core.delete_namespace(name)
