"""A TLS client context that trusts exactly the driver's certificate (workers and the
operator commands both connect to the driver this way)."""

from __future__ import annotations

import ssl


def pinned_ssl_context(cert_pem: bytes) -> ssl.SSLContext:
    """A client context trusting exactly the certificates in `cert_pem` (hostname checked).

    A pinned certificate issued by some CA is accepted as it is (partial chain): its issuer
    need not be known. Raises ssl.SSLError when `cert_pem` holds no PEM certificate.
    """
    context = ssl.create_default_context(cadata=cert_pem.decode("ascii"))
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    return context
