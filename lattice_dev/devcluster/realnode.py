"""One real node for the devcluster: kubelet with containerd, runc and a bridge CNI.

kwok nodes make thousands of nodes cheap, but no container starts on them, so the
image, its securityContext and the in-cluster login are never exercised there. This
runs one kubelet on this machine beside the kwok nodes:

* kubelet is built from the same ``k8s.io/kubernetes`` version as the control plane
  (from a copy of its Go module, so the control plane's cache key does not move) and
  cached under ``~/.cache/lattice/bin/kubelet-<version>-<key>/``;
* containerd, runc and the CNI plugins (bridge + host-local) are Debian's packages;
* the pod sandbox image is built here from ``e2e/node/pause.c`` (no registry), and
  images reach containerd only by import from local archives: nothing is pulled;
* the node logs in with its own client certificate (``system:node:<name>`` in
  ``system:nodes``), so the Node authorizer and NodeRestriction apply to it as on a
  real cluster.

Pods get addresses on the ``lattice0`` bridge (10.88.0.0/16), a host-only interface;
the kubelet serves on loopback. One real node per machine (the bridge and the
kubelet's cgroups are the machine's).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from lattice_dev.devcluster.build import (
    BuildError,
    Progress,
    _build_lock,
    cache_key,
    cache_root,
    checkout_path,
    kubernetes_version,
    modfile_flags,
    module_dir,
    version_stamp,
)
from lattice_dev.devcluster.image import ImageError, apt_install, images_dir

NODE_NAME = "lattice-real-0"
BRIDGE = "lattice0"
NODE_IP = "10.88.0.1"
POD_SUBNET = "10.88.0.0/16"
PAUSE_REF = "localhost/lattice-pause:3.10"
APT_PACKAGES = (
    "containerd",
    "runc",
    "containernetworking-plugins",
    "iproute2",
    "iptables",
    "socat",
    "gcc",
    "libc6-dev",
)
CNI_BIN_DIRS = ("/usr/lib/cni", "/opt/cni/bin")


class RealNodeError(RuntimeError):
    """The real node could not be set up; the message says what is missing."""


def _say(msg: str) -> None:
    print(f"lattice devcluster: {msg}", flush=True)


def _run(args: Sequence[str], what: str, *, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(list(args), capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise RealNodeError(f"{what} failed: {(done.stdout + done.stderr)[-2000:]}")
    return done


def ensure_packages(progress: Progress = _say) -> None:
    """containerd, runc and the CNI plugins from Debian, installed if missing and root."""
    tools = ("containerd", "runc", "ip", "iptables", "socat", "gcc")
    missing = [t for t in tools if shutil.which(t) is None]
    if cni_bin_dir() is None:
        missing.append("CNI plugins")
    if not missing:
        return
    apt_install(APT_PACKAGES, missing, progress)


def cni_bin_dir() -> Path | None:
    for d in CNI_BIN_DIRS:
        if (Path(d) / "bridge").is_file() and (Path(d) / "host-local").is_file():
            return Path(d)
    return None


NODE_BINARIES = ("kubelet", "kube-proxy")


def node_binaries_dir() -> Path:
    """Where this release's kubelet and kube-proxy are cached."""
    version = kubernetes_version()
    return cache_root() / "bin" / f"node-{version}-{cache_key(module_dir(), version)[-10:]}"


def ensure_node_binaries(progress: Progress = _say) -> Path:
    """kubelet and kube-proxy of the control plane's Kubernetes release, built once per
    module pin; returns their folder."""
    target = node_binaries_dir()
    if all((target / b).is_file() for b in NODE_BINARIES):
        return target
    with _build_lock(target.parent):
        if all((target / b).is_file() for b in NODE_BINARIES):
            return target
        version = kubernetes_version()
        progress(f"building kubelet and kube-proxy {version} once into {target}")
        log = target.parent / f"{target.name}.build.log"
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            copy = Path(tmp) / "module"
            shutil.copytree(module_dir(), copy)
            # -mod=mod: kubelet needs a few go.sum lines the control plane does not;
            # the versions stay those go.mod pins (checked against the sum database).
            flags = "-mod=mod -trimpath -buildvcs=false" + modfile_flags(copy, version)
            env = {**os.environ, "GOFLAGS": flags}
            out = Path(tmp) / "out"
            out.mkdir()
            done = subprocess.run(
                [
                    "go",
                    "build",
                    "-ldflags",
                    version_stamp(version),
                    "-o",
                    str(out) + "/",
                    *(f"k8s.io/kubernetes/cmd/{b}" for b in NODE_BINARIES),
                ],
                cwd=copy,
                env=env,
                capture_output=True,
                text=True,
                check=False,
            )
            log.write_text(done.stdout + done.stderr)
            if done.returncode != 0:
                raise BuildError(f"building kubelet and kube-proxy failed; log: {log}")
            if target.exists():
                shutil.rmtree(target)
            out.rename(target)
    return target


def ensure_pause(progress: Progress = _say) -> Path:
    """The sandbox image as an OCI archive, built from pause.c once per its content."""
    source = checkout_path("e2e", "node", "pause.c")
    key = hashlib.sha256(source.read_bytes()).hexdigest()[:10]
    archive = images_dir() / f"pause-{key}.oci.tar"
    if archive.is_file():
        return archive
    progress("building the pod sandbox (pause) image from e2e/node/pause.c")
    with tempfile.TemporaryDirectory() as tmp:
        binary = Path(tmp) / "pause"
        _run(["gcc", "-Os", "-static", "-o", str(binary), str(source)], "gcc pause.c")
        _run(["strip", str(binary)], "strip", check=False)
        try:
            ctr = _run(["buildah", "from", "scratch"], "buildah from").stdout.strip()
        except FileNotFoundError as exc:
            raise ImageError(
                "buildah is needed for the pause image (just image installs it)"
            ) from exc
        try:
            _run(["buildah", "copy", ctr, str(binary), "/pause"], "buildah copy")
            _run(
                ["buildah", "config", "--entrypoint", '["/pause"]', "--user", "65535:65535", ctr],
                "buildah config",
            )
            _run(["buildah", "commit", "--quiet", ctr, PAUSE_REF], "buildah commit")
        finally:
            _run(["buildah", "rm", ctr], "buildah rm", check=False)
        part = Path(tmp) / "pause.oci.tar"
        _run(
            ["podman", "save", "--format=oci-archive", "--output", str(part), PAUSE_REF],
            "podman save",
        )
        shutil.move(str(part), archive)
    return archive


def ensure_bridge() -> None:
    """The pods' bridge with the node's address (host-only; the CNI plugin reuses it)."""
    if _run(["ip", "link", "show", BRIDGE], "ip link", check=False).returncode != 0:
        _run(["ip", "link", "add", BRIDGE, "type", "bridge"], "ip link add")
    have = _run(["ip", "-4", "addr", "show", "dev", BRIDGE], "ip addr").stdout
    if f"{NODE_IP}/" not in have:
        _run(["ip", "addr", "add", f"{NODE_IP}/16", "dev", BRIDGE], "ip addr add")
    _run(["ip", "link", "set", BRIDGE, "up"], "ip link set up")


def remove_bridge() -> None:
    subprocess.run(["ip", "link", "del", BRIDGE], capture_output=True, check=False)


@dataclass(frozen=True)
class Layout:
    """Where the real node's files live, inside the devcluster's state folder."""

    root: Path

    @property
    def socket(self) -> Path:
        return self.root / "containerd.sock"

    @property
    def containerd_config(self) -> Path:
        return self.root / "containerd.toml"

    @property
    def kubelet_config(self) -> Path:
        return self.root / "kubelet.yaml"

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubelet.kubeconfig"

    @property
    def kubelet_root(self) -> Path:
        return self.root / "kubelet"

    @property
    def cni_conf(self) -> Path:
        return self.root / "cni"


def write_files(
    layout: Layout, *, server: str, ca: Path, cert: Path, key: Path, ports: tuple[int, int]
) -> None:
    cni_bin = cni_bin_dir()
    if cni_bin is None:
        raise RealNodeError("CNI plugins (bridge, host-local) not found")
    for d in (layout.root, layout.cni_conf, layout.kubelet_root):
        d.mkdir(parents=True, exist_ok=True)
    layout.containerd_config.write_text(
        f"""version = 2
root = "{layout.root / "containerd"}"
state = "{layout.root / "containerd-state"}"
[grpc]
  address = "{layout.socket}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_REF}"
  # Lowering a process's oom_score_adj needs CAP_SYS_RESOURCE, which a sandboxed
  # root (CI's machine) lacks: runc's init then dies before the container starts.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{cni_bin}"
    conf_dir = "{layout.cni_conf}"
"""
    )
    (layout.cni_conf / "10-lattice.conflist").write_text(
        f"""{{"cniVersion": "0.4.0", "name": "lattice", "plugins": [
  {{"type": "bridge", "bridge": "{BRIDGE}", "isGateway": true, "ipMasq": false,
   "hairpinMode": true, "ipam": {{"type": "host-local",
   "ranges": [[{{"subnet": "{POD_SUBNET}", "gateway": "{NODE_IP}"}}]],
   "routes": [{{"dst": "0.0.0.0/0"}}], "dataDir": "{layout.root / "ipam"}"}}}},
  {{"type": "loopback"}}]}}
"""
    )
    layout.kubeconfig.write_text(
        f"""apiVersion: v1
kind: Config
clusters: [{{name: dev, cluster: {{server: "{server}", certificate-authority: "{ca}"}}}}]
users: [{{name: node, user: {{client-certificate: "{cert}", client-key: "{key}"}}}}]
contexts: [{{name: dev, context: {{cluster: dev, user: node}}}}]
current-context: dev
"""
    )
    port, healthz = ports
    layout.kubelet_config.write_text(
        f"""apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# The node's address on the host-only bridge: the API server dials it for logs and exec.
address: {NODE_IP}
port: {port}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: {healthz}
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: true}}
  x509: {{clientCAFile: "{ca}"}}
authorization: {{mode: Webhook}}
cgroupDriver: cgroupfs
# The machine has cgroup v1 (with a v2 hierarchy beside); kubelet 1.34 still runs there.
failCgroupV1: false
containerRuntimeEndpoint: unix://{layout.socket}
failSwapOn: false
enforceNodeAllocatable: []
evictionHard: {{}}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
resolvConf: ""
registerNode: true
"""
    )


def kubelet_args(layout: Layout) -> list[str]:
    return [
        f"--config={layout.kubelet_config}",
        f"--kubeconfig={layout.kubeconfig}",
        f"--root-dir={layout.kubelet_root}",
        f"--hostname-override={NODE_NAME}",
        f"--node-ip={NODE_IP}",
        "--v=1",
    ]


def wait_socket(layout: Layout, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not layout.socket.exists():
        if time.monotonic() > deadline:
            raise RealNodeError(f"containerd did not open {layout.socket} in {timeout:.0f}s")
        time.sleep(0.2)


def import_images(layout: Layout, archives: Sequence[Path]) -> None:
    """Images reach the node only from local archives (imagePullPolicy Never/IfNotPresent)."""
    for archive in archives:
        _run(
            [
                "ctr",
                "--address",
                str(layout.socket),
                "--namespace",
                "k8s.io",
                "images",
                "import",
                str(archive),
            ],
            f"ctr images import {archive.name}",
        )


def kill_containers(layout: Layout) -> None:
    """Stop every container the node started (kubelet is gone; containerd still runs):
    their processes would otherwise outlive the devcluster."""
    if not layout.socket.exists():
        return
    ctr = ["ctr", "--address", str(layout.socket), "--namespace", "k8s.io"]
    tasks = _run([*ctr, "tasks", "ls", "-q"], "ctr tasks ls", check=False).stdout.split()
    for task in tasks:
        _run([*ctr, "tasks", "kill", "--signal", "SIGKILL", task], "ctr kill", check=False)
    deadline = time.monotonic() + 10
    for task in tasks:
        while time.monotonic() < deadline:
            if _run([*ctr, "tasks", "delete", task], "ctr delete", check=False).returncode == 0:
                break
            time.sleep(0.2)


def unmount_below(root: Path) -> None:
    """Unmount what kubelet and containerd mounted under ``root`` (deepest first), so the
    state folder can be removed."""
    prefix = str(root.resolve()) + "/"
    with open("/proc/self/mounts") as mounts:
        points = [line.split()[1] for line in mounts]
    for point in sorted((p for p in points if p.startswith(prefix)), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True, check=False)


def forwarder_args(port: int) -> list[str]:
    """socat: the API server's loopback port, also on the node's bridge address (the
    `kubernetes` Service's endpoint), so pods reach it and nothing outside does."""
    return [
        f"TCP-LISTEN:{port},bind={NODE_IP},fork,reuseaddr",
        f"TCP:127.0.0.1:{port}",
    ]


def write_proxy_files(
    layout: Layout, *, server: str, ca: Path, cert: Path, key: Path, ports: tuple[int, int]
) -> None:
    (layout.root / "kube-proxy.kubeconfig").write_text(
        f"""apiVersion: v1
kind: Config
clusters: [{{name: dev, cluster: {{server: "{server}", certificate-authority: "{ca}"}}}}]
users: [{{name: proxy, user: {{client-certificate: "{cert}", client-key: "{key}"}}}}]
contexts: [{{name: dev, context: {{cluster: dev, user: proxy}}}}]
current-context: dev
"""
    )
    healthz, metrics = ports
    (layout.root / "kube-proxy.yaml").write_text(
        f"""apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {{kubeconfig: "{layout.root / "kube-proxy.kubeconfig"}"}}
mode: iptables
hostnameOverride: {NODE_NAME}
clusterCIDR: {POD_SUBNET}
bindAddress: 127.0.0.1
healthzBindAddress: 127.0.0.1:{healthz}
metricsBindAddress: 127.0.0.1:{metrics}
# Leave the machine's conntrack sysctls alone (a sandboxed root may not set them).
conntrack: {{maxPerCore: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}}
"""
    )


def proxy_args(layout: Layout) -> list[str]:
    return [f"--config={layout.root / 'kube-proxy.yaml'}", "--v=1"]


def cleanup_proxy_rules() -> None:
    """Remove kube-proxy's iptables chains (``kube-proxy --cleanup``), so a stopped
    devcluster leaves the machine's firewall as it found it."""
    binary = node_binaries_dir() / "kube-proxy"
    if binary.is_file():
        subprocess.run([str(binary), "--cleanup"], capture_output=True, timeout=60, check=False)
