"""Seeded generator of random volume cases for the differential test.

A cluster is a few kwok nodes (hostname and zone labels, sometimes the beta zone label, a
CSINode with an attach limit for one CSI driver and often for the CSI drivers in-tree disks
migrate to, sometimes with the ``migrated-plugins`` annotation) and pods already bound there
with claims of their own (pre-bound PV/PVC pairs, some ReadWriteOncePod) and inline disks.
Each case is one incoming pod with claims, StorageClasses and PVs of its own: class names
carry the case's prefix, so no case can bind another case's PV and every case meets the
cluster as generated. Shapes are chosen to make conflicts common: local PVs pinned to one
node, zone-pinned PVs, small capacities, a no-provisioner WaitForFirstConsumer class, an
Immediate class, a provisioner limited to some zones, claims shared with (or missing from)
the cluster, and inline disks drawn from a small per-cluster pool (one GCE PD read-only or
read-write, one EBS volume as ``vol-x`` or ``aws://zone/vol-x``, RBD images on overlapping
monitors, iSCSI targets sharing an IQN, Azure Disk, Cinder, Portworx, vSphere and Azure
File volumes) against low in-tree attach limits.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from tests.e2e.differential.gen import Body, Cluster
from tests.e2e.differential.volumes_objects import claim_volume, csi_node, pv, pvc, storage_class

DRIVER = "csi.lattice.dev"
ZONE = "topology.kubernetes.io/zone"
BETA_ZONE = "failure-domain.beta.kubernetes.io/zone"
HOST = "kubernetes.io/hostname"
ZONES = ("z1", "z2", "z3")
SIZES = ("1Gi", "2Gi", "5Gi", "10Gi")
PV_MODES = (
    # ReadWriteOncePod cannot be combined with another mode (API validation).
    ["ReadWriteOnce", "ReadWriteMany"],
    ["ReadWriteOnce"],
    ["ReadWriteOnce"],
    ["ReadWriteOncePod"],
    ["ReadWriteMany"],
)


GCE_DRIVER = "pd.csi.storage.gke.io"
EBS_DRIVER = "ebs.csi.aws.com"
INTREE_DRIVERS = (
    GCE_DRIVER,
    EBS_DRIVER,
    "disk.csi.azure.com",
    "cinder.csi.openstack.org",
    "pxd.portworx.com",
    "csi.vsphere.vmware.com",
    "file.csi.azure.com",
)
"""The CSI drivers in-tree inline disks translate to."""
INTREE_PLUGINS = (
    "kubernetes.io/gce-pd",
    "kubernetes.io/aws-ebs",
    "kubernetes.io/azure-disk",
    "kubernetes.io/cinder",
    "kubernetes.io/portworx-volume",
    "kubernetes.io/vsphere-volume",
    "kubernetes.io/azure-file",
    "kubernetes.io/rbd",
)
"""What a CSINode's migrated-plugins annotation may list."""
MONITORS = ("10.0.0.1:6789", "10.0.0.2:6789", "10.0.0.3:6789")
DISK_KINDS = (
    *("gce", "gce", "gce", "ebs", "ebs", "rbd", "iscsi", "azure", "cinder", "px"),
    *("vsphere", "azurefile"),
)
"""Inline disk kinds to draw from (GCE PD and EBS more often)."""
AZURE_DISK_URI = "/subscriptions/s/resourceGroups/g/providers/Microsoft.Compute/disks/"


@dataclass
class Case:
    pod: Body
    claims: list[str]
    """The incoming pod's own claims (to see kube's selected-node annotation on them)."""
    classes: list[Body] = field(default_factory=list)
    pvs: list[Body] = field(default_factory=list)
    pvcs: list[Body] = field(default_factory=list)


@dataclass
class VolumeCluster:
    cluster: Cluster
    classes: list[Body] = field(default_factory=list)
    pvs: list[Body] = field(default_factory=list)
    pvcs: list[Body] = field(default_factory=list)
    csi_nodes: list[Body] = field(default_factory=list)
    shared_claims: list[str] = field(default_factory=list)
    cases: list[Case] = field(default_factory=list)

    def all_classes(self) -> list[Body]:
        return self.classes + [c for case in self.cases for c in case.classes]

    def all_pvs(self) -> list[Body]:
        return self.pvs + [v for case in self.cases for v in case.pvs]

    def all_pvcs(self) -> list[Body]:
        return self.pvcs + [c for case in self.cases for c in case.pvcs]


class VolumeGenerator:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed * 7919 + 15)
        self.seed = seed

    def cluster(self, index: int, cases: int) -> VolumeCluster:
        r = self.rng
        prefix = f"vol-{self.seed}-{index}"
        cl = Cluster(index, prefix, prefix + "-o")
        vc = VolumeCluster(cl)
        for i in range(r.randint(3, 5)):
            cl.nodes.append(self._node(f"{prefix}-n{i}"))
        names = [n["metadata"]["name"] for n in cl.nodes]
        # Every third cluster is full of disks: every node allows one volume per in-tree
        # CSI driver and already has one of each, so an incoming inline disk fits only
        # where kube does not count it (no migration for its plugin on that node).
        heavy = index % 3 == 2
        for name in names:
            if heavy or r.random() < 0.75:
                limits: dict[str, int | None] = {DRIVER: r.choice((1, 1, 2, 3, None))}
                if heavy:
                    limits.update(dict.fromkeys(INTREE_DRIVERS, 1))
                elif r.random() < 0.85:
                    for driver in r.sample(INTREE_DRIVERS, r.randint(2, len(INTREE_DRIVERS))):
                        limits[driver] = r.choice((1, 1, 1, 2, None))
                migrated = (
                    r.sample(INTREE_PLUGINS, r.randint(1, len(INTREE_PLUGINS)))
                    if r.random() < 0.5
                    else []
                )
                vc.csi_nodes.append(csi_node(name, limits, migrated))
        static = f"{prefix}-static"
        vc.classes.append(storage_class(static))
        for i in range(r.randint(1, 4)):
            node = r.choice(names)
            claims = []
            for j in range(r.randint(1, 2)):
                claim = f"ex{i}-{j}"
                modes = ["ReadWriteOncePod"] if r.random() < 0.35 else ["ReadWriteOnce"]
                volume = f"{prefix}-ex{i}-{j}"
                vc.pvs.append(
                    pv(
                        volume,
                        "5Gi",
                        storage_class=static,
                        claim=(prefix, claim),
                        modes=modes,
                        csi=(DRIVER, volume) if r.random() < 0.7 else None,
                        affinity=[[{"key": HOST, "operator": "In", "values": [node]}]],
                        labels={ZONE: r.choice(ZONES)} if r.random() < 0.4 else None,
                        phase=None,
                    )
                )
                vc.pvcs.append(
                    pvc(
                        claim,
                        "5Gi",
                        namespace=prefix,
                        storage_class=static,
                        modes=modes,
                        volume_name=volume,
                    )
                )
                claims.append(claim)
            vc.shared_claims += claims
            existing = self._pod(f"ex-{i}", prefix, claims, node=node)
            if r.random() < 0.5:
                existing["spec"]["volumes"] += self._disks(prefix, r.randint(1, 2))
            cl.existing.append(existing)
        if heavy:
            for i, name in enumerate(names):
                disks = [
                    {"name": f"disk{k}", **self._disk(f"{prefix}-h{i}", kind)}
                    for k, kind in enumerate(dict.fromkeys(DISK_KINDS))
                ]
                cl.existing.append(self._pod(f"hx-{i}", prefix, [], node=name, disks=disks))
        for i in range(r.randint(2, 6)):
            # Pods with inline disks only, on nodes that may also hold claim pods.
            disks = self._disks(prefix, r.randint(1, 3))
            cl.existing.append(self._pod(f"dx-{i}", prefix, [], node=r.choice(names), disks=disks))
        for k in range(cases):
            vc.cases.append(self._case(vc, f"{prefix}-k{k}", f"in-{k}", names))
        return vc

    def _node(self, name: str) -> Body:
        r = self.rng
        labels = {HOST: name, "type": "kwok"}
        roll = r.random()
        if roll < 0.7:
            labels[ZONE] = r.choice(ZONES)
        elif roll < 0.85:
            labels[BETA_ZONE] = r.choice(ZONES)
        capacity = {"cpu": "4", "memory": "8Gi", "pods": "110", "ephemeral-storage": "20Gi"}
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": labels,
                "annotations": {"kwok.x-k8s.io/node": "fake"},
            },
            "spec": {},
            "status": {"capacity": capacity, "allocatable": dict(capacity)},
        }

    def _disks(self, prefix: str, count: int) -> list[Body]:
        """Inline disks from a small pool shared by the cluster's pods: same identities
        come up often, read-only or not."""
        r = self.rng
        return [
            {"name": f"disk{i}", **self._disk(prefix, r.choice(DISK_KINDS))} for i in range(count)
        ]

    def _disk(self, prefix: str, kind: str) -> Body:
        """One inline disk source of ``kind`` (a :data:`DISK_KINDS`), from the pool."""
        r = self.rng
        read_only = r.random() < 0.4
        source: Body
        if kind == "gce":
            source = {
                "gcePersistentDisk": {
                    "pdName": f"{prefix}-pd{r.randint(0, 1)}",
                    "fsType": "ext4",
                    "readOnly": read_only,
                }
            }
        elif kind == "ebs":
            volume = f"vol-{prefix}{r.randint(0, 1)}"
            if r.random() < 0.3:
                volume = f"aws://{r.choice(ZONES)}/{volume}"
            source = {"awsElasticBlockStore": {"volumeID": volume, "readOnly": read_only}}
        elif kind == "rbd":
            rbd: Body = {
                "monitors": r.sample(MONITORS, r.randint(1, 2)),
                "image": f"img{r.randint(0, 1)}",
                "readOnly": read_only,
            }
            pool = r.choice((None, "rbd", "fast"))
            if pool is not None:
                rbd["pool"] = pool
            source = {"rbd": rbd}
        elif kind == "iscsi":
            source = {
                "iscsi": {
                    "targetPortal": f"10.0.1.{r.randint(1, 2)}:3260",
                    "iqn": f"iqn.2020-01.dev.lattice:{prefix}-t{r.randint(0, 1)}",
                    "lun": r.randint(0, 1),
                    "readOnly": read_only,
                }
            }
        elif kind == "azure":
            disk = f"{prefix}-az{r.randint(0, 1)}"
            source = {
                "azureDisk": {
                    "diskName": disk,
                    "diskURI": AZURE_DISK_URI + disk,
                    "kind": "Managed",
                }
            }
        elif kind == "cinder":
            source = {"cinder": {"volumeID": f"{prefix}-cv{r.randint(0, 1)}"}}
        elif kind == "px":
            source = {"portworxVolume": {"volumeID": f"{prefix}-px{r.randint(0, 1)}"}}
        elif kind == "vsphere":
            source = {"vsphereVolume": {"volumePath": f"[ds] {prefix}-{r.randint(0, 1)}.vmdk"}}
        else:
            share = f"{prefix}-share{r.randint(0, 1)}"
            source = {"azureFile": {"secretName": "azure-secret", "shareName": share}}
        return source

    def _pod(
        self,
        name: str,
        namespace: str,
        claims: list[str],
        *,
        node: str = "",
        disks: list[Body] | None = None,
    ) -> Body:
        spec: Body = {
            "containers": [
                {"name": "c", "image": "busybox", "resources": {"requests": {"cpu": "100m"}}}
            ],
            "tolerations": [{"operator": "Exists"}],
            "volumes": [claim_volume(f"v{i}", c) for i, c in enumerate(claims)] + (disks or []),
        }
        if node:
            spec["nodeName"] = node
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace},
            "spec": spec,
        }

    def _immediate_pv(self, name: str, cls: str, selector: Body | None, modes: list[str]) -> Body:
        """A PV the PV controller will bind an Immediate claim to: unpinned or zone-pinned,
        often with zone labels, so the pod then meets VolumeZone and the PV's affinity."""
        r = self.rng
        zones = r.sample(ZONES, r.randint(1, 2))
        labels = {r.choice((ZONE, BETA_ZONE)): "__".join(zones)} if r.random() < 0.7 else {}
        if selector is not None:
            labels.update(selector["matchLabels"])
        pinned = [[{"key": ZONE, "operator": "In", "values": zones}]]
        return pv(
            name,
            "10Gi",
            storage_class=cls,
            modes=modes,
            affinity=pinned if r.random() < 0.4 else None,
            labels=labels,
            csi=(DRIVER, name),
            phase=None,
        )

    def _case(self, vc: VolumeCluster, q: str, pod_name: str, nodes: list[str]) -> Case:
        r = self.rng
        ns = vc.cluster.namespace
        wffc, prov, imm = f"{q}-wffc", f"{q}-prov", f"{q}-imm"
        classes = [storage_class(wffc), storage_class(imm, mode="Immediate")]
        if r.random() < 0.5:
            zones = r.sample(ZONES, r.randint(1, 2)) if r.random() < 0.7 else None
            key = BETA_ZONE if r.random() < 0.2 else ZONE
            classes.append(storage_class(prov, provisioner=DRIVER, zones=zones, zone_key=key))
        case = Case(pod={}, claims=[], classes=classes)
        for i in range(r.randint(1, 5)):
            name = f"{q}-pv{i}"
            immediate = r.random() < 0.35
            # The PV controller binds Immediate PVs wherever they are: unpinned ones with
            # zone labels are what VolumeZone sees.
            roll = r.random() + (0.3 if immediate else 0.0)
            affinity: list[list[Body]] | None
            if roll < 0.55:
                affinity = [[{"key": HOST, "operator": "In", "values": [r.choice(nodes)]}]]
            elif roll < 0.8:
                zone_key = BETA_ZONE if r.random() < 0.2 else ZONE
                affinity = [
                    [
                        {
                            "key": zone_key,
                            "operator": "In",
                            "values": r.sample(ZONES, r.randint(1, 2)),
                        }
                    ]
                ]
            else:
                affinity = None
            labels = {}
            if r.random() < (0.7 if immediate else 0.3):
                labels[r.choice((ZONE, BETA_ZONE))] = "__".join(r.sample(ZONES, r.randint(1, 2)))
            if r.random() < 0.3:
                labels["tier"] = r.choice(("gold", "silver"))
            use_csi = affinity is None or r.random() < 0.5
            case.pvs.append(
                pv(
                    name,
                    r.choice(SIZES),
                    storage_class=imm if immediate else wffc,
                    affinity=affinity,
                    modes=r.choice(PV_MODES),
                    labels=labels,
                    csi=(DRIVER, name) if use_csi else None,
                    phase=None,
                )
            )
        claims: list[str] = []
        for i in range(1 if r.random() < 0.7 else 2):
            name = f"c{q.rsplit('-', 1)[1]}-{i}"
            roll = r.random()
            if roll < 0.03:
                claims.append(f"missing-{i}")
                continue
            cls = wffc if roll < 0.6 else prov if roll < 0.83 and len(classes) == 3 else imm
            if cls == prov and len(classes) < 3:
                cls = wffc
            selector = (
                {"matchLabels": {"tier": r.choice(("gold", "silver"))}}
                if r.random() < 0.15
                else None
            )
            modes = ["ReadWriteOncePod"] if r.random() < 0.15 else ["ReadWriteOnce"]
            case.pvcs.append(
                pvc(
                    name,
                    r.choice(SIZES[:3]),
                    namespace=ns,
                    storage_class=cls,
                    modes=modes,
                    selector=selector,
                )
            )
            if cls == imm and r.random() < 0.75:
                case.pvs.append(self._immediate_pv(f"{q}-for-{i}", imm, selector, modes))
            claims.append(name)
            case.claims.append(name)
        if vc.shared_claims and r.random() < 0.2:
            claims.append(r.choice(vc.shared_claims))
        disks: list[Body] = []
        if r.random() < 0.6:
            disks = self._disks(ns, r.randint(1, 2))
            if r.random() < 0.6:
                claims, case.claims = [], []  # inline disks only
        case.pod = self._pod(pod_name, ns, claims, disks=disks)
        if r.random() < 0.15:
            case.pod["spec"]["nodeSelector"] = {ZONE: r.choice(ZONES)}
        return case
