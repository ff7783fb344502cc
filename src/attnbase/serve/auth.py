"""API tokens: ``attnbase token create|list|revoke|delete`` and the service's check of them.

A token is ``ab_`` + 43 URL-safe characters (256 random bits, :func:`secrets.token_urlsafe`);
the catalog keeps only its SHA-256 (``api_tokens``, serve migration 400). Once any row exists
there, every route but ``/healthz``, ``/login`` and ``/static`` needs ``Authorization: Bearer
<token>`` or the login form's HttpOnly cookie; missing, wrong, revoked and expired tokens get 401.
A plain hash suffices (not a slow KDF): the token is random, not a password. The token is never
logged: it travels in a header, a form body or a cookie, never in a URL.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import re
import secrets
from typing import TYPE_CHECKING

from attnbase.errors import AuthError

if TYPE_CHECKING:
    from attnbase.warehouse import Database

PREFIX = "ab_"
_NAME = re.compile(r"^[A-Za-z0-9_.@-]{1,64}$")
#: Routes open without a token.
OPEN_PATHS = ("/healthz", "/login", "/static/")


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _now() -> _dt.datetime:
    return _dt.datetime.now(_dt.timezone.utc).replace(tzinfo=None)


def _require(db: Database) -> None:
    if not db.exists():
        raise AuthError(str(db.catalog.missing()))


def create_token(db: Database, name: str, expires_days: int | None = None,
                 expires_hours: int | None = None) -> str:
    """Create token ``name``, expiring after ``expires_days`` or ``expires_hours`` (one of
    them, or neither: never); return the token (shown once: only its hash is stored)."""
    if not _NAME.match(name):
        raise AuthError(f"token name {name!r} is not valid; use 1-64 letters, digits, _ . @ -")
    if expires_days is not None and expires_hours is not None:
        raise AuthError("give --expires-days or --expires-hours, not both")
    for flag, value in (("--expires-days", expires_days), ("--expires-hours", expires_hours)):
        if value is not None and value <= 0:
            raise AuthError(f"{flag} {value} must be a positive number")
    _require(db)
    token = PREFIX + secrets.token_urlsafe(32)
    now = _now()
    expires = (now + _dt.timedelta(days=expires_days) if expires_days else
               now + _dt.timedelta(hours=expires_hours) if expires_hours else None)
    with db.transaction() as con:
        if con.execute("SELECT 1 FROM api_tokens WHERE name = ?", [name]).fetchone():
            raise AuthError(f"a token named {name!r} exists already (see `attnbase token list "
                            f"--db {db.name}`); choose another --name")
        con.execute("INSERT INTO api_tokens VALUES (?, ?, ?, ?, NULL)",
                    [name, hash_token(token), now, expires])
    return token


def list_tokens(db: Database) -> list[dict]:
    """Every token's name, dates and state (never its hash)."""
    _require(db)
    with db.connect(read_only=True) as con:
        cur = con.execute("SELECT name, created_at, expires_at, revoked_at FROM api_tokens "
                          "ORDER BY created_at, name")
        cols = [d[0] for d in cur.description]
        rows = [dict(zip(cols, r)) for r in cur.fetchall()]
    now = _now()
    for r in rows:
        r["state"] = ("revoked" if r["revoked_at"] else
                      "expired" if r["expires_at"] and r["expires_at"] <= now else "active")
    return rows


def _named(con, db: Database, name: str):
    row = con.execute("SELECT revoked_at FROM api_tokens WHERE name = ?", [name]).fetchone()
    if row is None:
        known = [n for (n,) in con.execute("SELECT name FROM api_tokens ORDER BY name").fetchall()]
        raise AuthError(f"no token named {name!r} (tokens: {', '.join(known) or 'none'}); "
                        f"see `attnbase token list --db {db.name}`")
    return row


def _active(con) -> int:
    return con.execute("SELECT count(*) FROM api_tokens WHERE revoked_at IS NULL AND "
                       "(expires_at IS NULL OR expires_at > ?)", [_now()]).fetchone()[0]


def revoke_token(db: Database, name: str) -> int:
    """Revoke token ``name``; return how many active tokens remain (0: the service now
    answers 401 to everyone until a token is created or every token is deleted)."""
    _require(db)
    with db.transaction() as con:
        row = _named(con, db, name)
        if row[0] is None:
            con.execute("UPDATE api_tokens SET revoked_at = ? WHERE name = ?", [_now(), name])
        return _active(con)


def delete_token(db: Database, name: str) -> int:
    """Delete token ``name``'s row; return how many rows remain (0: the service is open again
    on loopback, as before the first token)."""
    _require(db)
    with db.transaction() as con:
        _named(con, db, name)
        con.execute("DELETE FROM api_tokens WHERE name = ?", [name])
        return con.execute("SELECT count(*) FROM api_tokens").fetchone()[0]


class TokenCheck:
    """The server's view of ``api_tokens``, re-read whenever the catalog's state changes (a
    token created or revoked by another process is seen at the next request)."""

    def __init__(self, catalog) -> None:
        self.catalog = catalog
        self._state: str | None = None
        self._by_hash: dict[str, dict] = {}

    def _load(self, at: str | None = None) -> dict[str, dict]:
        if at is not None and at == self._state:  # loaded at that state: no snapshot call
            return self._by_hash
        state = self.catalog.etag_state()
        if state != self._state:
            rows = self.catalog.query(
                "SELECT name, token_sha256, expires_at, revoked_at FROM api_tokens").table
            self._by_hash = {r["token_sha256"]: r for r in rows.to_pylist()}
            self._state = state
        return self._by_hash

    def loaded_at(self, state: str) -> bool:
        """Whether the tokens of catalog state ``state`` are loaded (then :meth:`required` and
        :meth:`problem` answer from memory, without a query)."""
        return self._state == state

    def required(self, at: str | None = None) -> bool:
        """Whether any token exists (then every route but the open ones needs one); ``at``: a
        catalog state the tokens may be loaded at already (:meth:`loaded_at`)."""
        return bool(self._load(at))

    def problem(self, token: str | None, at: str | None = None) -> str | None:
        """None for a valid token, else why not (one phrase, without the token)."""
        if not token:
            return "missing API token"
        row = self._load(at).get(hash_token(token))
        if row is None or not secrets.compare_digest(row["token_sha256"], hash_token(token)):
            return "wrong API token"
        if row["revoked_at"] is not None:
            return f"API token {row['name']!r} was revoked"
        if row["expires_at"] is not None and row["expires_at"] <= _now():
            return f"API token {row['name']!r} expired at {row['expires_at']:%Y-%m-%d %H:%M} UTC"
        return None


def bearer(headers, cookies, cookie_name: str) -> str | None:
    """The request's token: ``Authorization: Bearer``, else the login cookie."""
    auth = headers.get("authorization", "")
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip() or None
    return cookies.get(cookie_name) or None
