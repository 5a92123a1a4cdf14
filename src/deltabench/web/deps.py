"""Dependencies of the routes: the settings, a database session per request, and access checks.

``SessionDep`` opens one session per request and commits when the route returns, before the response is sent: a
client that reads right after a write (a browser following a form's redirect, a script after a 201) sees it.
``WriteTokenDep`` demands a live bearer token (401 without one, 403 for an unknown or revoked one);
``ReadAccessDep`` does the same only when the app is configured to require tokens for reads. Browsers (the
pages) may carry the token in the ``deltabench_token`` cookie or a form field instead of the header.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from deltabench.db.engine import session_scope
from deltabench.db.models import ApiToken

from .config import Settings
from .security.tokens import authenticate

__all__ = [
    "TOKEN_COOKIE",
    "ReadAccessDep",
    "SessionDep",
    "SettingsDep",
    "WriteTokenDep",
    "bearer",
    "check_token",
    "get_session",
    "get_settings",
]

TOKEN_COOKIE = "deltabench_token"
bearer = HTTPBearer(auto_error=False, description="A token made with `deltabench token create --name NAME`.")


def get_settings(request: Request) -> Settings:
    """The app's settings."""
    return request.app.state.settings


def get_session(request: Request) -> Iterator[Session]:
    """A session for this request; committed when the route returns, rolled back if it raises."""
    with session_scope(request.app.state.engine) as session:
        yield session


SettingsDep = Annotated[Settings, Depends(get_settings)]
# scope="function": the commit runs before the response goes out. FastAPI's default ("request") commits after it
# is sent, so a redirect could be followed, or a 201 acted on, before the write is visible.
SessionDep = Annotated[Session, Depends(get_session, scope="function")]


def check_token(session: Session, token: str | None) -> ApiToken:
    """The live token row for `token`; 401 when no token was given, 403 when it is unknown or revoked."""
    if not token:
        raise HTTPException(
            status_code=401,
            detail="this needs a bearer token: make one with `deltabench token create --name NAME`",
            headers={"WWW-Authenticate": "Bearer"},
        )
    row = authenticate(session, token)
    if row is None:
        raise HTTPException(status_code=403, detail="the token is unknown or revoked")
    return row


def _request_token(request: Request, credentials: HTTPAuthorizationCredentials | None) -> str | None:
    if credentials is not None and credentials.credentials:
        return credentials.credentials
    return request.cookies.get(TOKEN_COOKIE) or None


def require_write_token(
    request: Request,
    session: SessionDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> ApiToken:
    """The caller's token, which every write needs."""
    return check_token(session, _request_token(request, credentials))


def require_read_access(
    request: Request,
    session: SessionDep,
    settings: SettingsDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> ApiToken | None:
    """Nothing when reads are open (the default); the caller's token when reads need one."""
    if not settings.read_token_required:
        return None
    return check_token(session, _request_token(request, credentials))


WriteTokenDep = Annotated[ApiToken, Depends(require_write_token)]
ReadAccessDep = Annotated[ApiToken | None, Depends(require_read_access)]
