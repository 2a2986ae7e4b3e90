"""The driver's TLS identity: the certificate and key its HTTP API and control service present.

Either the user's own (`TlsIdentity.load`, from `--tls-cert`/`--tls-key`) or one made for the
job (`TlsIdentity.make_self_signed`). Workers pin the certificate: they get its PEM (public)
and trust it as their only CA (`elastic.worker.driver_link.transport`), so no public CA is involved.

The private key stays in memory. It is written nowhere except, for the moment the HTTP
server's `ssl.SSLContext` reads it (Python's ssl module loads keys only from a path), into an
anonymous in-memory file (Linux `memfd`), or where that is missing into a private temporary
directory (0700, file 0600) removed at once. It never appears in a repr, a log or a command line.
Nor is it saved with the job (etcd backend): a restarted driver loads the user's files again or
makes a new self-signed identity, whose certificate it publishes for the workers to pin.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import ipaddress
import os
import shutil
import ssl
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from elastic.driver.errors import UsageError

DEFAULT_DAYS = 365
# Hosts' clocks differ: a certificate made on the driver is valid from a while before now.
_BACKDATE = datetime.timedelta(hours=1)


@dataclass(frozen=True)
class TlsIdentity:
    """A PEM certificate (chain, leaf first) and its PEM private key (PKCS#8, unencrypted).

    `key_pem` is secret: it is left out of the repr.
    """

    cert_pem: bytes
    key_pem: bytes = field(repr=False)

    @classmethod
    def make_self_signed(cls, hosts: list[str], days: int = DEFAULT_DAYS) -> TlsIdentity:
        """A new P-256 key and a self-signed certificate for `hosts`, valid for `days` days
        (from an hour ago, for clock skew).

        Each host becomes a subjectAltName: an IP address ("127.0.0.1", "::1", "[::1]") an
        IPAddress entry, anything else a DNSName. Clients check the name they dial against
        these, so pass every address workers connect to. Raises ValueError for no hosts, an
        empty name, a wildcard address (0.0.0.0, ::: no client dials it) or `days` < 1.
        """
        if not hosts:
            raise ValueError("a certificate needs at least one host")
        if days < 1:
            raise ValueError(f"days must be at least 1, not {days}")
        names: list[x509.GeneralName] = []
        for host in hosts:
            name = _subject_alt_name(host)
            if name not in names:
                names.append(name)
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "elasticrun driver")])
        now = datetime.datetime.now(datetime.UTC)
        public_key = key.public_key()
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _BACKDATE)
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
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
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(public_key), critical=False
            )
            .sign(key, hashes.SHA256())
        )
        return cls(cert.public_bytes(serialization.Encoding.PEM), _pkcs8(key))

    @classmethod
    def load(
        cls, cert_path: str | os.PathLike[str], key_path: str | os.PathLike[str]
    ) -> TlsIdentity:
        """The certificate (chain, leaf first) and unencrypted private key in PEM files.

        Raises UsageError, with one line naming the file, when a file is missing or
        unreadable, holds no PEM certificate or key, the key is encrypted, the key does not
        belong to the first certificate, or that certificate has expired.
        """
        cert_data = _read(cert_path, "--tls-cert")
        key_data = _read(key_path, "--tls-key")
        try:
            certs = x509.load_pem_x509_certificates(cert_data)
        except ValueError:
            raise UsageError(f"--tls-cert {cert_path}: no PEM certificate in it") from None
        try:
            key = serialization.load_pem_private_key(key_data, password=None)
        except TypeError:
            raise UsageError(
                f"--tls-key {key_path}: the key is encrypted; give an unencrypted PEM key"
            ) from None
        except (ValueError, UnsupportedAlgorithm):
            raise UsageError(f"--tls-key {key_path}: no PEM private key in it") from None
        leaf = certs[0]
        if _public_der(key.public_key()) != _public_der(leaf.public_key()):
            raise UsageError(
                f"--tls-key {key_path} does not belong to the certificate in {cert_path}"
            )
        if leaf.not_valid_after_utc <= datetime.datetime.now(datetime.UTC):
            raise UsageError(
                f"--tls-cert {cert_path}: the certificate expired on {leaf.not_valid_after_utc}"
            )
        chain = b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certs)
        return cls(chain, _pkcs8(key))

    def fingerprint(self) -> str:
        """SHA-256 of the leaf certificate (DER), hex: safe to log."""
        leaf = x509.load_pem_x509_certificates(self.cert_pem)[0]
        return hashlib.sha256(leaf.public_bytes(serialization.Encoding.DER)).hexdigest()

    def server_ssl_context(self) -> ssl.SSLContext:
        """A server-side context (TLS 1.2 or newer) presenting this identity, for asyncio or
        uvicorn. Clients are not asked for certificates (they authenticate with the job token)."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        with _pem_files(self.cert_pem, self.key_pem) as (cert_file, key_file):
            context.load_cert_chain(cert_file, key_file)
        return context

    def grpc_server_credentials(self) -> grpc.ServerCredentials:
        """Credentials for `add_secure_port` of a grpc.aio server presenting this identity
        (no client certificates)."""
        return grpc.ssl_server_credentials([(self.key_pem, self.cert_pem)])


def _subject_alt_name(host: str) -> x509.GeneralName:
    bare = host.strip()
    if bare.startswith("[") and bare.endswith("]"):
        bare = bare[1:-1]
    if not bare:
        raise ValueError(f"not a host name: {host!r}")
    try:
        address = ipaddress.ip_address(bare)
    except ValueError:
        return x509.DNSName(bare)
    if address.is_unspecified:
        raise ValueError(
            f"{host} (any address) matches no connection: give the addresses workers dial"
        )
    return x509.IPAddress(address)


def _pkcs8(key: object) -> bytes:
    return key.private_bytes(  # type: ignore[attr-defined]
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _public_der(public_key: object) -> bytes:
    return public_key.public_bytes(  # type: ignore[attr-defined]
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def _read(path: str | os.PathLike[str], flag: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise UsageError(f"{flag} {path}: no such file") from None
    except IsADirectoryError:
        raise UsageError(f"{flag} {path}: is a directory") from None
    except OSError as err:
        raise UsageError(f"{flag} {path}: cannot read it: {err.strerror}") from None


@contextlib.contextmanager
def _pem_files(cert_pem: bytes, key_pem: bytes) -> Iterator[tuple[str, str]]:
    """Paths holding the certificate and key while the block runs, gone afterwards.

    Linux: anonymous in-memory files (memfd), reachable only through this process's
    /proc/self/fd. Elsewhere: a fresh 0700 directory with 0600 files, removed at the end.
    """
    if hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd"):
        fds: list[int] = []
        try:
            for name, data in (("elastic-cert", cert_pem), ("elastic-key", key_pem)):
                fd = os.memfd_create(name, os.MFD_CLOEXEC)
                fds.append(fd)
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
            yield f"/proc/self/fd/{fds[0]}", f"/proc/self/fd/{fds[1]}"
        finally:
            for fd in fds:
                os.close(fd)
        return
    directory = tempfile.mkdtemp(prefix="elastic-tls-")  # mode 0700
    try:
        paths = []
        for name, data in (("cert.pem", cert_pem), ("key.pem", key_pem)):
            path = os.path.join(directory, name)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as file:
                file.write(data)
            paths.append(path)
        yield paths[0], paths[1]
    finally:
        shutil.rmtree(directory, ignore_errors=True)
