"""A database of a bench's own on the PostgreSQL the tests use (127.0.0.1:5432, or
`STEWARD_TEST_DATABASE_URL`): made empty, dropped after with any session still on it.
The tests' `new_database` does the work; this only says "skipped" where no server
answers, so `dev.py bench` runs everywhere."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from tests.services import new_database, postgres_admin_url


def unreachable() -> str:
    """Why the server cannot be used ('' when it can)."""
    import psycopg

    admin = postgres_admin_url()
    try:
        with psycopg.connect(admin, autocommit=True, connect_timeout=5) as conn:
            conn.execute("SELECT 1")
    except psycopg.OperationalError as exc:
        return f"PostgreSQL not reachable at {admin} ({exc})"
    return ""


@contextlib.contextmanager
def bench_database(prefix: str = "steward_bench") -> Iterator[str]:
    """A fresh database's URL for the block."""
    with new_database(prefix, postgres_admin_url()) as url:
        yield url
