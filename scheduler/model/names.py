"""Validation of Kubernetes names (qualified names, label values) and resource name kinds.

Label selectors and resource names are validated exactly where kube-scheduler (through
apimachinery) would reject them, so a malformed selector in a pod becomes a clear
:class:`~scheduler.model.errors.InvalidObjectError` rather than a silent mismatch.
"""

from __future__ import annotations

import re
from typing import Final

CPU: Final = "cpu"
MEMORY: Final = "memory"
EPHEMERAL_STORAGE: Final = "ephemeral-storage"
PODS: Final = "pods"
HUGEPAGES_PREFIX: Final = "hugepages-"
ATTACHABLE_VOLUMES_PREFIX: Final = "attachable-volumes-"
DEFAULT_NAMESPACE_PREFIX: Final = "kubernetes.io/"
DEVICE_CLASS_RESOURCE_PREFIX: Final = "deviceclass.resource.kubernetes.io/"
"""``deviceclass.resource.kubernetes.io/<class>``: every DeviceClass's implicit extended
resource name (DRAExtendedResource)."""
LABEL_HOSTNAME: Final = "kubernetes.io/hostname"

_QUALIFIED_NAME_PART: Final = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_DNS1123_SUBDOMAIN: Final = re.compile(
    r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
)
_LABEL_VALUE: Final = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")


def qualified_name_error(value: str) -> str | None:
    """Return why ``value`` is not a qualified name (like IsQualifiedName), or None."""
    parts = value.split("/")
    if len(parts) == 1:
        name = parts[0]
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix:
            return "prefix part must be non-empty"
        if len(prefix) > 253 or not _DNS1123_SUBDOMAIN.fullmatch(prefix):
            return "prefix part must be a lowercase RFC 1123 subdomain"
    else:
        return "a qualified name must consist of an optional DNS prefix and a name, joined by '/'"
    if not name:
        return "name part must be non-empty"
    if len(name) > 63:
        return "name part must be no more than 63 characters"
    if not _QUALIFIED_NAME_PART.fullmatch(name):
        return (
            "name part must consist of alphanumeric characters, '-', '_' or '.', and must "
            "start and end with an alphanumeric character"
        )
    return None


def subdomain_error(value: str) -> str | None:
    """Return why ``value`` is not an RFC 1123 subdomain (like IsDNS1123Subdomain: the
    name of most objects, a custom resource's included), or None."""
    if not value:
        return "must be non-empty"
    if len(value) > 253:
        return "must be no more than 253 characters"
    if not _DNS1123_SUBDOMAIN.fullmatch(value):
        return (
            "must be a lowercase RFC 1123 subdomain: lowercase alphanumeric characters, '-'"
            " or '.', starting and ending with an alphanumeric character"
        )
    return None


def label_value_error(value: str) -> str | None:
    """Return why ``value`` is not a valid label value, or None."""
    if len(value) > 63:
        return "must be no more than 63 characters"
    if not _LABEL_VALUE.fullmatch(value):
        return (
            "a valid label value must be an empty string or consist of alphanumeric "
            "characters, '-', '_' or '.', and must start and end with an alphanumeric character"
        )
    return None


def is_prefixed_native_resource(name: str) -> bool:
    return DEFAULT_NAMESPACE_PREFIX in name


def is_native_resource(name: str) -> bool:
    return "/" not in name or is_prefixed_native_resource(name)


def is_extended_resource(name: str) -> bool:
    """Device-plugin style resources such as ``nvidia.com/gpu`` (IsExtendedResourceName)."""
    if is_native_resource(name) or name.startswith("requests."):
        return False
    return qualified_name_error("requests." + name) is None


def is_dra_extended_resource(name: str) -> bool:
    """A name a DeviceClass may serve (kube's IsDRAExtendedResourceName): an extended
    resource, or a class's implicit ``deviceclass.resource.kubernetes.io/<class>``."""
    return name.startswith(DEVICE_CLASS_RESOURCE_PREFIX) or is_extended_resource(name)


def is_hugepages_resource(name: str) -> bool:
    return name.startswith(HUGEPAGES_PREFIX)


def is_scalar_resource(name: str) -> bool:
    """Resources kube-scheduler tracks in ``ScalarResources`` (IsScalarResourceName)."""
    return (
        is_extended_resource(name)
        or is_hugepages_resource(name)
        or is_prefixed_native_resource(name)
        or name.startswith(ATTACHABLE_VOLUMES_PREFIX)
    )


def is_tracked_resource(name: str) -> bool:
    """Whether the scheduler accounts this resource at all (cpu, memory, storage, scalars)."""
    return name in (CPU, MEMORY, EPHEMERAL_STORAGE) or is_scalar_resource(name)
