"""The gateway's own certificate authority, which only its sandboxes trust.

A session that uses secrets has its HTTPS connections opened by the egress relay
(`interception.py`): the relay shows the sandbox a certificate for the host it asked for,
signed by this CA, and opens its own verified TLS connection to the real host. The CA's
key is made once per runtime dir (`<runtime>/egress-ca/`, 0600, kept for the sessions a
restarted gateway adopts: they already trust it) and never leaves the gateway process:
a sandbox gets the certificate only. Leaf certificates are made on first use, one key for
all of them, and kept (at most `LEAVES`, a week each).
"""

from __future__ import annotations

import datetime
import os
import ssl
import threading
import time
from collections import OrderedDict
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

LEAVES = 256
LEAF_DAYS = 7
CA_YEARS = 10


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


class Authority:
    """The CA in `folder` (made there if missing)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._lock = threading.Lock()
        self._contexts: OrderedDict[str, tuple[ssl.SSLContext, float]] = OrderedDict()
        """Host → its context and when its certificate should be renewed (epoch seconds)."""
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        key_path, cert_path = folder / "ca.key", folder / "ca.pem"
        if key_path.exists() and cert_path.exists():
            self._key = serialization.load_pem_private_key(key_path.read_bytes(), None)
            self._cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        else:
            self._key, self._cert = _new_authority()
            _write(key_path, _key_pem(self._key))
            _write(cert_path, self._cert.public_bytes(serialization.Encoding.PEM))
        self._leaf_key = ec.generate_private_key(ec.SECP256R1())
        self._leaves = folder / "leaves"
        self._leaves.mkdir(mode=0o700, exist_ok=True)

    @property
    def certificate_pem(self) -> bytes:
        """What a sandbox trusts."""
        return self._cert.public_bytes(serialization.Encoding.PEM)

    def server_context(self, host: str) -> ssl.SSLContext:
        """A TLS server context showing a certificate for `host` (HTTP/1.1 only)."""
        with self._lock:
            found = self._contexts.get(host)
            if found is not None and found[1] > time.time():
                self._contexts.move_to_end(host)
                return found[0]
        context = self._make_context(host)
        renew = time.time() + (LEAF_DAYS - 1) * 86400  # a day before it expires
        with self._lock:
            self._contexts[host] = (context, renew)
            while len(self._contexts) > LEAVES:
                self._contexts.popitem(last=False)
        return context

    def _make_context(self, host: str) -> ssl.SSLContext:
        now = datetime.datetime.now(datetime.UTC)
        ca_key = self._key
        assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
        # The name is in the SAN; a CN holds at most 64 characters (long hosts exist).
        subject = _name(host) if len(host) <= 64 else x509.Name([])
        leaf = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self._cert.subject)
            .public_key(self._leaf_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=LEAF_DAYS))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=False,
                    crl_sign=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(self._leaf_key.public_key()),
                critical=False,
            )
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                critical=False,
            )
            .sign(ca_key, hashes.SHA256())
        )
        path = self._leaves / f"{os.getpid()}-{threading.get_ident()}.pem"
        _write(path, _key_pem(self._leaf_key) + leaf.public_bytes(serialization.Encoding.PEM))
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            context.load_cert_chain(path)
        finally:
            path.unlink(missing_ok=True)
        context.set_alpn_protocols(["http/1.1"])
        return context


def _new_authority() -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    name = _name("kernel-gateway egress CA (sandboxes only)")
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=365 * CA_YEARS))
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
    return key, cert


def _key_pem(key: object) -> bytes:
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _write(path: Path, data: bytes) -> None:
    temporary = path.with_name(path.name + ".tmp")
    fd = os.open(temporary, os.O_CREAT | os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(temporary, path)
