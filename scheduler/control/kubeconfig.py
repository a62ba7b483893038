"""How Lattice reaches the API server: one set of credentials for both of its clients, and
the start-up checks that turn a misconfigured cluster into one clear line.

Credentials. kubernetes-asyncio's loader reads the kubeconfig once into a ``Configuration``
(tokens and token files, client certificates as files or embedded ``*-data``, exec plugins
such as EKS's and GKE's, basic auth, ``insecure-skip-tls-verify``, ``proxy-url``); kopf's
``ConnectionInfo`` is derived from that same object, never parsed a second time, so the
watches and the writes cannot disagree about who we are. Embedded data is written by the
loader to private (0600) temporary files, which both clients read. Without a kubeconfig
the in-cluster service account is used, else ``$KUBECONFIG`` or ``~/.kube/config``.

Refresh. An exec plugin's token carries an expiry: the write client re-runs the plugin
shortly before it (``refresh_api_key_hook``), and kopf is told the expiry so it logs in
again in time. When kopf gets a 401 it invalidates the credentials and calls the login
handler again; every call after the first reloads the source into the shared
``Configuration`` (re-running the plugin, re-reading token files), so both clients move on
together. kopf calls a synchronous login handler in its thread pool; the reload is handed
to the event loop that owns the ``Configuration``.

Refusals. :class:`StartupError` carries one line for the operator; :func:`wait_for_api`
and :func:`require_resource` raise it for an unreachable API server (after a bounded
retry), rejected credentials, missing permissions and a missing CRD.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import os
import re
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, cast

import aiohttp
import kopf
from kubernetes_asyncio import client, config

from scheduler.control.release import ServerVersion, server_version
from scheduler.control.settings import API_GROUP, API_VERSION, PLURAL
from scheduler.control.transient import TRANSPORT_ERRORS

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
EXPIRY_SKEW = dt.timedelta(minutes=1)
"""Refresh an exec plugin's token this long before it expires."""
API_WAIT_SECONDS = 15.0
"""How long start-up keeps trying an API server that does not answer."""
LOGIN_TIMEOUT_SECONDS = 60.0
CONNECTION_ERRORS = TRANSPORT_ERRORS
"""What a dead, unreachable or hung-up API server raises (TLS failures included)."""
CRD_REMEDY = "install Lattice's CRDs first: kubectl apply -f crds/ (or install the chart)"


class StartupError(Exception):
    """The process cannot start; the message is the one line the operator reads."""


_PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy", "no_proxy", "netrc")


def environment_lookups_needed(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the environment could change a request: a proxy variable, ``NETRC`` or a
    ``~/.netrc`` file. A kubeconfig's ``proxy-url`` is passed per request and needs none."""
    env = os.environ if environ is None else environ
    if any(k.lower() in _PROXY_VARIABLES for k in env):
        return True
    return (Path(env.get("HOME") or Path.home()) / ".netrc").exists()


def skip_environment_lookups(api: client.ApiClient) -> bool:
    """kubernetes-asyncio opens its aiohttp session with ``trust_env=True``: every request
    then reads ``~/.netrc`` and the proxy variables in worker threads, two thread hops per
    binding (a third of the process's CPU in a py-spy profile of a 40 pods/s stream, and
    the hops' queueing in its latency). Off unless the environment asks for them
    (:func:`environment_lookups_needed`); True if turned off."""
    if environment_lookups_needed():
        return False
    session = cast(Any, api).rest_client.pool_manager
    session._trust_env = False  # no public setter; read by every request
    return True


def one_line(text: object, limit: int = 300) -> str:
    """Exception texts (aiohttp's, the API's) may span lines; a refusal may not."""
    flat = re.sub(r"\s+", " ", str(text)).strip()
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


class Credentials:
    """One source of credentials, loaded into one ``Configuration`` both clients use."""

    def __init__(self, kubeconfig: str | None, source: str) -> None:
        self.configuration = client.Configuration()
        self.source = source
        """What the operator configured, for messages: 'kubeconfig PATH' or the service account."""
        self.expiry: dt.datetime | None = None
        """When an exec plugin's token expires (None: it does not, or there is no plugin)."""
        self._kubeconfig = kubeconfig
        self._lock = asyncio.Lock()

    @property
    def server(self) -> str:
        return str(self.configuration.host)

    async def reload(self) -> None:
        """Read the source again into the same ``Configuration``."""
        try:
            if self._kubeconfig is None:
                config.load_incluster_config(  # type: ignore[no-untyped-call]
                    client_configuration=self.configuration,
                    token_filename=str(SERVICE_ACCOUNT_DIR / "token"),
                    cert_filename=str(SERVICE_ACCOUNT_DIR / "ca.crt"),
                )
                return
            loader = await config.load_kube_config(
                config_file=self._kubeconfig,
                client_configuration=self.configuration,
                persist_config=False,  # never write to the operator's kubeconfig
            )
        except (config.ConfigException, OSError, KeyError, TypeError, ValueError) as exc:
            raise StartupError(
                f"cannot load credentials from {self.source}: {one_line(exc)}"
            ) from exc
        key = self.configuration.api_key.get("BearerToken")
        if key:  # a tokenFile's trailing newline would end up in the header
            self.configuration.api_key["BearerToken"] = key.strip()
        expiry: dt.datetime | None = getattr(loader, "exec_plugin_expiry", None)
        self.expiry = expiry if expiry is None or expiry.tzinfo else expiry.replace(tzinfo=dt.UTC)
        self.configuration.refresh_api_key_hook = self._refresh_if_expiring

    def _expiring(self) -> bool:
        return self.expiry is not None and dt.datetime.now(dt.UTC) >= self.expiry - EXPIRY_SKEW

    async def _refresh_if_expiring(self, _: client.Configuration) -> None:
        """Called by kubernetes-asyncio before every request: cheap unless a token expires."""
        if self._expiring():
            async with self._lock:
                if self._expiring():
                    await self.reload()

    def connection_info(self, *, trust_env: bool = False) -> kopf.ConnectionInfo:
        """kopf's view of the current credentials, derived from the ``Configuration``."""
        cfg = self.configuration
        if getattr(cfg, "tls_server_name", None):
            raise StartupError(
                f"{self.source} sets tls-server-name, which the watch client (kopf) cannot "
                "honour; point server at a name the API server's certificate carries"
            )
        header = cfg.api_key.get("BearerToken")
        parts = header.split(" ", 1) if header else []
        scheme, token = (
            (None, None) if not parts else (None, parts[0]) if len(parts) == 1 else parts
        )
        return kopf.ConnectionInfo(
            server=self.server,
            ca_path=cfg.ssl_ca_cert,
            insecure=not cfg.verify_ssl,
            scheme=scheme,
            token=token,
            certificate_path=cfg.cert_file,
            private_key_path=cfg.key_file,
            proxy_url=cfg.proxy,
            expiration=self.expiry - EXPIRY_SKEW if self.expiry is not None else None,
            trust_env=trust_env,
        )

    def kopf_login(self) -> Callable[..., kopf.ConnectionInfo]:
        """A login handler for kopf; must be created on the loop that owns the clients."""
        loop = asyncio.get_running_loop()
        calls = 0

        def login(
            *, settings: kopf.OperatorSettings | None = None, **_: Any
        ) -> kopf.ConnectionInfo:
            nonlocal calls
            calls += 1
            trust_env = settings.networking.trust_env if settings is not None else False
            if calls > 1 or self._expiring():  # a 401 or an expiry: read the source again
                in_loop_thread = False
                with contextlib.suppress(RuntimeError):  # no loop here: kopf's thread pool
                    in_loop_thread = asyncio.get_running_loop() is loop
                if in_loop_thread:  # kopf ran us on the loop: cannot wait, use what we have
                    return self.connection_info(trust_env=trust_env)
                future = asyncio.run_coroutine_threadsafe(self._locked_reload(), loop)
                try:
                    future.result(timeout=LOGIN_TIMEOUT_SECONDS)
                except StartupError as exc:
                    raise kopf.LoginError(str(exc)) from exc
            return self.connection_info(trust_env=trust_env)

        return login

    async def _locked_reload(self) -> None:
        async with self._lock:
            await self.reload()


def choose_source(kubeconfig: Path | None) -> Credentials:
    """``kubeconfig`` if given, else the service account in a pod, else the default kubeconfig."""
    if kubeconfig is not None:
        if not kubeconfig.is_file():
            raise StartupError(f"kubeconfig {kubeconfig} does not exist or is not a file")
        return Credentials(str(kubeconfig), f"kubeconfig {kubeconfig}")
    if (SERVICE_ACCOUNT_DIR / "token").is_file() and os.environ.get("KUBERNETES_SERVICE_HOST"):
        return Credentials(None, "the in-cluster service account")
    default = os.environ.get("KUBECONFIG") or str(Path.home() / ".kube" / "config")
    first = default.split(os.pathsep)[0]
    if not first or not Path(first).expanduser().is_file():
        raise StartupError(
            "no credentials: not running in a pod (no service account token), and no "
            "--kubeconfig, $KUBECONFIG or ~/.kube/config"
        )
    return Credentials(default, f"kubeconfig {default}")


async def load_credentials(kubeconfig: Path | None) -> Credentials:
    """Credentials from :func:`choose_source`, loaded; nothing is sent to the API server."""
    creds = choose_source(kubeconfig)
    await creds.reload()
    if not creds.configuration.host:
        raise StartupError(f"{creds.source} names no API server")
    creds.connection_info()  # what kopf cannot use is refused now, not at its first login
    return creds


def describe_api_error(exc: client.ApiException, creds: Credentials, doing: str) -> str:
    """One line for an API error met at start-up, saying what to do about it."""
    if exc.status == 401:
        return (
            f"the API server at {creds.server} rejected the credentials of {creds.source} "
            f"(401 Unauthorized) while {doing}"
        )
    if exc.status == 403:
        return (
            f"forbidden while {doing} ({creds.source}): grant the RBAC in manifests/scheduler.yaml "
            f"(or install the chart); the API server said: {one_line(_api_message(exc))}"
        )
    said = one_line(_api_message(exc))
    return f"the API server answered {exc.status} {exc.reason} while {doing}: {said}"


def _api_message(exc: client.ApiException) -> str:
    try:
        body = json.loads(exc.body or "")
    except (TypeError, ValueError):
        return str(exc.reason)
    return str(body.get("message") or exc.reason) if isinstance(body, dict) else str(exc.reason)


async def wait_for_api(
    api: client.ApiClient, creds: Credentials, within: float = API_WAIT_SECONDS
) -> ServerVersion | None:
    """GET /version until it answers, and what it said (None: an answer without a readable
    version); a server that never answers is a clear refusal."""
    deadline = time.monotonic() + within
    delay = 0.5
    attempts = 0
    while True:
        attempts += 1
        try:
            info = await client.VersionApi(api).get_code(_request_timeout=min(5.0, within))
            return server_version(info)
        except client.ApiException as exc:
            if exc.status not in (429, 500, 502, 503, 504):  # 401, 403, ...: no use retrying
                raise StartupError(describe_api_error(exc, creds, "reading /version")) from exc
            reason = f"{exc.status} {exc.reason}"
        except aiohttp.ClientSSLError as exc:  # a wrong CA or server name: retrying cannot help
            raise StartupError(
                f"TLS with the API server at {creds.server} failed ({creds.source}): "
                f"{one_line(exc)}"
            ) from exc
        except CONNECTION_ERRORS as exc:
            reason = one_line(exc) or type(exc).__name__
        left = deadline - time.monotonic()
        if left <= 0:
            raise StartupError(
                f"cannot reach the API server at {creds.server} ({creds.source}) after "
                f"{attempts} attempts over {within:.0f}s: {reason}"
            )
        await asyncio.sleep(min(delay, left))
        delay = min(delay * 2, 4.0)


async def serves(api: client.ApiClient, *, group: str, version: str, plural: str) -> bool:
    """Whether the API server serves ``plural`` in ``group/version`` (discovery; a group
    version it does not serve at all is a 404). For resources whose version follows the
    release and its gates, such as ``devicetaintrules`` (v1 only from 1.37)."""
    try:
        found = await client.CustomObjectsApi(api).get_api_resources(group, version)
    except client.ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return plural in {r.name for r in (found.resources or [])}


async def require_resource(
    api: client.ApiClient,
    creds: Credentials,
    *,
    group: str,
    version: str,
    plural: str,
    remedy: str,
    within: float = 5.0,
) -> None:
    """Refuse to start without a CRD we need. A CRD applied together with the Deployment may
    not be served yet, so a missing one is looked up again for a few seconds."""
    deadline = time.monotonic() + within
    while True:
        try:
            found = await client.CustomObjectsApi(api).get_api_resources(group, version)
            names = {r.name for r in (found.resources or [])}
            if plural in names:
                return
        except client.ApiException as exc:
            if exc.status != 404:
                raise StartupError(
                    describe_api_error(exc, creds, f"looking up {group}/{version}")
                ) from exc
        if time.monotonic() >= deadline:
            raise StartupError(
                f"the API server at {creds.server} does not serve {plural}.{group}/{version}: "
                f"{remedy}"
            )
        await asyncio.sleep(1.0)


async def require_lattice_crds(api: client.ApiClient, creds: Credentials) -> None:
    """`lattice run` refuses to start without its LatticeScheduler CRD: its profile and
    status live there, so running without it would hide a broken install."""
    await require_resource(
        api, creds, group=API_GROUP, version=API_VERSION, plural=PLURAL, remedy=CRD_REMEDY
    )
