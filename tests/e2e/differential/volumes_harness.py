"""Drive kube-scheduler (with kube-controller-manager's PV binder) through volume cases.

Per cluster: the base harness creates namespaces, nodes and the bound pods and proves
kube-scheduler has seen them; then every StorageClass, PV, PVC and CSINode of the cluster
and of all its cases is created in one batch. Before any case runs, the PV controller must
have settled (every PV has a phase, the bound pods' claims are bound, and nothing changes
for two seconds: Immediate claims that can bind are bound) and kube-scheduler must have
seen the batch: a sentinel pod whose claim, class and PV are created last must bind
through that PV (watch streams deliver each kind in order, so the sentinel's objects come
after every other one).

The state Lattice reads is then listed once for the whole cluster (cases cannot touch each
other's objects). A case's verdict is kube-scheduler's binding, its FailedScheduling
message, or — for a claim it chose to provision, where it now waits for a provisioner that
does not exist — the ``volume.kubernetes.io/selected-node`` annotation it wrote on the claim
(the annotation is then removed so kube-scheduler forgets the pod before the next case).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any, cast

from kubernetes_asyncio import client

from lattice_dev.devcluster.kube import poll
from scheduler.model.volume import SELECTED_NODE
from tests.e2e.differential.gen import Body
from tests.e2e.differential.harness import KubeSide, Verdict, _verdict
from tests.e2e.differential.volumes_check import KubeVolumes
from tests.e2e.differential.volumes_gen import Case, VolumeCluster
from tests.e2e.differential.volumes_objects import claim_volume, pv, pvc, storage_class

SETTLE_SECONDS = 2.0
PROVISIONING = "selected-node"
"""Marks a verdict read from a claim's annotation (the pod is still held in PreBind)."""


@dataclass
class VolumeWorld:
    nodes: list[Body]
    pods: list[Body]
    namespaces: list[Body]
    pvs: list[Body]
    pvcs: list[Body]
    classes: list[Body]
    csi_nodes: list[Body]
    attachments: list[Body]


async def _items(response: Any) -> list[Body]:
    items: list[Body] = json.loads(await cast(Any, response).read())["items"]
    return items


class VolumeKubeSide:
    def __init__(self, api: client.ApiClient) -> None:
        self.base = KubeSide(api)
        self.core = client.CoreV1Api(api)
        self.storage = client.StorageV1Api(api)

    async def setup(self, vc: VolumeCluster) -> VolumeWorld:
        cl = vc.cluster
        await self.base.setup(cl)
        for body in vc.csi_nodes:
            await self.storage.create_csi_node(cast(client.V1CSINode, body))
        await asyncio.gather(
            *(
                self.storage.create_storage_class(cast(client.V1StorageClass, b))
                for b in vc.all_classes()
            )
        )
        await asyncio.gather(
            *(
                self.core.create_persistent_volume(cast(client.V1PersistentVolume, b))
                for b in vc.all_pvs()
            )
        )
        # Claims only once the PV controller has given every PV its first phase: a claim
        # bound while the controller writes that status conflicts, and the retry waits for
        # the controller's 15 s resync.
        await self._pvs_phased(vc)
        await asyncio.gather(
            *(
                self.core.create_namespaced_persistent_volume_claim(
                    cl.namespace, cast(client.V1PersistentVolumeClaim, b)
                )
                for b in vc.all_pvcs()
            )
        )
        await self._settle(vc)
        await self._sentinel(vc)
        return await self.world()

    async def _pvs_phased(self, vc: VolumeCluster) -> None:
        names = {b["metadata"]["name"] for b in vc.all_pvs()}

        async def phased() -> bool:
            pvs = await _items(await self.core.list_persistent_volume(_preload_content=False))
            return all(
                (p.get("status") or {}).get("phase") for p in pvs if p["metadata"]["name"] in names
            )

        await poll(phased, within=60, interval=0.1)

    async def _settle(self, vc: VolumeCluster) -> None:
        names = {b["metadata"]["name"] for b in vc.all_pvs()}
        shared = {b["metadata"]["name"] for b in vc.pvcs}
        last: tuple[Any, ...] = ()
        stable_since = asyncio.get_running_loop().time()

        async def settled() -> bool:
            nonlocal last, stable_since
            pvs = await _items(await self.core.list_persistent_volume(_preload_content=False))
            pvcs = await _items(
                await self.core.list_namespaced_persistent_volume_claim(
                    vc.cluster.namespace, _preload_content=False
                )
            )
            mine = [p for p in pvs if p["metadata"]["name"] in names]
            phased = all((p.get("status") or {}).get("phase") for p in mine)
            # The bound pods' pre-bound pairs must be bound (the PV controller can take seconds).
            phased = phased and all(
                (c.get("status") or {}).get("phase") == "Bound"
                for c in pvcs
                if c["metadata"]["name"] in shared
            )
            now = tuple(
                sorted(
                    (c["metadata"]["name"], (c.get("status") or {}).get("phase", "")) for c in pvcs
                )
            ) + tuple(sorted((p["metadata"]["name"], p["status"].get("phase", "")) for p in mine))
            loop_time = asyncio.get_running_loop().time()
            if now != last or not phased:
                last, stable_since = now, loop_time
                return False
            return loop_time - stable_since >= SETTLE_SECONDS

        await poll(settled, within=60, interval=0.2)

    async def _sentinel(self, vc: VolumeCluster) -> None:
        ns, prefix = vc.cluster.namespace, vc.cluster.namespace
        node = vc.cluster.nodes[0]["metadata"]["name"]
        cls = f"{prefix}-sentinel"
        await self.storage.create_storage_class(cast(client.V1StorageClass, storage_class(cls)))
        await self.core.create_persistent_volume(
            cast(
                client.V1PersistentVolume, pv(cls, "1Gi", storage_class=cls, host=node, phase=None)
            )
        )
        await self.core.create_namespaced_persistent_volume_claim(
            ns,
            cast(
                client.V1PersistentVolumeClaim,
                pvc("sentinel", "1Gi", namespace=ns, storage_class=cls),
            ),
        )
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "vol-sentinel", "namespace": ns},
            "spec": {
                "containers": [{"name": "c", "image": "busybox"}],
                "tolerations": [{"operator": "Exists"}],
                "volumes": [claim_volume("v", "sentinel")],
            },
        }
        await self.core.create_namespaced_pod(ns, cast(client.V1Pod, body))

        async def bound() -> bool:
            pod = await self.core.read_namespaced_pod("vol-sentinel", ns)
            return bool(pod.spec.node_name)

        await poll(bound, within=60, interval=0.1)
        await self.base._delete_pod(ns, "vol-sentinel")

    async def world(self) -> VolumeWorld:
        lists = await asyncio.gather(
            self.core.list_node(_preload_content=False),
            self.core.list_pod_for_all_namespaces(_preload_content=False),
            self.core.list_namespace(_preload_content=False),
            self.core.list_persistent_volume(_preload_content=False),
            self.core.list_persistent_volume_claim_for_all_namespaces(_preload_content=False),
            self.storage.list_storage_class(_preload_content=False),
            self.storage.list_csi_node(_preload_content=False),
            self.storage.list_volume_attachment(_preload_content=False),
        )
        nodes, pods, namespaces, pvs, pvcs, classes, csi_nodes, vas = [
            await _items(r) for r in lists
        ]
        bound = [p for p in pods if (p.get("spec") or {}).get("nodeName")]
        return VolumeWorld(nodes, bound, namespaces, pvs, pvcs, classes, csi_nodes, vas)

    async def place(self, vc: VolumeCluster, case: Case) -> tuple[Verdict, KubeVolumes]:
        """kube-scheduler's verdict, and the PVs it chose (or claims it provisioned)."""
        ns, name = vc.cluster.namespace, case.pod["metadata"]["name"]
        await self.core.create_namespaced_pod(ns, cast(client.V1Pod, case.pod))

        async def decided() -> Verdict | None:
            verdict = _verdict(await self.core.read_namespaced_pod(name, ns))
            if verdict is not None:
                return verdict
            for claim in case.claims:
                body = await self.core.read_namespaced_persistent_volume_claim(claim, ns)
                selected = (body.metadata.annotations or {}).get(SELECTED_NODE)
                if selected:
                    return Verdict(selected, None, prefilter=PROVISIONING)
            return None

        verdict = await poll(decided, within=60, interval=0.05)
        written = KubeVolumes({}, frozenset())
        if verdict.node is not None:
            written = await self._written(ns, case, provisioning=verdict.prefilter == PROVISIONING)
        if verdict.prefilter == PROVISIONING:
            await self._release(ns, name, case)
            verdict = Verdict(verdict.node, None)
        await self.base._delete_pod(ns, name)
        return verdict, written

    async def _written(self, ns: str, case: Case, *, provisioning: bool) -> KubeVolumes:
        """The claimRefs kube-scheduler's PreBind wrote on PVs for the pod's own claims,
        and the claims it annotated with its selected node.

        PreBind writes every PV before any claim's annotation, so once one annotation is
        seen the PVs are final; the other annotations follow one by one, so with
        ``provisioning`` this waits (briefly) until each claim is annotated or has a PV."""
        mine = set(case.claims)

        async def read() -> KubeVolumes | None:
            pvs = await _items(await self.core.list_persistent_volume(_preload_content=False))
            static = {}
            for body in pvs:
                ref = body["spec"].get("claimRef") or {}
                if ref.get("namespace") == ns and ref.get("name") in mine:
                    static[ref["name"]] = body["metadata"]["name"]
            annotated = set()
            for claim in mine - set(static):
                got = await self.core.read_namespaced_persistent_volume_claim(claim, ns)
                if (got.metadata.annotations or {}).get(SELECTED_NODE):
                    annotated.add(claim)
            if provisioning and set(static) | annotated != mine:
                return None
            return KubeVolumes(static, frozenset(annotated))

        return await poll(read, within=10, interval=0.05)

    async def _release(self, ns: str, name: str, case: Case) -> None:
        """End kube-scheduler's wait for a provisioner that does not exist.

        It holds the pod as assumed on the node (its volumes count there for the next
        cases) until the claim binds or its selected-node annotation goes away; removing
        the annotation fails the binding, which forgets the pod before it is reported.
        """
        unset = {"metadata": {"annotations": {SELECTED_NODE: None}}}
        for claim in case.claims:
            await self.core.patch_namespaced_persistent_volume_claim(claim, ns, unset)

        async def failed() -> bool:
            pod = await self.core.read_namespaced_pod(name, ns)
            return any(
                c.type == "PodScheduled"
                and c.status == "False"
                and "VolumeBinding" in (c.message or "")
                for c in pod.status.conditions or []
            )

        await poll(failed, within=30, interval=0.05)

    async def teardown(self, vc: VolumeCluster) -> None:
        await self.base.teardown(vc.cluster)
        prefix = vc.cluster.namespace
        pv_names = [b["metadata"]["name"] for b in vc.all_pvs()] + [f"{prefix}-sentinel"]
        class_names = [b["metadata"]["name"] for b in vc.all_classes()] + [f"{prefix}-sentinel"]
        await asyncio.gather(*(self.core.delete_persistent_volume(n) for n in pv_names))
        await asyncio.gather(*(self.storage.delete_storage_class(n) for n in class_names))
        await asyncio.gather(
            *(self.storage.delete_csi_node(b["metadata"]["name"]) for b in vc.csi_nodes)
        )
