"""Bearer tokens for writes: made once, shown once, stored as a sha256 hash.

A token is ``dbt_`` followed by 32 random bytes in URL-safe base64. Only its sha256 hex digest is kept in
``api_tokens``; a request's token is hashed and looked up, so a leaked database does not leak tokens.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import re
import secrets

from sqlalchemy.orm import Session

from deltabench.db import queries
from deltabench.db.models import ApiToken
from deltabench.harness.errors import BadInput

__all__ = ["TOKEN_PREFIX", "authenticate", "create_token", "hash_token", "revoke_token"]

TOKEN_PREFIX = "dbt_"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,127}")
# Refresh last_used_at at most this often, so reads of a busy worker do not turn into a write per request.
_TOUCH_EVERY = _dt.timedelta(minutes=1)


def hash_token(token: str) -> str:
    """The sha256 hex digest a token is stored as."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def create_token(session: Session, *, name: str) -> str:
    """Make a token called `name`, store its hash and return the token itself (the only time it is seen).

    Raises:
        BadInput: a malformed name, or one already used.
    """
    if not _NAME.fullmatch(name):
        raise BadInput(f"token name {name!r}: use 1-128 letters, digits and ._@+- (starting with a letter or digit)")
    if queries.get_api_token(session, name=name) is not None:
        raise BadInput(f"a token named {name!r} exists already (revoke it or pick another name)")
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    session.add(ApiToken(name=name, token_sha256=hash_token(token)))
    session.flush()
    return token


def revoke_token(session: Session, *, name: str) -> None:
    """Revoke the token called `name` (it stays listed, marked revoked).

    Raises:
        BadInput: no such token.
    """
    row = queries.get_api_token(session, name=name)
    if row is None:
        raise BadInput(f"no token named {name!r}")
    row.revoked = True
    session.flush()


def authenticate(session: Session, token: str) -> ApiToken | None:
    """The live token row `token` belongs to, or None (unknown or revoked). Records when it was last used."""
    if not token.startswith(TOKEN_PREFIX) or len(token) > 256:
        return None
    row = queries.get_api_token(session, token_sha256=hash_token(token))
    if row is None or row.revoked:
        return None
    now = _dt.datetime.now(_dt.timezone.utc)
    last = row.last_used_at
    if last is not None and last.tzinfo is None:
        last = last.replace(tzinfo=_dt.timezone.utc)
    if last is None or now - last > _TOUCH_EVERY:
        row.last_used_at = now
        session.flush()
    return row
