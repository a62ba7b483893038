"""Certificates and credentials for a local control plane.

A throwaway CA signs the API server's serving certificate (so clients verify
TLS instead of skipping it), and each client gets a bearer token mapped to a
user and groups in kube-apiserver's static token file. Tokens keep the
kubeconfigs short; RBAC still decides what each user may do, which is what the
least-privilege tests need.

Some users also get an x509 client certificate signed by the same CA (CN = user
name, O = groups, as kube-apiserver's ``--client-ca-file`` maps them), which is
how kind and kubeadm kubeconfigs authenticate; the CA key stays in the folder
(0600) so certificates can be issued after the cluster is up.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import secrets
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID


@dataclass(frozen=True)
class User:
    """A static-token identity for one client of the control plane."""

    name: str
    groups: tuple[str, ...] = ()


ADMIN = User("lattice-admin", ("system:masters",))
KUBE_SCHEDULER = User("system:kube-scheduler")
KWOK = User("kwok-controller", ("system:masters",))
APISERVER_KUBELET_CLIENT = User("kube-apiserver-kubelet-client", ("system:masters",))
"""The API server's identity towards kubelets (logs, exec), named as kubeadm names it."""


def _pem_key(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def write_pki(directory: Path) -> None:
    """Write ca.{crt,key}, apiserver.{crt,key} and sa.{key,pub} into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)
    not_after = now + dt.timedelta(days=365)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(_name("lattice-devcluster-ca"))
        .issuer_name(_name("lattice-devcluster-ca"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )

    server_key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = [
        x509.DNSName("localhost"),
        x509.DNSName("kubernetes"),
        x509.DNSName("kubernetes.default"),
        x509.DNSName("kubernetes.default.svc"),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.IPAddress(ipaddress.ip_address("10.0.0.1")),
    ]
    server_cert = (
        x509.CertificateBuilder()
        .subject_name(_name("kube-apiserver"))
        .issuer_name(ca_cert.subject)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(not_after)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )

    # Service-account tokens are signed with RSA, the algorithm every client accepts.
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)

    (directory / "ca.crt").write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    _write_private(directory / "ca.key", _pem_key(ca_key))
    (directory / "apiserver.crt").write_bytes(server_cert.public_bytes(serialization.Encoding.PEM))
    _write_private(directory / "apiserver.key", _pem_key(server_key))
    _write_private(directory / "sa.key", _pem_key(sa_key))
    (directory / "sa.pub").write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )


def write_client_cert(directory: Path, user: User) -> tuple[Path, Path]:
    """Issue ``user`` a client certificate from the CA in ``directory``; returns the
    paths of ``<name>.crt`` and ``<name>.key``."""
    ca_cert = x509.load_pem_x509_certificate((directory / "ca.crt").read_bytes())
    ca_key = serialization.load_pem_private_key((directory / "ca.key").read_bytes(), None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"unexpected CA key type in {directory}")
    now = dt.datetime.now(dt.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name(
        [
            *(x509.NameAttribute(NameOID.ORGANIZATION_NAME, group) for group in user.groups),
            x509.NameAttribute(NameOID.COMMON_NAME, user.name),
        ]
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=365))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    cert_path, key_path = directory / f"{user.name}.crt", directory / f"{user.name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_private(key_path, _pem_key(key))
    return cert_path, key_path


def _write_private(path: Path, data: bytes) -> None:
    path.touch(mode=0o600)
    path.write_bytes(data)


def write_token_file(path: Path, users: list[User]) -> dict[str, str]:
    """Write kube-apiserver's static token CSV and return user name -> token."""
    tokens: dict[str, str] = {}
    lines = []
    for i, user in enumerate(users):
        token = secrets.token_hex(24)
        tokens[user.name] = token
        groups = ",".join(user.groups)
        lines.append(f'{token},{user.name},uid-{i},"{groups}"')
    path.touch(mode=0o600)
    path.write_text("\n".join(lines) + "\n")
    return tokens
