"""What makes a job's documents in etcd trustworthy: MACs keyed by the job token.

etcd may be readable, even writable, by others (a shared cluster, a role wider than one job).
So etcd holds no secret in clear, and whatever a driver or a worker acts on is authenticated
with keys only the job's driver and workers hold, derived from the job token:

* `document_mac`: HMAC-SHA256 of a document, bound to its job and its key name (a `state`
  cannot pass for a `spec`, nor one job's documents for another's, even under one token);
* `token_check`: HMAC-SHA256 of a fixed label and the job id, keyed by the token. Stored in
  etcd so that a restarted driver tells a wrong token from a changed document. It reveals
  nothing about the token (nor does any MAC here): a reader cannot join, and a writer cannot
  make a document that verifies.

The keys come from the token by HMAC-SHA256 with a label per use: the token itself keys no
MAC, as it is also the bearer secret of the driver's API. A token made by the driver is 256
random bits; one the operator gives (`--token-file`, `$ELASTICRUN_TOKEN`) must be as hard to
guess, since anyone who reads etcd can test guesses against these MACs offline.
"""

from __future__ import annotations

import hashlib
import hmac

_KEY_LABEL = b"elasticrun etcd document key v1\0"
_CHECK_LABEL = b"elasticrun etcd token check v1\0"


def _document_key(token: str) -> bytes:
    return hmac.new(token.encode(), _KEY_LABEL, hashlib.sha256).digest()


def document_mac(token: str, job_id: str, name: str, value: bytes) -> str:
    """HMAC-SHA256 (hex) of document `name` of job `job_id`, under a key derived from `token`.

    Job ids and key names hold no NUL byte, so the three parts cannot be shifted."""
    message = b"\0".join((job_id.encode(), name.encode(), value))
    return hmac.new(_document_key(token), message, hashlib.sha256).hexdigest()


def document_authentic(
    token: str, job_id: str, name: str, value: bytes, mac: bytes | str | None
) -> bool:
    """Whether `mac` is `document_mac` of the document (constant time); False without a
    token or a MAC."""
    if not token or not mac:
        return False
    given = mac.decode(errors="replace") if isinstance(mac, bytes) else mac
    return hmac.compare_digest(document_mac(token, job_id, name, value), given.strip())


def token_check(token: str, job_id: str) -> str:
    """What etcd keeps to tell whether a token is job `job_id`'s: HMAC-SHA256 of a fixed label
    and the job id, keyed by the token (hex)."""
    return hmac.new(token.encode(), _CHECK_LABEL + job_id.encode(), hashlib.sha256).hexdigest()


def token_matches(token: str, job_id: str, check: bytes | str | None) -> bool:
    """Whether `token` is the one `check` (a stored `token_check`) was made with."""
    if not token or not check:
        return False
    given = check.decode(errors="replace") if isinstance(check, bytes) else check
    return hmac.compare_digest(token_check(token, job_id), given.strip())
