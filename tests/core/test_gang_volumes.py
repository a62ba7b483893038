"""Which volumes a gang may have: bound claims only (the joint placement judges each
member's volumes alone), no ReadWriteOncePod claim two members share, no inline disks."""

from __future__ import annotations

from typing import Any

from scheduler.core.volumes import GANG_CLAIMS_ADVICE, gang_volume_refusal, volume_state_from_api
from scheduler.model.pod import Pod
from tests.builders import make_pod
from tests.e2e.differential.volumes_objects import claim_volume, pv, pvc, storage_class


def member(name: str, *volumes: dict[str, Any]) -> Pod:
    builder = make_pod(name)
    builder.body["spec"]["volumes"] = list(volumes)
    return builder.build()


def storage() -> Any:
    built = volume_state_from_api(
        pvs=[
            pv("shared", claim=("default", "shared"), phase="Bound"),
            pv("solo", claim=("default", "solo"), phase="Bound", modes=("ReadWriteOncePod",)),
        ],
        pvcs=[
            pvc("shared", volume_name="shared", bound=True),
            pvc("solo", volume_name="solo", bound=True, modes=("ReadWriteOncePod",)),
            pvc("waiting"),
        ],
        classes=[storage_class("local")],
    )
    assert not built.skipped
    return built.state


def test_bound_claims_are_admitted_even_when_shared() -> None:
    members = [member(f"w{i}", claim_volume("d", "shared")) for i in range(3)]
    assert gang_volume_refusal(members, storage()) is None


def test_an_unbound_or_missing_claim_is_refused_naming_the_member() -> None:
    waiting = [
        member("w0", claim_volume("d", "shared")),
        member("w1", claim_volume("d", "waiting")),
    ]
    assert gang_volume_refusal(waiting, storage()) == (
        f'member default/w1: claim "waiting" is not bound; {GANG_CLAIMS_ADVICE}'
    )
    missing = [member("w0", claim_volume("d", "nope"))]
    assert gang_volume_refusal(missing, storage()) == (
        'member default/w0: persistentvolumeclaim "nope" not found'
    )


def test_a_read_write_once_pod_claim_may_serve_one_member_only() -> None:
    one = [member("w0", claim_volume("d", "solo")), member("w1", claim_volume("d", "shared"))]
    assert gang_volume_refusal(one, storage()) is None
    two = [member("w0", claim_volume("d", "solo")), member("w1", claim_volume("d", "solo"))]
    assert gang_volume_refusal(two, storage()) == (
        'members default/w0 and default/w1 share the ReadWriteOncePod claim "solo"'
    )


def test_inline_disks_are_refused() -> None:
    disk = {"name": "scratch", "gcePersistentDisk": {"pdName": "pd-1"}}
    assert gang_volume_refusal([member("w0", disk)], storage()) == (
        f'member default/w0: inline gcePersistentDisk volume "scratch"; {GANG_CLAIMS_ADVICE}'
    )
