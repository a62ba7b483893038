"""`lattice run` authenticates its watches and its writes alike, whatever the kubeconfig holds.

The scheduler runs as a real process with the shipped RBAC, bound to the user
``lattice-scheduler``; the API server knows that user by a bearer token, by the CN of a
client certificate signed by the cluster CA, or by whatever an exec plugin hands out. A pod
created after start-up reaches the scheduler only through kopf's watch, so its binding
proves the watch authenticated, and the binding itself proves the writes did.
"""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import subprocess
import sys
import threading
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from kubernetes_asyncio import client

from lattice_dev.devcluster.cluster import LATTICE_USER, ClusterConfig
from lattice_dev.devcluster.kube import poll
from tests.e2e.lattice_proc import LatticeProcess
from tests.e2e.test_scheduler import LEASE_NS, Plane, lattice_plane, pod, wait_bound

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    with lattice_plane(tmp_path_factory.mktemp("credplane"), ClusterConfig(nodes=2)) as p:
        yield p


def whoami(plane: Plane, kubeconfig: Path) -> str:
    out = subprocess.run(
        [plane.kubectl, f"--kubeconfig={kubeconfig}", "auth", "whoami", "-o", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    name: str = json.loads(out.stdout)["status"]["userInfo"]["username"]
    return name


async def binds_a_pod(
    plane: Plane, api: client.ApiClient, ns: str, kubeconfig: Path, ident: str
) -> dict[str, Any]:
    """Start `lattice run` with ``kubeconfig``; once it serves, create a pod; it must bind."""
    sched = LatticeProcess(
        kubeconfig, plane.tmp / f"{ident}.log", ident, "--lease-namespace", LEASE_NS
    ).start()
    try:

        async def serving() -> bool:
            assert sched.proc is not None
            assert sched.proc.poll() is None, sched.log.read_text()
            return any(line.get("event") == "serving" for line in sched.lines())

        await poll(serving, within=60, interval=0.2)
        await client.CoreV1Api(api).create_namespaced_pod(ns, cast(client.V1Pod, pod("cred-0")))
        (bound,) = await wait_bound(api, ns, 1, within=60)
        assert bound["spec"]["schedulerName"] == "lattice"
        assert bound["spec"]["nodeName"].startswith("kwok-node-")
    finally:
        sched.stop()
    text = sched.log.read_text()
    assert "Traceback" not in text
    assert "Unauthorized" not in text
    assert "LoginError" not in text
    assert sched.proc is not None
    assert sched.proc.returncode == 0
    return bound


async def test_embedded_client_certificate(plane: Plane, api: client.ApiClient, ns: str) -> None:
    """What kind and kubeadm write: client-certificate-data and client-key-data."""
    kubeconfig = plane.cluster.kubeconfig_for(LATTICE_USER.name, embedded_cert=True)
    doc = yaml.safe_load(kubeconfig.read_text())
    assert set(doc["users"][0]["user"]) == {"client-certificate-data", "client-key-data"}
    assert set(doc["clusters"][0]["cluster"]) == {"server", "certificate-authority-data"}
    assert whoami(plane, kubeconfig) == LATTICE_USER.name  # the certificate's CN
    await binds_a_pod(plane, api, ns, kubeconfig, "cert")


async def test_client_certificate_files(
    plane: Plane, api: client.ApiClient, ns: str, tmp_path: Path
) -> None:
    """The same identity as files next to the kubeconfig, named relative to it."""
    embedded = yaml.safe_load(
        plane.cluster.kubeconfig_for(LATTICE_USER.name, embedded_cert=True).read_text()
    )
    cluster, user = embedded["clusters"][0]["cluster"], embedded["users"][0]["user"]
    for name, data in (
        ("ca.crt", cluster.pop("certificate-authority-data")),
        ("me.crt", user.pop("client-certificate-data")),
        ("me.key", user.pop("client-key-data")),
    ):
        (tmp_path / name).write_bytes(base64.standard_b64decode(data))
        (tmp_path / name).chmod(0o600)
    cluster["certificate-authority"] = "ca.crt"
    user.update({"client-certificate": "me.crt", "client-key": "me.key"})
    kubeconfig = tmp_path / "files.kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(embedded))
    assert whoami(plane, kubeconfig) == LATTICE_USER.name
    await binds_a_pod(plane, api, ns, kubeconfig, "files")


async def test_exec_plugin_and_insecure_skip_tls_verify(
    plane: Plane, api: client.ApiClient, ns: str, tmp_path: Path
) -> None:
    """An exec plugin (the EKS/GKE shape) hands out the token; no CA, TLS not verified."""
    token_doc = yaml.safe_load(plane.user_kubeconfig.read_text())
    script = tmp_path / "plugin.py"
    script.write_text(
        "import json, sys\n"
        f"doc = json.load(open({str(tmp_path / 'token.json')!r}))\n"
        "print(json.dumps({'apiVersion': 'client.authentication.k8s.io/v1',"
        " 'kind': 'ExecCredential', 'status': {'token': doc['token']}}))\n"
    )
    (tmp_path / "token.json").write_text(json.dumps(token_doc["users"][0]["user"]))
    script.chmod(0o700)
    (tmp_path / "token.json").chmod(0o600)
    kubeconfig = tmp_path / "exec.kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "dev",
                        "cluster": {
                            "server": token_doc["clusters"][0]["cluster"]["server"],
                            "insecure-skip-tls-verify": True,
                        },
                    }
                ],
                "users": [
                    {
                        "name": "plugin",
                        "user": {
                            "exec": {
                                "apiVersion": "client.authentication.k8s.io/v1",
                                "command": sys.executable,
                                "args": [str(script)],
                                "interactiveMode": "Never",
                            }
                        },
                    }
                ],
                "contexts": [{"name": "dev", "context": {"cluster": "dev", "user": "plugin"}}],
                "current-context": "dev",
            }
        )
    )
    kubeconfig.chmod(0o600)
    await binds_a_pod(plane, api, ns, kubeconfig, "exec")


class ConnectProxy:
    """An HTTP CONNECT proxy on loopback that records each tunnel's target, as a corporate
    proxy in front of an API server would see it. It runs on a loop in a thread of its own:
    the test's loop blocks while it stops `lattice run`, whose last requests still go
    through the proxy."""

    def __init__(self, hosts: dict[str, str]) -> None:
        self.targets: list[str] = []
        self.hosts = hosts
        """Names only the proxy can resolve (its own DNS), to their addresses."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None

    def __enter__(self) -> ConnectProxy:
        self._thread.start()
        start = asyncio.start_server(self._serve, "127.0.0.1", 0)
        self._server = asyncio.run_coroutine_threadsafe(start, self._loop).result(10)
        return self

    def __exit__(self, *_: object) -> None:
        async def close() -> None:
            assert self._server is not None
            self._server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
            method, target, _ = head.split("\r\n", 1)[0].split(" ", 2)
            if method != "CONNECT":
                writer.write(b"HTTP/1.1 405 Method Not Allowed\r\ncontent-length: 0\r\n\r\n")
                return
            self.targets.append(target)
            host, port = target.rsplit(":", 1)
            up_reader, up_writer = await asyncio.open_connection(
                self.hosts.get(host, host), int(port)
            )
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    try:
        while data := await src.read(65536):
            dst.write(data)
            await dst.drain()
    finally:
        dst.close()


async def test_proxy_url_carries_the_watches_and_the_writes(
    plane: Plane, api: client.ApiClient, ns: str, tmp_path: Path
) -> None:
    """A kubeconfig's proxy-url, where the API server's name resolves only at the proxy (a
    name its certificate carries): kopf's watch and kubernetes-asyncio's writes must both
    tunnel through it, or the pod, created after start-up, would never bind."""
    doc = yaml.safe_load(plane.user_kubeconfig.read_text())
    cluster = doc["clusters"][0]["cluster"]
    port = urllib.parse.urlsplit(cluster["server"]).port
    hidden = "kubernetes.default.svc"
    with pytest.raises(socket.gaierror):
        socket.getaddrinfo(hidden, port)  # not reachable but through the proxy
    with ConnectProxy({hidden: "127.0.0.1"}) as proxy:
        cluster["server"] = f"https://{hidden}:{port}"
        cluster["proxy-url"] = proxy.url
        kubeconfig = tmp_path / "proxied.kubeconfig"
        kubeconfig.write_text(yaml.safe_dump(doc))
        kubeconfig.chmod(0o600)
        await binds_a_pod(plane, api, ns, kubeconfig, "proxied")
    assert set(proxy.targets) == {f"{hidden}:{port}"}
    log = (plane.tmp / "proxied.log").read_text()
    assert "kopf listed: True" in log, "kopf's watch went through the proxy too"
    assert "ClientConnector" not in log
