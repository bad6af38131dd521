"""API tokens: random, shown once, stored as SHA-256 hashes.

A token has 256 bits of entropy, so a plain fast hash is enough; a slow password hash
would only slow every request down.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from typing import Literal

import asyncpg

Role = Literal["user", "admin"]


@dataclass(frozen=True, slots=True)
class Principal:
    user: str
    role: Role

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"


def _hash(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


async def create(pool: asyncpg.Pool, user: str, role: Role) -> str:
    token = "gst_" + secrets.token_urlsafe(32)
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("INSERT INTO users (name) VALUES ($1) ON CONFLICT DO NOTHING", user)
        await conn.execute(
            "INSERT INTO tokens (token_hash, user_name, role) VALUES ($1, $2, $3)",
            _hash(token),
            user,
            role,
        )
    return token


async def lookup(pool: asyncpg.Pool, token: str) -> Principal | None:
    row = await pool.fetchrow(
        "SELECT user_name, role FROM tokens WHERE token_hash = $1 AND revoked_at IS NULL",
        _hash(token),
    )
    return Principal(row["user_name"], row["role"]) if row else None
