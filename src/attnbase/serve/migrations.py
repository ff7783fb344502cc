"""Catalog migrations of the service (versions 400-499; listed in the warehouse's providers).

400: ``api_tokens``, the API tokens of ``attnbase token``: only a SHA-256 of each token is kept.
"""

from __future__ import annotations

from attnbase.warehouse.catalog.migrations import Migration, _sql

_V400 = _sql(
    """
    CREATE TABLE IF NOT EXISTS api_tokens (
        name VARCHAR PRIMARY KEY,
        token_sha256 VARCHAR NOT NULL UNIQUE,
        created_at TIMESTAMP NOT NULL,
        expires_at TIMESTAMP,
        revoked_at TIMESTAMP
    )
    """
)

MIGRATIONS: list[Migration] = [
    Migration(400, "api_tokens: hashed API tokens of attnbase serve", _V400),
]
