"""The one authentication check every route depends on."""

from __future__ import annotations

import hmac
import logging
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status

from elastic.driver.server.services import Services
from elastic.protocol.env import AUTH_SCHEME

log = logging.getLogger(__name__)


def services(request: Request) -> Services:
    return request.app.state.services


ServicesDep = Annotated[Services, Depends(services)]


def require_token(request: Request) -> None:
    """Raise 401 unless the request carries `Authorization: Bearer <job token>`.

    The comparison takes constant time; a refused peer is logged once.
    """
    expected = services(request).token
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    if scheme == AUTH_SCHEME and hmac.compare_digest(given.encode(), expected.encode()):
        return
    peer = request.client.host if request.client else "unknown"
    refused: set[str] = request.app.state.refused_peers
    if peer not in refused:
        refused.add(peer)
        log.warning("refused an unauthenticated HTTP request from %s", peer)
    raise HTTPException(
        status.HTTP_401_UNAUTHORIZED,
        "missing or wrong job token",
        headers={"WWW-Authenticate": AUTH_SCHEME},
    )
