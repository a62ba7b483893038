"""The local control plane: etcd, kube-apiserver, kube-controller-manager, kwok
and optionally kube-scheduler, on free loopback ports, with state in one folder.

``DevCluster(state_dir).up(config)`` starts everything and waits until the API
server is ready and every fake node is Ready and untainted (the wait's budget
grows with the node count and it gives up early once no node has turned Ready
for a while: :class:`ReadyPolicy`); ``down()`` stops each process it started,
by pid, and removes the folder. ``state.json`` in the folder is the only record
of what runs, so a second ``up`` sees the first and refuses to start a twin.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from lattice_dev.devcluster import pki, process
from lattice_dev.devcluster.build import Binaries, cache_root, checkout_path, ensure_binaries
from lattice_dev.devcluster.profiles import get_profile, node_name

ADMIN_KUBECONFIG = "kubeconfig"
LATTICE_USER = pki.User("lattice-scheduler")
AGENT_USER = pki.User("lattice-agent")
USERS = [pki.ADMIN, pki.KUBE_SCHEDULER, pki.KWOK, LATTICE_USER, AGENT_USER]
CERT_USERS = [LATTICE_USER]
"""Users that also get a kubeconfig with embedded client-certificate data, as kind writes."""
KCM_USER = pki.User("kube-controller-manager-dev", ("system:masters",))


class DevClusterError(RuntimeError):
    """The control plane could not be started or reached; the message says why."""


class AlreadyRunning(DevClusterError):
    """A devcluster already runs from this state folder."""


def default_state_dir() -> Path:
    env = os.environ.get("LATTICE_STATE_DIR")
    return Path(env) if env else cache_root() / "devcluster"


@dataclass
class ClusterConfig:
    """What to start; defaults suit a laptop-sized demo."""

    nodes: int = 3
    node_profile: str = "standard"
    with_kube_scheduler: bool = False
    kube_scheduler_qps: float = 500.0
    """Client QPS for kube-scheduler; raised from client-go's 50 so it is not the bottleneck."""
    kube_scheduler_burst: int = 1000
    percentage_of_nodes_to_score: int | None = None
    """Passed to kube-scheduler; None keeps its adaptive default."""
    kube_scheduler_profiles: tuple[dict[str, Any], ...] = ()
    """KubeSchedulerConfiguration ``profiles`` (one kube-scheduler serving several
    schedulerNames); empty keeps its single default profile."""
    node_ready_timeout: float = 120.0
    """Base of the readiness budget; :attr:`node_ready_per_node` is added per node."""
    node_ready_per_node: float = 0.1
    """Seconds of budget per node: kwok and the node lifecycle controller make a few
    dozen nodes Ready per second on 2 cores, so 5000 nodes need minutes, not 120 s."""
    real_node: bool = False
    """Also run one real kubelet (containerd + runc) on this machine: see realnode.py."""
    node_ready_stall: float = 60.0
    """Give up once this long passed without one more node Ready (however much budget
    is left): a stuck kwok or controller is reported in a minute, not after the budget."""
    feature_gates: tuple[str, ...] = ()
    """``Name=true|false`` for kube-apiserver, kube-controller-manager and kube-scheduler, as
    an operator sets them on every component (``GenericWorkload=true`` for Kubernetes' own
    PodGroup); empty: the release's defaults."""
    runtime_config: tuple[str, ...] = ()
    """kube-apiserver ``--runtime-config`` entries (``scheduling.k8s.io/v1beta1=true``)."""

    def validate(self) -> None:
        if self.nodes < 0:
            raise ValueError("nodes must be >= 0")
        if self.node_ready_timeout <= 0 or self.node_ready_stall <= 0:
            raise ValueError("node_ready_timeout and node_ready_stall must be > 0")
        if self.node_ready_per_node < 0:
            raise ValueError("node_ready_per_node must be >= 0")
        get_profile(self.node_profile)
        for gate in self.feature_gates:
            name, sep, value = gate.partition("=")
            if not name or sep != "=" or value not in ("true", "false"):
                raise ValueError(f"feature gate {gate!r}: expected Name=true or Name=false")
        for entry in self.runtime_config:
            if "=" not in entry:
                raise ValueError(f"runtime-config {entry!r}: expected group/version=true")
        if self.percentage_of_nodes_to_score is not None and not (
            0 <= self.percentage_of_nodes_to_score <= 100
        ):
            raise ValueError("percentage_of_nodes_to_score must be in 0..100")


@dataclass
class ClusterState:
    """What runs: written to state.json after each component starts."""

    state_dir: str
    binaries: str
    ports: dict[str, int] = field(default_factory=dict)
    pids: dict[str, int] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    started_at: float = 0.0
    names: dict[str, str] = field(default_factory=dict)
    """Component -> how its process is recognised, for processes that are not
    control-plane binaries (see :func:`process.is_running`)."""
    argv: dict[str, list[str]] = field(default_factory=dict)
    """Component -> the command line it was started with, so it can be restarted as it was."""

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports['apiserver']}"


Progress = Callable[[str], None]
"""Gets a human-readable line about the start-up, e.g. ``1200/5000 nodes Ready after 40 s``."""


@dataclass(frozen=True)
class ReadyPolicy:
    """When to stop waiting for nodes: a budget that scales with the count, and a
    stall limit, so a big cluster that is still progressing is waited for and a
    stuck one fails fast. Pure: :meth:`give_up` is a function of times and counts."""

    total: int
    budget_s: float
    stall_s: float

    @classmethod
    def for_config(cls, config: ClusterConfig) -> ReadyPolicy:
        return cls(
            total=config.nodes,
            budget_s=config.node_ready_timeout + config.node_ready_per_node * config.nodes,
            stall_s=config.node_ready_stall,
        )

    def give_up(self, *, elapsed_s: float, ready: int, since_new_s: float) -> str | None:
        """Why to stop waiting, saying how far it got; None to keep waiting (or done).

        ``since_new_s`` is the time since the best Ready count last grew (since the
        wait began if no node is Ready yet)."""
        if ready >= self.total:
            return None
        got = f"{ready}/{self.total} nodes Ready after {elapsed_s:.0f} s"
        if since_new_s >= self.stall_s:
            return f"{got}, none new for {since_new_s:.0f} s"
        if elapsed_s >= self.budget_s:
            return f"{got} (budget {self.budget_s:.0f} s), last new one {since_new_s:.0f} s ago"
        return None


@dataclass
class ReadyTracker:
    """Feeds :class:`ReadyPolicy` from polls: the best count so far and when it grew
    (a node that flaps back to NotReady does not reset the stall clock)."""

    policy: ReadyPolicy
    started: float
    best: int = 0
    grew_at: float = 0.0

    def __post_init__(self) -> None:
        self.grew_at = self.started

    @property
    def done(self) -> bool:
        return self.best >= self.policy.total

    def observe(self, now: float, ready: int) -> str | None:
        """Record one poll's Ready count at ``now``; why to give up, or None."""
        if ready > self.best:
            self.best, self.grew_at = ready, now
        return self.policy.give_up(
            elapsed_s=now - self.started, ready=self.best, since_new_s=now - self.grew_at
        )

    def line(self, now: float) -> str:
        return f"{self.best}/{self.policy.total} nodes Ready after {now - self.started:.0f} s"


def raw_node_ready(node: dict[str, Any]) -> bool:
    """Ready=True and no not-ready/unreachable taint, on a raw Node body (the wait
    lists raw JSON: deserialising 5000 V1Node models per poll costs seconds of CPU
    that kwok and the API server need to make those nodes Ready)."""
    conditions = (node.get("status") or {}).get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    taints = (node.get("spec") or {}).get("taints") or []
    blocked = any(
        t.get("key") in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
        for t in taints
    )
    return ready and not blocked


class DevCluster:
    """One local control plane rooted at a state folder."""

    def __init__(self, state_dir: Path | None = None) -> None:
        self.state_dir = (state_dir or default_state_dir()).resolve()

    # -- paths -------------------------------------------------------------
    @property
    def state_file(self) -> Path:
        return self.state_dir / "state.json"

    @property
    def kubeconfig(self) -> Path:
        return self.state_dir / ADMIN_KUBECONFIG

    def kubeconfig_for(self, user: str, *, embedded_cert: bool = False) -> Path:
        """The user's kubeconfig: a bearer token, or (``embedded_cert``, for
        :data:`CERT_USERS`) ``client-certificate-data``/``client-key-data`` and
        ``certificate-authority-data``, the shape kind and kubeadm write."""
        suffix = "cert.kubeconfig" if embedded_cert else "kubeconfig"
        return self.state_dir / "kubeconfigs" / f"{user}.{suffix}"

    def log(self, component: str) -> Path:
        return self.state_dir / "logs" / f"{component}.log"

    # -- state -------------------------------------------------------------
    def load_state(self) -> ClusterState | None:
        try:
            raw = json.loads(self.state_file.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise DevClusterError(f"unreadable state file {self.state_file}: {exc}") from exc
        return ClusterState(**raw)

    def _save(self, state: ClusterState) -> None:
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(state), indent=2))
        tmp.replace(self.state_file)

    def running(self) -> dict[str, bool]:
        """Component -> alive, for the components recorded in the state file."""
        state = self.load_state()
        if state is None:
            return {}
        return {
            name: process.is_running(pid, state.names.get(name, name))
            for name, pid in state.pids.items()
        }

    # -- lifecycle ---------------------------------------------------------
    def up(
        self,
        config: ClusterConfig | None = None,
        binaries: Binaries | None = None,
        progress: Progress | None = None,
    ) -> ClusterState:
        """Start the control plane and fake nodes; return once all are ready.

        ``progress`` gets a line now and then while nodes become Ready (and the
        final count); without it the wait is silent."""
        config = config or ClusterConfig()
        config.validate()
        alive = self.running()
        if any(alive.values()):
            raise AlreadyRunning(
                f"a devcluster is already running from {self.state_dir} "
                f"({', '.join(n for n, a in alive.items() if a)}); "
                "use `lattice devcluster down` first or pick another --state-dir"
            )
        if self.state_dir.exists():
            shutil.rmtree(self.state_dir)  # leftovers of a crashed run: nothing runs from them
        bins = binaries or ensure_binaries()
        self.state_dir.mkdir(parents=True)
        started = time.monotonic()
        state = ClusterState(
            state_dir=str(self.state_dir),
            binaries=str(bins.directory),
            config=asdict(config),
            started_at=time.time(),
        )
        try:
            self._write_credentials(state)
            self._start_etcd(state, bins)
            self._start_apiserver(state, bins)
            self._start_controller_manager(state, bins)
            self._start_kwok(state, bins)
            asyncio.run(self._create_nodes(config))
            self._simulate_agents(state, bins, config)
            if config.real_node:
                self._start_real_node(state, progress)
            if config.with_kube_scheduler:
                self._start_kube_scheduler(state, bins, config)
            asyncio.run(self._wait_nodes_ready(config, progress))
            if config.real_node:
                self._wait_real_node(state, bins)
        except BaseException:
            self._stop_processes(state)
            raise
        state.config["ready_seconds"] = round(time.monotonic() - started, 2)
        self._save(state)
        return state

    def down(self) -> list[str]:
        """Stop every process this folder started and remove the folder."""
        state = self.load_state()
        stopped: list[str] = []
        if state is not None:
            stopped = self._stop_processes(state)
        if self.state_dir.exists():
            from lattice_dev.devcluster import realnode

            realnode.unmount_below(self.state_dir)
            shutil.rmtree(self.state_dir)
        return stopped

    def _stop_processes(self, state: ClusterState) -> list[str]:
        stopped = []
        if "containerd" in state.pids:
            from lattice_dev.devcluster import realnode

            # kubelet first, then the containers it started, while containerd still runs.
            if "kubelet" in state.pids and process.stop(state.pids.pop("kubelet"), "kubelet"):
                stopped.append("kubelet")
            realnode.kill_containers(realnode.Layout(self.state_dir / "real-node"))
            if "kube-proxy" in state.pids:
                if process.stop(state.pids.pop("kube-proxy"), "kube-proxy"):
                    stopped.append("kube-proxy")
                realnode.cleanup_proxy_rules()
            realnode.remove_bridge()
        # Clients first, etcd last, so nothing logs a storm of connection errors.
        for name in reversed(list(state.pids)):
            if process.stop(state.pids[name], state.names.get(name, name)):
                stopped.append(name)
        return stopped

    def start_process(self, name: str, argv: list[str], marker: str) -> int:
        """Start another process that belongs to this cluster (e.g. `lattice run`):
        recorded like the components, so `down` stops it too."""
        state = self.load_state()
        if state is None:
            raise DevClusterError(f"no devcluster at {self.state_dir}")
        state.names[name] = f"{Path(argv[0]).name}|{marker}"
        self._start(state, name, Path(argv[0]), argv[1:])
        return state.pids[name]

    def start_kube_scheduler(self, config: ClusterConfig) -> int:
        """Start kube-scheduler on a running cluster (benchmarks start it per run)."""
        state = self.load_state()
        if state is None:
            raise DevClusterError(f"no devcluster at {self.state_dir}")
        self._start_kube_scheduler(state, Binaries(Path(state.binaries)), config)
        return state.pids["kube-scheduler"]

    def restart_component(
        self, name: str, *, while_down: Callable[[], None] | None = None
    ) -> float:
        """Stop one component and start it again with the same command line (so the same
        ports and data), then wait until it is ready as :meth:`up` does; return how many
        seconds it was down. For tests of clients that must survive the control plane
        going away: e.g. a watch resumed across an API server restart gets 410 Gone.

        ``while_down`` runs between the stop and the start; what it changes (straight in
        etcd, with the API server down) no watcher can have seen as an event."""
        state = self.load_state()
        if state is None or name not in state.argv:
            raise DevClusterError(f"no {name} recorded in {self.state_dir} to restart")
        process.stop(state.pids[name], state.names.get(name, name))
        stopped = time.monotonic()
        try:
            if while_down is not None:
                while_down()
        finally:  # a failing hook must not leave the cluster without the component
            argv = state.argv[name]
            self._start(state, name, Path(argv[0]), argv[1:])
            self._wait_ready(state, name)
        return time.monotonic() - stopped

    def node_image(self) -> str:
        """The Lattice image imported into the real node at ``up`` (``--real-node``)."""
        state = self.load_state()
        ref = state.config.get("lattice_image") if state is not None else None
        if not ref:
            raise DevClusterError("no real node with a Lattice image in this cluster")
        return str(ref)

    def stop_component(self, name: str) -> bool:
        """Stop one recorded process (SIGTERM, then SIGKILL) and forget it."""
        state = self.load_state()
        if state is None or name not in state.pids:
            return False
        stopped = process.stop(state.pids.pop(name), state.names.pop(name, name))
        state.argv.pop(name, None)
        self._save(state)
        return stopped

    # -- components --------------------------------------------------------
    def _write_credentials(self, state: ClusterState) -> None:
        pki.write_pki(self.state_dir / "pki")
        state.ports = {
            "etcd": process.free_port(),
            "etcd-peer": process.free_port(),
            "apiserver": process.free_port(),
            "kube-controller-manager": process.free_port(),
            "kube-scheduler": process.free_port(),
            "kwok": process.free_port(),
        }
        tokens = pki.write_token_file(self.state_dir / "pki" / "tokens.csv", [*USERS, KCM_USER])
        (self.state_dir / "kubeconfigs").mkdir()
        for user, token in tokens.items():
            self._write_kubeconfig(self.kubeconfig_for(user), state, user, token)
        for cert_user in CERT_USERS:
            self._write_cert_kubeconfig(state, cert_user)
        shutil.copy(self.kubeconfig_for(pki.ADMIN.name), self.kubeconfig)
        self._save(state)

    def _write_cert_kubeconfig(self, state: ClusterState, user: pki.User) -> None:
        pkid = self.state_dir / "pki"
        cert, key = pki.write_client_cert(pkid, user)

        def b64(path: Path) -> str:
            return base64.standard_b64encode(path.read_bytes()).decode("ascii")

        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "lattice-dev",
                    "cluster": {
                        "server": state.server,
                        "certificate-authority-data": b64(pkid / "ca.crt"),
                    },
                }
            ],
            "users": [
                {
                    "name": user.name,
                    "user": {"client-certificate-data": b64(cert), "client-key-data": b64(key)},
                }
            ],
            "contexts": [
                {"name": "lattice-dev", "context": {"cluster": "lattice-dev", "user": user.name}}
            ],
            "current-context": "lattice-dev",
        }
        path = self.kubeconfig_for(user.name, embedded_cert=True)
        path.touch(mode=0o600)
        path.write_text(yaml.safe_dump(doc, sort_keys=False))

    def _write_kubeconfig(self, path: Path, state: ClusterState, user: str, token: str) -> None:
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "lattice-dev",
                    "cluster": {
                        "server": state.server,
                        "certificate-authority": str(self.state_dir / "pki" / "ca.crt"),
                    },
                }
            ],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [
                {"name": "lattice-dev", "context": {"cluster": "lattice-dev", "user": user}}
            ],
            "current-context": "lattice-dev",
        }
        path.touch(mode=0o600)
        path.write_text(yaml.safe_dump(doc, sort_keys=False))

    def _start(self, state: ClusterState, name: str, binary: Path, args: list[str]) -> None:
        state.pids[name] = process.start(binary, args, self.log(name))
        state.argv[name] = [str(binary), *args]
        self._save(state)

    def _wait_ready(self, state: ClusterState, name: str) -> None:
        """Wait until a just-started component answers its health check (kwok and other
        processes without one: until it is seen running)."""
        if name == "etcd":
            url = f"http://127.0.0.1:{state.ports['etcd']}/health"
            self._wait_http(state, name, url, lambda body: b'"health":"true"' in body)
        elif name == "kube-apiserver":
            self._wait_http(
                state,
                name,
                f"{state.server}/readyz",
                lambda body: body.strip() == b"ok",
                token_user=pki.ADMIN.name,
                timeout=90,
            )
        elif name in ("kube-controller-manager", "kube-scheduler"):
            self._wait_https_any(state, name, name)
        else:
            self._check_alive(state, name)

    def _start_etcd(self, state: ClusterState, bins: Binaries) -> None:
        client = f"http://127.0.0.1:{state.ports['etcd']}"
        peer = f"http://127.0.0.1:{state.ports['etcd-peer']}"
        self._start(
            state,
            "etcd",
            bins.etcd,
            [
                "--name=lattice-dev",
                f"--data-dir={self.state_dir / 'etcd'}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=lattice-dev={peer}",
                "--listen-metrics-urls=",
                # A throwaway cluster: durability buys nothing and fsync costs the tests.
                "--unsafe-no-fsync",
                "--quota-backend-bytes=8589934592",
                "--log-level=warn",
            ],
        )
        self._wait_ready(state, "etcd")

    def _start_apiserver(self, state: ClusterState, bins: Binaries) -> None:
        pkid = self.state_dir / "pki"
        # Logs, exec and port-forward go from the API server to the real node's kubelet,
        # which authenticates clients by certificate: give the server one, as kubeadm does,
        # and dial nodes by address (nothing resolves the node's name here).
        kubelet_cert, kubelet_key = pki.write_client_cert(pkid, pki.APISERVER_KUBELET_CLIENT)
        self._start(
            state,
            "kube-apiserver",
            bins.kube_apiserver,
            [
                f"--etcd-servers=http://127.0.0.1:{state.ports['etcd']}",
                "--bind-address=127.0.0.1",
                # With a real node, pods reach the API server through the `kubernetes`
                # Service (kube-proxy) at the node's bridge address, forwarded to loopback.
                f"--advertise-address={self._advertise_address(state)}",
                *self._endpoint_reconciler(state),
                f"--secure-port={state.ports['apiserver']}",
                f"--tls-cert-file={pkid / 'apiserver.crt'}",
                f"--tls-private-key-file={pkid / 'apiserver.key'}",
                f"--client-ca-file={pkid / 'ca.crt'}",
                f"--token-auth-file={pkid / 'tokens.csv'}",
                "--authorization-mode=Node,RBAC",
                # A node may change only itself and its pods (the real node's kubelet).
                "--enable-admission-plugins=NodeRestriction",
                "--anonymous-auth=false",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pkid / 'sa.pub'}",
                f"--service-account-signing-key-file={pkid / 'sa.key'}",
                "--service-cluster-ip-range=10.0.0.0/24",
                "--allow-privileged=true",
                # Benchmarks push thousands of writes per second through one apiserver.
                "--max-requests-inflight=3000",
                "--max-mutating-requests-inflight=1000",
                "--profiling=false",
                # On SIGTERM, end open watches and exit within seconds: without it the
                # server stops listening at once but lingers until it is killed 10 s later
                # (restart_component, and clients' reconnects, wait for that).
                "--shutdown-watch-termination-grace-period=2s",
                f"--kubelet-client-certificate={kubelet_cert}",
                f"--kubelet-client-key={kubelet_key}",
                "--kubelet-preferred-address-types=InternalIP,Hostname",
                *_gates(state),
                *_runtime_config(state),
                "--v=1",
            ],
        )
        self._wait_ready(state, "kube-apiserver")

    def _retry_on_taken_port(
        self, state: ClusterState, name: str, start: Callable[[], None]
    ) -> None:
        """Start a component; if it exited because another process took its port between
        our choice and its bind, choose another and start it again (twice at most)."""
        for attempt in range(3):
            try:
                start()
                return
            except DevClusterError:
                if attempt == 2 or not process.port_taken(self.log(name)):
                    raise
                state.pids.pop(name, None)
                state.ports[name] = process.free_port()
                with self.log(name).open("a") as fh:
                    fh.write(
                        f"\n# lattice devcluster: port taken, retrying on {state.ports[name]}\n"
                    )

    def _start_controller_manager(self, state: ClusterState, bins: Binaries) -> None:
        self._retry_on_taken_port(
            state,
            "kube-controller-manager",
            lambda: self._start_controller_manager_once(state, bins),
        )

    def _start_controller_manager_once(self, state: ClusterState, bins: Binaries) -> None:
        pkid = self.state_dir / "pki"
        self._start(
            state,
            "kube-controller-manager",
            bins.kube_controller_manager,
            [
                f"--kubeconfig={self.kubeconfig_for(KCM_USER.name)}",
                *_gates(state),
                "--bind-address=127.0.0.1",
                f"--secure-port={state.ports['kube-controller-manager']}",
                f"--cert-dir={self.state_dir / 'kcm-certs'}",
                "--leader-elect=false",
                f"--service-account-private-key-file={pkid / 'sa.key'}",
                f"--root-ca-file={pkid / 'ca.crt'}",
                "--use-service-account-credentials=false",
                # No real network: pod CIDRs are kwok's. (The cloud controllers are gone
                # from 1.37's kube-controller-manager and no-ops in 1.35-1.36.)
                "--controllers=*,-nodeipam",
                # Lift the not-ready taint soon after kwok reports a node Ready.
                "--node-monitor-period=1s",
                # The PV binder retries a conflicted bind at its resync (default 15 s): a
                # claim created beside its PV could stay Pending that long.
                "--pvclaimbinder-sync-period=1s",
                "--kube-api-qps=500",
                "--kube-api-burst=1000",
                "--v=1",
            ],
        )
        self._wait_ready(state, "kube-controller-manager")

    def _start_kwok(self, state: ClusterState, bins: Binaries) -> None:
        self._start(
            state,
            "kwok",
            bins.kwok,
            [
                f"--kubeconfig={self.kubeconfig_for(pki.KWOK.name)}",
                f"--config={bins.kwok_stages}",
                "--manage-all-nodes=false",
                "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
                "--node-lease-duration-seconds=40",
                "--cidr=10.244.0.0/16",
                "--node-ip=10.250.0.1",
                f"--server-address=127.0.0.1:{state.ports['kwok']}",
            ],
        )

    @classmethod
    def _endpoint_reconciler(cls, state: ClusterState) -> list[str]:
        """Since 1.37 the lease reconciler refuses a loopback address for the `kubernetes`
        Service's endpoints; without a real node nothing dials that Service, so none."""
        if cls._advertise_address(state).startswith("127."):
            return ["--endpoint-reconciler-type=none"]
        return []

    @staticmethod
    def _advertise_address(state: ClusterState) -> str:
        from lattice_dev.devcluster import realnode

        return realnode.NODE_IP if state.config.get("real_node") else "127.0.0.1"

    def _start_real_node(self, state: ClusterState, progress: Progress | None) -> None:
        """containerd and a kubelet registered as :data:`realnode.NODE_NAME` (its own
        client certificate), with the pause and Lattice images imported."""
        from lattice_dev.devcluster import image, realnode

        say = progress or realnode._say
        realnode.ensure_packages(say)
        image.ensure_tools(say)
        node_bins = realnode.ensure_node_binaries(say)
        built = image.ensure_image(say)
        archives = [realnode.ensure_pause(say), built.archive]
        # The image the node has: a later ensure_image() builds another tag when the tree
        # changed meanwhile (an edit during a test run), which this node would not have.
        state.config["lattice_image"] = built.ref
        realnode.ensure_bridge()
        pkid = self.state_dir / "pki"
        cert, key = pki.write_client_cert(
            pkid, pki.User(f"system:node:{realnode.NODE_NAME}", ("system:nodes",))
        )
        layout = realnode.Layout(self.state_dir / "real-node")
        realnode.write_files(
            layout,
            server=state.server,
            ca=pkid / "ca.crt",
            cert=cert,
            key=key,
            ports=(process.free_port(), process.free_port()),
        )
        containerd = shutil.which("containerd")
        if containerd is None:
            raise DevClusterError("containerd not found after installing it")
        self._start(
            state, "containerd", Path(containerd), ["--config", str(layout.containerd_config)]
        )
        realnode.wait_socket(layout)
        realnode.import_images(layout, archives)
        self._start(state, "kubelet", node_bins / "kubelet", realnode.kubelet_args(layout))
        # The API server for pods: the node's bridge address, forwarded to loopback, and
        # kube-proxy turning the `kubernetes` Service into that address.
        port = state.ports["apiserver"]
        socat = shutil.which("socat")
        if socat is None:
            raise DevClusterError("socat not found after installing it")
        self._start(state, "socat", Path(socat), realnode.forwarder_args(port))
        proxy_cert, proxy_key = pki.write_client_cert(pkid, pki.User("system:kube-proxy"))
        realnode.write_proxy_files(
            layout,
            server=state.server,
            ca=pkid / "ca.crt",
            cert=proxy_cert,
            key=proxy_key,
            ports=(process.free_port(), process.free_port()),
        )
        self._start(state, "kube-proxy", node_bins / "kube-proxy", realnode.proxy_args(layout))
        state.config["real_node_name"] = realnode.NODE_NAME
        self._save(state)

    def _wait_real_node(self, state: ClusterState, bins: Binaries, timeout: float = 120) -> None:
        from lattice_dev.devcluster import realnode

        deadline = time.monotonic() + timeout
        while True:
            self._check_alive(state, "kubelet")
            done = subprocess.run(
                [
                    str(bins.kubectl),
                    f"--kubeconfig={self.kubeconfig}",
                    "get",
                    "node",
                    realnode.NODE_NAME,
                    "-o",
                    "json",
                ],
                capture_output=True,
                check=False,
            )
            if done.returncode == 0 and raw_node_ready(json.loads(done.stdout)):
                return
            if time.monotonic() > deadline:
                raise DevClusterError(
                    f"the real node {realnode.NODE_NAME} was not Ready in {timeout:.0f}s; "
                    f"logs: {self.log('kubelet')}, {self.log('containerd')}"
                )
            time.sleep(1)

    def _start_kube_scheduler(
        self, state: ClusterState, bins: Binaries, config: ClusterConfig
    ) -> None:
        self._retry_on_taken_port(
            state, "kube-scheduler", lambda: self._start_kube_scheduler_once(state, bins, config)
        )

    def _start_kube_scheduler_once(
        self, state: ClusterState, bins: Binaries, config: ClusterConfig
    ) -> None:
        sched_cfg: dict[str, Any] = {
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "clientConnection": {
                "kubeconfig": str(self.kubeconfig_for(pki.KUBE_SCHEDULER.name)),
                "qps": config.kube_scheduler_qps,
                "burst": config.kube_scheduler_burst,
            },
            "leaderElection": {"leaderElect": False},
        }
        if config.percentage_of_nodes_to_score is not None:
            sched_cfg["percentageOfNodesToScore"] = config.percentage_of_nodes_to_score
        if config.kube_scheduler_profiles:
            sched_cfg["profiles"] = list(config.kube_scheduler_profiles)
        cfg_path = self.state_dir / "kube-scheduler.yaml"
        cfg_path.write_text(yaml.safe_dump(sched_cfg))
        self._start(
            state,
            "kube-scheduler",
            bins.kube_scheduler,
            [
                f"--config={cfg_path}",
                *_gates(state),
                "--bind-address=127.0.0.1",
                f"--secure-port={state.ports['kube-scheduler']}",
                f"--cert-dir={self.state_dir / 'kube-scheduler-certs'}",
                f"--authentication-kubeconfig={self.kubeconfig_for(pki.KUBE_SCHEDULER.name)}",
                f"--authorization-kubeconfig={self.kubeconfig_for(pki.KUBE_SCHEDULER.name)}",
                "--v=1",
            ],
        )
        self._wait_ready(state, "kube-scheduler")

    # -- waiting -----------------------------------------------------------
    def _check_alive(self, state: ClusterState, name: str) -> None:
        if not process.is_running(state.pids[name], state.names.get(name, name)):
            raise DevClusterError(
                f"{name} exited during start-up "
                f"({process.exit_status(state.pids[name])}); last lines of {self.log(name)}:\n"
                + process.log_tail(self.log(name))
            )

    def _wait_http(
        self,
        state: ClusterState,
        name: str,
        url: str,
        ok: Any,
        token_user: str | None = None,
        timeout: float = 60.0,
        verify: bool = True,
    ) -> None:
        ctx = ssl.create_default_context(cafile=str(self.state_dir / "pki" / "ca.crt"))
        if not verify:
            ctx = ssl._create_unverified_context()  # self-signed health endpoints only
        headers = {}
        if token_user:
            headers["Authorization"] = f"Bearer {self._token(token_user)}"
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            self._check_alive(state, name)
            try:
                req = urllib.request.Request(url, headers=headers)
                with urllib.request.urlopen(req, timeout=5, context=ctx) as resp:
                    body = resp.read()
                    if ok(body):
                        return
                    last = body[:200].decode(errors="replace")
            except (urllib.error.URLError, OSError) as exc:
                last = str(exc)
            time.sleep(0.2)
        raise DevClusterError(
            f"{name} not ready after {timeout:.0f}s ({url}: {last}); log: {self.log(name)}\n"
            + process.log_tail(self.log(name))
        )

    def _wait_https_any(self, state: ClusterState, name: str, _component: str) -> None:
        port = state.ports[name]
        self._wait_http(
            state,
            name,
            f"https://127.0.0.1:{port}/healthz",
            lambda body: body.strip() == b"ok",
            verify=False,
        )

    def _token(self, user: str) -> str:
        doc = yaml.safe_load(self.kubeconfig_for(user).read_text())
        token: str = doc["users"][0]["user"]["token"]
        return token

    async def add_nodes(
        self, bodies: list[dict[str, Any]], progress: Progress | None = None
    ) -> None:
        """Create nodes of one's own (a trace's, with kwok's annotation) on a cluster
        started with none, and wait until all are Ready as :meth:`up` waits for its own."""
        from lattice_dev.devcluster.kube import api_client, create_nodes

        async with api_client(self.kubeconfig) as api:
            await create_nodes(api, bodies)
        await self._wait_nodes_ready(ClusterConfig(nodes=len(bodies)), progress)

    async def _create_nodes(self, config: ClusterConfig) -> None:
        from lattice_dev.devcluster.kube import api_client, create_nodes

        profile = get_profile(config.node_profile)
        bodies = [profile.node_body(node_name(i), i) for i in range(config.nodes)]
        async with api_client(self.kubeconfig) as api:
            await create_nodes(api, bodies)

    def _simulate_agents(self, state: ClusterState, bins: Binaries, config: ClusterConfig) -> None:
        """For profiles with hardware (gpu-8x), publish each node's NodeTopology by
        running the real agent reader and publisher on a fixture tree."""
        from lattice_dev.devcluster.agents import fixture_for_profile

        fixture = fixture_for_profile(config.node_profile)
        if fixture is None or config.nodes == 0:
            return
        crd = checkout_path("crds", "nodetopology.yaml")
        kubectl = [str(bins.kubectl), f"--kubeconfig={self.kubeconfig}"]
        for args in (
            ["apply", "--server-side", "-f", str(crd)],
            [
                "wait",
                "--for=condition=Established",
                "crd/nodetopologies.lattice.dev",
                "--timeout=60s",
            ],
        ):
            out = subprocess.run([*kubectl, *args], capture_output=True, text=True, check=False)
            if out.returncode != 0:
                raise DevClusterError(f"kubectl {' '.join(args)}: {out.stderr.strip()}")
        asyncio.run(self._publish_topologies(config, fixture))

    async def _publish_topologies(self, config: ClusterConfig, fixture: Path) -> None:
        from lattice_dev.devcluster.agents import publish_simulated_topologies
        from lattice_dev.devcluster.kube import api_client

        names = [node_name(i) for i in range(config.nodes)]
        async with api_client(self.kubeconfig) as api:
            await publish_simulated_topologies(api, names, fixture)

    async def _wait_nodes_ready(
        self, config: ClusterConfig, progress: Progress | None, every_s: float = 5.0
    ) -> None:
        """Poll the Ready count until every node is Ready or :class:`ReadyPolicy` gives up.

        The pause between polls grows with the list's own cost, so the wait takes a
        small share of the API server from the cluster it is waiting for."""
        from kubernetes_asyncio import client

        from lattice_dev.devcluster.kube import api_client

        tracker = ReadyTracker(ReadyPolicy.for_config(config), time.monotonic())
        said = tracker.started
        async with api_client(self.kubeconfig) as api:
            core = client.CoreV1Api(api)
            while True:
                t0 = time.monotonic()
                # resourceVersion=0: served from the watch cache, not a quorum read of etcd.
                resp: Any = await core.list_node(resource_version="0", _preload_content=False)
                items = json.loads(await resp.read()).get("items") or []
                now = time.monotonic()
                why = tracker.observe(now, sum(1 for n in items if raw_node_ready(n)))
                if tracker.done:
                    if progress is not None:
                        progress(tracker.line(now))
                    return
                if why is not None:
                    logs = f"{self.log('kwok')}, {self.log('kube-controller-manager')}"
                    raise DevClusterError(f"{why}; logs: {logs}")
                if progress is not None and now - said >= every_s:
                    progress(tracker.line(now))
                    said = now
                await asyncio.sleep(max(0.5, 4 * (now - t0)))


def _gates(state: ClusterState) -> list[str]:
    """``--feature-gates`` of the plane's config (none: the release's defaults)."""
    gates = state.config.get("feature_gates") or ()
    return [f"--feature-gates={','.join(gates)}"] if gates else []


def _runtime_config(state: ClusterState) -> list[str]:
    entries = state.config.get("runtime_config") or ()
    return [f"--runtime-config={','.join(entries)}"] if entries else []
