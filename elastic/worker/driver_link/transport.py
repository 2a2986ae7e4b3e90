"""The worker's connections to the driver, plain or TLS with the driver's certificate pinned.

With TLS the worker gets the driver's certificate PEM (`elastic.protocol.env.TLS_CERT`) and
trusts it as its only CA: a server without that certificate's key is refused during the
handshake, and no system CA is consulted. The name the worker dials (IP address or host name)
must be among the certificate's subjectAltNames.
"""

from __future__ import annotations

import ssl
from typing import Any

import grpc
import httpx

from elastic.protocol.env import AUTH_SCHEME
from elastic.protocol.pinning import pinned_ssl_context


def http_client(
    base_url: str, token: str, cert_pem: bytes | None, timeout: httpx.Timeout
) -> httpx.Client:
    """An httpx client for the driver's HTTP API sending the job token on every request.

    With `cert_pem` the server must present that certificate (or one it issued) for the
    host in `base_url`; a mismatch raises httpx.ConnectError (not retryable in principle,
    but indistinguishable from a network error to callers that retry `TransportError`).
    Without it, `https://` URLs are checked against the system CAs and `http://` is plain.
    """
    verify: ssl.SSLContext | bool = True if cert_pem is None else pinned_ssl_context(cert_pem)
    return httpx.Client(
        base_url=base_url,
        headers={"Authorization": f"{AUTH_SCHEME} {token}"},
        timeout=timeout,
        verify=verify,
    )


def control_channel(
    address: str, cert_pem: bytes | None, options: list[tuple[str, Any]]
) -> grpc.Channel:
    """A gRPC channel to the control service at `address` ("host:port", "[v6]:port").

    With `cert_pem`: TLS trusting only those certificates as roots; gRPC checks the target
    host against the certificate's subjectAltNames (IPAddress entries for IP targets). A
    server with another certificate fails every call with UNAVAILABLE (the handshake
    fails; gRPC retries connecting with its backoff). Without it: an insecure channel.
    """
    if cert_pem is None:
        return grpc.insecure_channel(address, options=options)
    credentials = grpc.ssl_channel_credentials(root_certificates=cert_pem)
    return grpc.secure_channel(address, credentials, options=options)
