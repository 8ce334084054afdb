"""TLS material of the local cluster: a CA and one PEM keystore per node (``cryptography``).

Kafka reads PEM directly (``ssl.keystore.type=PEM``, ``ssl.truststore.type=PEM``)
and librdkafka takes the CA file as ``ssl.ca.location``, so no JKS or PKCS#12
and no ``keytool`` are needed. Keys are ECDSA P-256 (Java and OpenSSL both
take them), unencrypted PKCS#8, in files of mode 0600.

* :func:`ensure_ca` makes the cluster's CA once (``ca.pem``, ``ca.key``) and
  keeps it: clients that trust it keep working across restarts.
* :func:`write_node_keystore` writes a node's key, its certificate signed by
  the CA and the CA certificate, in one PEM file (the keystore). The
  certificate's subject alternative names are ``127.0.0.1``, ``localhost``
  and every host the node advertises, so hostname verification
  (``ssl.endpoint.identification.algorithm=https``, the default of both Kafka
  and librdkafka) passes for each address a client may use.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Iterable
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

#: How long the CA and node certificates are valid (days).
VALIDITY_DAYS = 3650
#: Names every node certificate carries besides the node's own host.
LOCAL_NAMES = ("127.0.0.1", "localhost")


def _write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` with mode 0600 (created so, never world-readable)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    os.replace(tmp, path)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def ensure_ca(folder: Path, name: str = "ledger local cluster CA") -> tuple[Path, Path]:
    """Make the cluster's CA in ``folder`` unless it is there; return its files.

    Args:
        folder: where ``ca.pem`` (certificate) and ``ca.key`` (private key,
            mode 0600) live.
        name: the CA's common name.

    Returns:
        ``(ca.pem, ca.key)``.

    Raises:
        ValueError: ``ca.pem`` exists but ``ca.key`` does not (or the other
            way round): delete both to make a new CA.
    """
    cert_path, key_path = folder / "ca.pem", folder / "ca.key"
    if cert_path.is_file() and key_path.is_file():
        return cert_path, key_path
    if cert_path.exists() or key_path.exists():
        raise ValueError(
            f"{folder} holds only half of a CA ({cert_path.name} or {key_path.name}); "
            "delete both to make a new CA (clients must then trust the new ca.pem)"
        )
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    start = _now() - datetime.timedelta(minutes=5)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + datetime.timedelta(days=VALIDITY_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
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
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write_private(key_path, _key_pem(key))
    folder.mkdir(parents=True, exist_ok=True)
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return cert_path, key_path


def _general_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def subject_alt_names(hosts: Iterable[str]) -> list[str]:
    """The names a node certificate carries: :data:`LOCAL_NAMES` and ``hosts``, once each.

    Args:
        hosts: the hosts the node advertises or listens on (IP addresses or
            DNS names).

    Returns:
        The names in order, duplicates dropped.
    """
    names: list[str] = []
    for host in (*LOCAL_NAMES, *hosts):
        if host and host not in names:
            names.append(host)
    return names


def write_node_keystore(
    path: Path, common_name: str, hosts: Iterable[str], ca_cert: Path, ca_key: Path
) -> Path:
    """Write a node's PEM keystore: its new key, its certificate, then the CA's.

    A new key and certificate every call (cheap), so the names always match
    the hosts the node advertises now.

    Args:
        path: the keystore file (written with mode 0600).
        common_name: the certificate's subject common name (e.g. ``node-1``).
        hosts: hosts the node advertises or listens on; see
            :func:`subject_alt_names`.
        ca_cert: the CA certificate (PEM), from :func:`ensure_ca`.
        ca_key: the CA private key (PEM, unencrypted).

    Returns:
        ``path``.

    Raises:
        ValueError: the CA files cannot be read as PEM.
    """
    ca = x509.load_pem_x509_certificate(ca_cert.read_bytes())
    signer = serialization.load_pem_private_key(ca_key.read_bytes(), password=None)
    if not isinstance(signer, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{ca_key} is not an EC private key made by testbed.certs")
    key = ec.generate_private_key(ec.SECP256R1())
    start = _now() - datetime.timedelta(minutes=5)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + datetime.timedelta(days=VALIDITY_DAYS))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.SubjectAlternativeName([_general_name(h) for h in subject_alt_names(hosts)]),
            critical=False,
        )
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(signer.public_key()),
            critical=False,
        )
        .sign(signer, hashes.SHA256())
    )
    _write_private(
        path,
        _key_pem(key)
        + cert.public_bytes(serialization.Encoding.PEM)
        + ca.public_bytes(serialization.Encoding.PEM),
    )
    return path
