"""Write the sysfs/procfs fixture trees the agent tests read.

    python tests/agent/make_fixtures.py [OUTDIR]   # default: tests/agent/fixtures

The trees are committed (git keeps the symlinks) so that a reader can browse them as the
kernel would show them; ``test_fixtures_are_current`` regenerates them into a temporary
directory and fails when the committed copy differs, so edit this script, not the trees.

Each tree is ``<name>/sys`` and ``<name>/proc`` (``meminfo`` and ``stat`` as the kernel
writes them, PSI under ``pressure/``). Like the kernel, every entry of
``sys/bus/pci/devices`` is a relative symlink into ``sys/devices/pci<domain>:<bus>/...``
whose path spells the bridges above the function. Git does not store empty directories,
so every directory written here holds at least one file.

* ``two-socket-8gpu``: two Xeon sockets (SLIT 10/21, cpulists 0-23,48-71 and 24-47,72-95),
  per socket two IIO stacks each with a Broadcom PEX switch carrying two H100 GPUs and one
  ConnectX-7 (InfiniBand mode), plus one NVMe per socket on a root port; the chipset root
  complex holds a management X710, the BMC's ASPEED VGA behind its PCIe-to-PCI bridge, a
  SATA controller and uncore functions.
* ``vm-single-numa``: an i440FX KVM guest: one NUMA node, everything on ``pci0000:00``,
  virtio devices, a passed-through T4, ``numa_node`` -1 everywhere.
* ``broken``: what goes wrong in the field, one case per file (see ``_broken``); its
  ``/proc/stat`` is garbage and its ``/proc/meminfo`` predates MemAvailable.
* ``no-numa``: no ``node`` directory and no PCI bus (a kernel without CONFIG_NUMA in a
  container that does not mount ``/sys/bus``); no PSI.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "fixtures"

INTEL = "0x8086"
NVIDIA = "0x10de"
MELLANOX = "0x15b3"
BROADCOM = "0x1000"
SAMSUNG = "0x144d"
ASPEED = "0x1a03"
REDHAT_VIRTIO = "0x1af4"

BRIDGE = "0x060400"


@dataclass
class Fn:
    """A PCI function and what hangs below it."""

    address: str
    class_code: str
    vendor: str
    device: str
    numa: str | None = "0"
    """Contents of ``numa_node``; ``None`` writes no file."""
    children: Sequence[Fn] = ()
    files: dict[str, str] = field(default_factory=dict)
    """Extra files relative to the function's directory (net/, infiniband/, ...)."""
    links: dict[str, str] = field(default_factory=dict)
    """Extra relative symlinks in the function's directory (physfn)."""
    skip: frozenset[str] = frozenset()
    """Standard attributes not to write."""


class Tree:
    def __init__(self, root: Path) -> None:
        self.root = root

    def write(self, rel: str, text: str) -> None:
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    def symlink(self, rel: str, target: str) -> None:
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, path)

    def numa_node(self, node: int, cpulist: str, mem_kb: int, distance: str) -> None:
        base = f"sys/devices/system/node/node{node}"
        self.write(f"{base}/cpulist", cpulist + "\n")
        self.write(f"{base}/distance", distance + "\n")
        self.write(f"{base}/meminfo", _node_meminfo(node, mem_kb))

    def pci(self, root_complex: str, fn: Fn, parents: tuple[str, ...] = ()) -> None:
        rel = "/".join(("sys/devices", root_complex, *parents, fn.address))
        attrs = {
            "class": fn.class_code,
            "vendor": fn.vendor,
            "device": fn.device,
            "numa_node": fn.numa,
        }
        for name, value in attrs.items():
            if value is not None and name not in fn.skip:
                self.write(f"{rel}/{name}", value + "\n")
        for name, text in fn.files.items():
            self.write(f"{rel}/{name}", text)
        for name, target in fn.links.items():
            self.symlink(f"{rel}/{name}", target)
        # bus/pci/devices/X -> ../../../devices/pciDDDD:BB/.../X, as the kernel links it.
        self.symlink(f"sys/bus/pci/devices/{fn.address}", "../../../" + rel.removeprefix("sys/"))
        for child in fn.children:
            self.pci(root_complex, child, (*parents, fn.address))


def _node_meminfo(node: int, mem_kb: int) -> str:
    free = mem_kb * 9 // 10
    lines = [
        ("MemTotal", mem_kb),
        ("MemFree", free),
        ("MemUsed", mem_kb - free),
        ("Active", mem_kb // 50),
        ("Inactive", mem_kb // 40),
        ("HugePages_Total", 0),
    ]
    out = []
    for key, value in lines:
        unit = "" if key.startswith("HugePages") else " kB"
        out.append(f"Node {node} {key + ':':<16}{value:>12}{unit}")
    return "\n".join(out) + "\n"


def _proc(tree: Tree, mem_kb: int, cpus: int, *, psi: bool = True) -> None:
    tree.write("proc/meminfo", _meminfo(mem_kb))
    tree.write("proc/stat", _stat(cpus))
    if psi:
        tree.write(
            "proc/pressure/cpu",
            "some avg10=2.04 avg60=1.51 avg300=0.97 total=918273645\n"
            "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n",
        )
        tree.write(
            "proc/pressure/memory",
            "some avg10=0.00 avg60=0.12 avg300=0.05 total=1234567\n"
            "full avg10=0.00 avg60=0.03 avg300=0.01 total=345678\n",
        )
        tree.write(
            "proc/pressure/io",
            "some avg10=0.51 avg60=0.33 avg300=0.20 total=55443322\n"
            "full avg10=0.22 avg60=0.10 avg300=0.08 total=22334455\n",
        )


def _meminfo(mem_kb: int) -> str:
    lines = [
        ("MemTotal", mem_kb),
        ("MemFree", mem_kb // 2),
        ("MemAvailable", mem_kb * 3 // 4),
        ("Buffers", mem_kb // 100),
        ("Cached", mem_kb // 5),
        ("Active(anon)", mem_kb // 10),
        ("HugePages_Total", 0),
        ("Hugepagesize", 2048),
    ]
    out = []
    for key, value in lines:
        unit = "" if key.startswith("HugePages") else " kB"
        out.append(f"{key + ':':<16}{value:>8}{unit}")
    return "\n".join(out) + "\n"


def _stat(cpus: int) -> str:
    """Like the kernel's: the aggregate line (two spaces after ``cpu``), then one per CPU."""
    # user nice system idle iowait irq softirq steal guest guest_nice, in USER_HZ ticks
    rows = [
        [40000 + 700 * i, 300, 9000 + 50 * i, 800000 - 900 * i, 1200, 0, 400, 0, 0, 0]
        for i in range(cpus)
    ]
    total = [sum(column) for column in zip(*rows, strict=True)]
    lines = ["cpu  " + " ".join(map(str, total))]
    lines += [f"cpu{i} " + " ".join(map(str, row)) for i, row in enumerate(rows)]
    lines += [
        "intr 29226148 0 0 0",
        "ctxt 70474020",
        "btime 1740830400",
        "processes 81234",
        "procs_running 3",
        "procs_blocked 0",
        "softirq 1234567 0 1 2 3 4 5 6 7 8 9",
    ]
    return "\n".join(lines) + "\n"


# --- two-socket-8gpu -------------------------------------------------------------------------


def _ib_nic(address: str, numa: str, index: int) -> Fn:
    bus = int(address.split(":")[1], 16)
    ifname = f"ibp{bus}s0"
    return Fn(
        address,
        "0x020700",
        MELLANOX,
        "0x1021",  # ConnectX-7
        numa,
        files={
            f"net/{ifname}/address": f"00:00:10:49:fe:80:00:00:00:00:00:00:{index:02x}\n",
            f"infiniband/mlx5_{index}/node_type": "1: CA\n",
        },
    )


def _gpu_switch(rc_bus: int, numa: str, nic_index: int) -> Fn:
    """Root port -> PEX switch (4 downstream ports) -> 2 GPUs, 1 NIC, 1 empty slot."""
    up, down, ep = rc_bus + 1, rc_bus + 2, rc_bus + 3
    eps = [
        Fn(f"0000:{ep:02x}:00.0", "0x030200", NVIDIA, "0x2331", numa),  # H100 PCIe
        Fn(f"0000:{ep + 1:02x}:00.0", "0x030200", NVIDIA, "0x2331", numa),
        _ib_nic(f"0000:{ep + 2:02x}:00.0", numa, nic_index),
    ]
    downstream = [
        Fn(
            f"0000:{down:02x}:{slot:02x}.0",
            BRIDGE,
            BROADCOM,
            "0xc030",
            numa,
            children=[eps[slot]] if slot < len(eps) else [],
        )
        for slot in range(4)
    ]
    switch = Fn(f"0000:{up:02x}:00.0", BRIDGE, BROADCOM, "0xc030", numa, children=downstream)
    return Fn(f"0000:{rc_bus:02x}:02.0", BRIDGE, INTEL, "0x347a", numa, children=[switch])


def _two_socket(tree: Tree) -> None:
    tree.numa_node(0, "0-23,48-71", 527958428, "10 21")
    tree.numa_node(1, "24-47,72-95", 528444924, "21 10")
    tree.write("sys/devices/system/node/online", "0-1\n")
    tree.write("sys/devices/system/node/possible", "0-1\n")
    tree.write("sys/devices/system/cpu/online", "0-95\n")
    _proc(tree, 1056403352, 96)

    chipset = [
        Fn("0000:00:00.0", "0x060000", INTEL, "0x09a2", "0"),
        Fn("0000:00:04.0", "0x088000", INTEL, "0x0b00", "0"),  # CBDMA: plumbing
        Fn("0000:00:17.0", "0x010601", INTEL, "0xa182", "0"),  # SATA AHCI
        Fn(
            "0000:00:1c.0",
            BRIDGE,
            INTEL,
            "0xa190",
            "0",
            children=[
                Fn(
                    "0000:01:00.0",
                    "0x020000",
                    INTEL,
                    "0x1572",  # X710 management port: a NIC without RDMA
                    "0",
                    files={"net/eno1/address": "3c:ec:ef:00:00:01\n"},
                )
            ],
        ),
        Fn(
            "0000:00:1c.5",
            BRIDGE,
            INTEL,
            "0xa195",
            "0",
            children=[
                Fn(
                    "0000:02:00.0",
                    BRIDGE,
                    ASPEED,
                    "0x1150",  # PCIe-to-PCI bridge: not a switch
                    "0",
                    children=[Fn("0000:03:00.0", "0x030000", ASPEED, "0x2000", "0")],
                )
            ],
        ),
    ]
    for fn in chipset:
        tree.pci("pci0000:00", fn)

    tree.pci("pci0000:17", Fn("0000:17:00.0", "0x088000", INTEL, "0x09a2", "0"))
    tree.pci("pci0000:17", _gpu_switch(0x17, "0", 0))
    tree.pci("pci0000:3a", _gpu_switch(0x3A, "0", 1))
    nvme0 = Fn("0000:5e:00.0", "0x010802", SAMSUNG, "0xa80a", "0", files={"nvme/nvme0/dev": ""})
    tree.pci("pci0000:5d", Fn("0000:5d:02.0", BRIDGE, INTEL, "0x347a", "0", children=[nvme0]))

    tree.pci("pci0000:80", Fn("0000:80:00.0", "0x088000", INTEL, "0x09a2", "1"))
    tree.pci("pci0000:97", _gpu_switch(0x97, "1", 2))
    tree.pci("pci0000:b0", _gpu_switch(0xB0, "1", 3))
    nvme1 = Fn("0000:d8:00.0", "0x010802", SAMSUNG, "0xa80a", "1", files={"nvme/nvme1/dev": ""})
    tree.pci("pci0000:d7", Fn("0000:d7:02.0", BRIDGE, INTEL, "0x347a", "1", children=[nvme1]))


# --- vm-single-numa --------------------------------------------------------------------------


def _vm(tree: Tree) -> None:
    tree.numa_node(0, "0-7", 32866300, "10")
    tree.write("sys/devices/system/node/online", "0\n")
    tree.write("sys/devices/system/cpu/online", "0-7\n")
    _proc(tree, 32866300, 8)
    for fn in [
        Fn("0000:00:00.0", "0x060000", INTEL, "0x1237", "-1"),  # i440FX host bridge
        Fn("0000:00:01.0", "0x060100", INTEL, "0x7000", "-1"),  # PIIX3 ISA bridge
        Fn("0000:00:01.1", "0x010180", INTEL, "0x7010", "-1"),  # PIIX3 IDE
        Fn("0000:00:01.3", "0x068000", INTEL, "0x7113", "-1"),  # PIIX4 ACPI
        Fn("0000:00:02.0", "0x030000", "0x1234", "0x1111", "-1"),  # QEMU VGA
        Fn(
            "0000:00:03.0",
            "0x020000",
            REDHAT_VIRTIO,
            "0x1000",  # virtio-net (transitional)
            "-1",
            files={"virtio0/net/eth0/address": "52:54:00:12:34:56\n"},
        ),
        Fn("0000:00:04.0", "0x010000", REDHAT_VIRTIO, "0x1001", "-1"),  # virtio-blk
        Fn("0000:00:05.0", "0x00ff00", REDHAT_VIRTIO, "0x1002", "-1"),  # virtio-balloon
        Fn("0000:00:1e.0", "0x030200", NVIDIA, "0x1eb8", "-1"),  # Tesla T4, passed through
    ]:
        tree.pci("pci0000:00", fn)


# --- broken ----------------------------------------------------------------------------------


def _broken(tree: Tree) -> None:
    tree.numa_node(0, "0-3", 16384000, "10 21")
    tree.write("sys/devices/system/node/node1/cpulist", "garbage!\n")
    tree.write("sys/devices/system/node/node1/distance", "10 abc\n")  # and no meminfo
    tree.write("sys/devices/system/cpu/online", "0-7\n")
    tree.write("proc/pressure/cpu", "nonsense\n")
    tree.write("proc/stat", "cpu  12 abc 7 9\ncpu0 12 abc 7 9\n")
    tree.write("proc/meminfo", "MemTotal:       16384000 kB\nMemFree:         8000000 kB\n")
    tree.write(
        "proc/pressure/memory",
        "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
        "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n",
    )  # and no io
    # A link whose target is gone, and a stray file that is not a PCI address.
    tree.symlink("sys/bus/pci/devices/0000:00:09.0", "../../../devices/pci0000:00/0000:00:09.0")
    tree.write("sys/bus/pci/devices/garbage", "not a device\n")
    for fn in [
        Fn("0000:00:00.0", "0x060000", INTEL, "0x09a2", "0"),
        Fn("0000:00:03.0", "", INTEL, "0x1234", "0", skip=frozenset({"class"})),
        Fn("0000:00:04.0", "0xzz", "bogus", "0x1234", "0"),
        Fn("0000:00:05.0", "0x010802", SAMSUNG, "0xa80a", "7"),  # no NUMA node 7
        Fn(
            "0000:00:06.0",
            "0x020000",  # Ethernet class, but RDMA-capable (RoCE): infiniband/ is there
            MELLANOX,
            "0x101d",
            "0",
            files={"infiniband/mlx5_0/node_type": "1: CA\n"},
        ),
        Fn(
            "0000:00:06.2",
            "0x020000",
            MELLANOX,
            "0x101e",  # SR-IOV virtual function: not reported
            "0",
            links={"physfn": "../0000:00:06.0"},
        ),
        Fn(
            "0000:00:07.0",
            "0xff0000",
            INTEL,
            "0x0001",
            None,
            files={"numa_node/oops": "a directory where a file should be\n"},
        ),
    ]:
        tree.pci("pci0000:00", fn)
    # numa_node -1 below a root port that knows: inherits node 1 quietly.
    tree.pci(
        "pci0000:20",
        Fn(
            "0000:20:01.0",
            BRIDGE,
            INTEL,
            "0x347a",
            "1",
            children=[Fn("0000:21:00.0", "0x030200", NVIDIA, "0x2331", "-1")],
        ),
    )
    # numa_node -1 with nothing above that knows: unknown, with a warning.
    tree.pci("pci0000:40", Fn("0000:40:00.0", "0x030200", NVIDIA, "0x2331", "-1"))


# --- no-numa ---------------------------------------------------------------------------------


def _no_numa(tree: Tree) -> None:
    tree.write("sys/devices/system/cpu/online", "0-3\n")
    _proc(tree, 8000000, 4, psi=False)


TREES = {
    "two-socket-8gpu": _two_socket,
    "vm-single-numa": _vm,
    "broken": _broken,
    "no-numa": _no_numa,
}


def generate(out: Path) -> None:
    """(Re)write every tree under ``out``, removing what was there."""
    for name, build in TREES.items():
        root = out / name
        if root.exists():
            shutil.rmtree(root)
        root.mkdir(parents=True)
        build(Tree(root))


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else FIXTURES)
