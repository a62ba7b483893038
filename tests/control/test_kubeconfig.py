"""One credential loader for both clients: every kubeconfig shape gives kopf the same
identity the write client has, and refreshes reach both.

Certificates are real (signed by a throwaway CA from the devcluster's PKI code), so kopf's
own ``as_ssl_context`` proves the files it is handed load as a key pair.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import json
import os
import ssl
import stat
import sys
from pathlib import Path
from typing import Any, cast

import kopf
import pytest
import yaml
from kubernetes_asyncio import client

from lattice_dev.devcluster import pki
from scheduler.control import kubeconfig
from scheduler.control.kubeconfig import (
    Credentials,
    StartupError,
    environment_lookups_needed,
    load_credentials,
    skip_environment_lookups,
)

SERVER = "https://127.0.0.1:6443"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ca.crt, and u.crt / u.key for user "u" (groups g1, g2)."""
    directory = tmp_path_factory.mktemp("pki")
    pki.write_pki(directory)
    pki.write_client_cert(directory, pki.User("u", ("g1", "g2")))
    return directory


def write_kubeconfig(
    path: Path, user: dict[str, Any], cluster: dict[str, Any] | None = None
) -> Path:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": SERVER, **(cluster or {})}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "ctx",
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def b64(path: Path) -> str:
    return base64.standard_b64encode(path.read_bytes()).decode()


def exec_plugin(
    directory: Path, expires_in: dt.timedelta | None, *, cert: Path | None = None
) -> dict[str, Any]:
    """A kubeconfig ``exec`` stanza for a plugin that counts its runs: token ``exec-<n>``
    (or, with ``cert``, client certificate data) and an optional expiry."""
    counter = directory / "runs"
    counter.write_text("0")
    status: dict[str, Any] = {}
    if expires_in is not None:
        stamp = (dt.datetime.now(dt.UTC) + expires_in).strftime("%Y-%m-%dT%H:%M:%SZ")
        status["expirationTimestamp"] = stamp
    cert_lines = ""
    if cert is not None:
        cert_lines = (
            f"status['clientCertificateData'] = open({str(cert / 'u.crt')!r}).read()\n"
            f"status['clientKeyData'] = open({str(cert / 'u.key')!r}).read()\n"
        )
    script = directory / "plugin.py"
    script.write_text(
        "import json, os\n"
        f"counter = {str(counter)!r}\n"
        "n = int(open(counter).read()) + 1\n"
        "open(counter, 'w').write(str(n))\n"
        "assert json.loads(os.environ['KUBERNETES_EXEC_INFO'])['kind'] == 'ExecCredential'\n"
        f"status = {status!r}\n"
        + ("status['token'] = f'exec-{n}'\n" if cert is None else cert_lines)
        + "print(json.dumps({'apiVersion': 'client.authentication.k8s.io/v1', "
        "'kind': 'ExecCredential', 'status': status}))\n"
    )
    return {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": sys.executable,
            "args": [str(script)],
            "interactiveMode": "Never",
        }
    }


def read(path: object) -> bytes:
    return Path(str(path)).read_bytes()


def mode(path: object) -> int:
    return stat.S_IMODE(Path(str(path)).stat().st_mode)


def runs(directory: Path) -> int:
    return int((directory / "runs").read_text())


async def test_token(tmp_path: Path, certs: Path) -> None:
    path = write_kubeconfig(
        tmp_path / "kc", {"token": "abc123"}, {"certificate-authority": str(certs / "ca.crt")}
    )
    creds = await load_credentials(path)
    info = creds.connection_info()
    assert (info.server, info.scheme, info.token) == (SERVER, "Bearer", "abc123")
    assert (info.ca_path, info.insecure, info.certificate_path) == (
        str(certs / "ca.crt"),
        False,
        None,
    )
    assert info.as_http_headers() == {"Authorization": "Bearer abc123"}
    assert await creds.configuration.get_api_key_with_prefix("BearerToken") == "Bearer abc123"
    assert creds.source == f"kubeconfig {path}"


async def test_token_file_and_basic_auth(tmp_path: Path) -> None:
    (tmp_path / "tok").write_text("from-file\n")
    creds = await load_credentials(
        write_kubeconfig(tmp_path / "kc", {"tokenFile": str(tmp_path / "tok")})
    )
    assert creds.connection_info().token == "from-file"

    basic = await load_credentials(
        write_kubeconfig(tmp_path / "kc2", {"username": "alice", "password": "pw"})
    )
    info = basic.connection_info()
    assert info.scheme == "Basic"
    assert base64.b64decode(str(info.token)) == b"alice:pw"


async def test_client_certificate_files_relative_to_the_kubeconfig(
    tmp_path: Path, certs: Path
) -> None:
    for name in ("ca.crt", "u.crt", "u.key"):
        (tmp_path / name).write_bytes((certs / name).read_bytes())
    path = write_kubeconfig(
        tmp_path / "kc",
        {"client-certificate": "u.crt", "client-key": "u.key"},
        {"certificate-authority": "ca.crt"},
    )
    info = (await load_credentials(path)).connection_info()
    assert (info.certificate_path, info.private_key_path) == (
        str(tmp_path / "u.crt"),
        str(tmp_path / "u.key"),
    )
    assert info.token is None
    context = info.as_ssl_context()  # loads the key pair and the CA
    assert context.verify_mode is ssl.CERT_REQUIRED


async def test_embedded_certificate_data(tmp_path: Path, certs: Path) -> None:
    """What kind and kubeadm write: everything inline, base64."""
    path = write_kubeconfig(
        tmp_path / "kc",
        {"client-certificate-data": b64(certs / "u.crt"), "client-key-data": b64(certs / "u.key")},
        {"certificate-authority-data": b64(certs / "ca.crt")},
    )
    creds = await load_credentials(path)
    info = creds.connection_info()
    assert read(info.certificate_path) == read(certs / "u.crt")
    assert read(info.private_key_path) == read(certs / "u.key")
    assert mode(info.private_key_path) == 0o600
    assert read(info.ca_path) == read(certs / "ca.crt")
    # The write client reads the very same files.
    cfg = creds.configuration
    assert (cfg.cert_file, cfg.key_file, cfg.ssl_ca_cert) == (
        info.certificate_path,
        info.private_key_path,
        info.ca_path,
    )
    info.as_ssl_context()


async def test_insecure_skip_tls_verify(tmp_path: Path) -> None:
    path = write_kubeconfig(tmp_path / "kc", {"token": "t"}, {"insecure-skip-tls-verify": True})
    creds = await load_credentials(path)
    info = creds.connection_info()
    assert info.insecure is True
    assert creds.configuration.verify_ssl is False
    context = info.as_ssl_context()
    assert (context.verify_mode, context.check_hostname) == (ssl.CERT_NONE, False)


async def test_exec_plugin_token_is_refreshed_on_relogin(tmp_path: Path) -> None:
    """kopf calls the login handler again after a 401: the plugin runs again, and the write
    client gets the new token too."""
    path = write_kubeconfig(tmp_path / "kc", exec_plugin(tmp_path, dt.timedelta(hours=1)))
    creds = await load_credentials(path)
    assert runs(tmp_path) == 1
    info = creds.connection_info()
    assert info.token == "exec-1"
    assert info.expiration is not None
    left = info.expiration - dt.datetime.now(dt.UTC)
    assert dt.timedelta(minutes=57) < left < dt.timedelta(minutes=60)

    login = creds.kopf_login()
    first = await asyncio.to_thread(login)  # kopf runs sync handlers in its thread pool
    assert (first.token, runs(tmp_path)) == ("exec-1", 1)  # start-up: no second run
    # A token far from expiry is not re-fetched per request.
    assert await creds.configuration.get_api_key_with_prefix("BearerToken") == "Bearer exec-1"
    again = await asyncio.to_thread(login)  # after a 401
    assert (again.token, runs(tmp_path)) == ("exec-2", 2)
    assert await creds.configuration.get_api_key_with_prefix("BearerToken") == "Bearer exec-2"


async def test_exec_plugin_token_near_expiry_is_refreshed_by_the_write_client(
    tmp_path: Path,
) -> None:
    path = write_kubeconfig(tmp_path / "kc", exec_plugin(tmp_path, dt.timedelta(seconds=30)))
    creds = await load_credentials(path)
    assert creds.connection_info().token == "exec-1"
    # Within the skew: the next request runs the plugin first.
    assert await creds.configuration.get_api_key_with_prefix("BearerToken") == "Bearer exec-2"
    # So does kopf's first login.
    info = await asyncio.to_thread(creds.kopf_login())
    assert info.token == "exec-3"


async def test_exec_plugin_without_expiry_runs_once(tmp_path: Path) -> None:
    path = write_kubeconfig(tmp_path / "kc", exec_plugin(tmp_path, None))
    creds = await load_credentials(path)
    for _ in range(3):
        await creds.configuration.get_api_key_with_prefix("BearerToken")
    info = await asyncio.to_thread(creds.kopf_login())
    assert (info.token, info.expiration, runs(tmp_path)) == ("exec-1", None, 1)


async def test_exec_plugin_client_certificate(tmp_path: Path, certs: Path) -> None:
    path = write_kubeconfig(
        tmp_path / "kc",
        exec_plugin(tmp_path, None, cert=certs),
        {"certificate-authority": str(certs / "ca.crt")},
    )
    info = (await load_credentials(path)).connection_info()
    assert info.token is None
    assert read(info.certificate_path) == read(certs / "u.crt")
    info.as_ssl_context()


async def test_in_cluster_service_account(
    tmp_path: Path, certs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "token").write_text("sa-token-1")
    (tmp_path / "ca.crt").write_bytes((certs / "ca.crt").read_bytes())
    monkeypatch.setattr(kubeconfig, "SERVICE_ACCOUNT_DIR", tmp_path)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    creds = await load_credentials(None)
    info = creds.connection_info()
    assert (info.server, info.token, info.ca_path) == (
        "https://10.0.0.1:443",
        "sa-token-1",
        str(tmp_path / "ca.crt"),
    )
    assert creds.source == "the in-cluster service account"
    login = creds.kopf_login()
    await asyncio.to_thread(login)
    (tmp_path / "token").write_text("sa-token-2")  # the kubelet rotated the projected token
    assert (await asyncio.to_thread(login)).token == "sa-token-2"


async def test_default_kubeconfig_outside_a_pod(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kubeconfig, "SERVICE_ACCOUNT_DIR", tmp_path / "absent")
    monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "kc", {"token": "t"})))
    creds = await load_credentials(None)
    assert creds.connection_info().token == "t"


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("missing-file", "does not exist"),
        ("not-yaml-config", "cannot load credentials from kubeconfig"),
        ("failing-plugin", "cannot load credentials from kubeconfig"),
        ("no-credentials", "no credentials"),
        ("tls-server-name", "tls-server-name"),
    ],
)
async def test_unusable_credentials_are_one_clear_line(
    case: str, expected: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kubeconfig, "SERVICE_ACCOUNT_DIR", tmp_path / "absent")
    path: Path | None = tmp_path / "kc"
    if case == "not-yaml-config":
        (tmp_path / "kc").write_text("apiVersion: v1\nkind: Config\n")
    elif case == "failing-plugin":
        write_kubeconfig(
            tmp_path / "kc",
            {
                "exec": {
                    "apiVersion": "client.authentication.k8s.io/v1",
                    "command": sys.executable,
                    "args": ["-c", "import sys; sys.exit('no\\nsession')"],
                }
            },
        )
    elif case == "no-credentials":
        path = None
        monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent-kubeconfig"))
    elif case == "tls-server-name":
        write_kubeconfig(tmp_path / "kc", {"token": "t"}, {"tls-server-name": "other"})

    async def load() -> None:
        (await load_credentials(path)).connection_info()

    with pytest.raises(StartupError) as info:
        await load()
    message = str(info.value)
    assert expected in message
    assert "\n" not in message


async def test_an_unreachable_api_server_is_refused_after_a_bounded_retry(tmp_path: Path) -> None:
    from kubernetes_asyncio import client

    from lattice_dev.devcluster.process import free_port

    port = free_port()  # nothing listens there
    path = tmp_path / "kc"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": f"https://127.0.0.1:{port}"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "ctx",
            }
        )
    )
    creds = await load_credentials(path)
    api = client.ApiClient(configuration=creds.configuration)
    try:
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(
            StartupError, match=r"cannot reach the API server at https://127\.0\.0\.1"
        ):
            await kubeconfig.wait_for_api(api, creds, within=1.5)
        assert 1.0 < loop.time() - started < 5
    finally:
        await api.close()


def test_connection_info_is_what_kopf_accepts(tmp_path: Path) -> None:
    """kopf refuses a ConnectionInfo with both a path and data; we only ever hand it paths."""
    creds = Credentials(None, "test")
    creds.configuration.host = SERVER
    creds.configuration.api_key["BearerToken"] = "Bearer x"
    info = creds.connection_info()
    assert isinstance(info, kopf.ConnectionInfo)
    assert (info.ca_data, info.certificate_data, info.private_key_data) == (None, None, None)
    assert json.dumps(info.as_http_headers()) == '{"Authorization": "Bearer x"}'


def test_environment_lookups_only_when_the_environment_asks(tmp_path: Path) -> None:
    home = {"HOME": str(tmp_path)}
    assert not environment_lookups_needed(home)
    assert environment_lookups_needed({**home, "HTTPS_PROXY": "http://proxy:3128"})
    assert environment_lookups_needed({**home, "no_proxy": "10.0.0.1"})
    (tmp_path / ".netrc").write_text("machine example.org login a password b\n")
    assert environment_lookups_needed(home)


def trusts_env(api: client.ApiClient) -> bool:
    return bool(cast(Any, api).rest_client.pool_manager.trust_env)


async def test_our_client_skips_the_per_request_environment_lookups(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key in list(os.environ):
        if key.lower() in ("http_proxy", "https_proxy", "all_proxy", "no_proxy", "netrc"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("HOME", str(tmp_path))
    api = client.ApiClient(configuration=client.Configuration(host="https://127.0.0.1:1"))
    try:
        assert trusts_env(api)  # what kubernetes-asyncio does
        assert skip_environment_lookups(api)
        assert not trusts_env(api)
        monkeypatch.setenv("HTTPS_PROXY", "http://proxy:3128")
        other = client.ApiClient(configuration=client.Configuration(host="https://127.0.0.1:1"))
        assert not skip_environment_lookups(other)
        assert trusts_env(other)
        await other.close()
    finally:
        await api.close()
