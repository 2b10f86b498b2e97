"""Fixtures for the cluster's real services: NATS (JetStream) and PostgreSQL on 127.0.0.1.

tests/conftest.py loads this module as a plugin (`pytest_plugins`): a test just names the
fixture as an argument (`postgres_url`, `nats_url`, `cluster_prefix`). Three rules:

- A service whose port is closed skips the test with a message naming the service and how
  to start it, except when `STEWARD_REQUIRE_SERVICES=1` (CI sets it): then it fails, so a
  CI machine without its services cannot pass by skipping every cluster test.
- A port that is open but whose service is unusable (JetStream off, authentication
  refused) always fails: that is a broken setup, not a missing one.
- Every test gets its own PostgreSQL database (`steward_test_<random>`, dropped after)
  and its own NATS name prefix (`cluster_prefix`: streams, consumers and buckets whose
  names contain it are deleted after), so tests run in parallel without seeing each other.

`STEWARD_TEST_DATABASE_URL` (an administrative URL, default
`postgresql://postgres@127.0.0.1:5432/postgres`) and `STEWARD_TEST_CLUSTER_URL` (default
`nats://127.0.0.1:4222`) point the fixtures at other servers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import threading
import uuid
from collections.abc import Awaitable, Callable, Iterator
from functools import lru_cache
from typing import NoReturn, TypeVar
from urllib.parse import urlsplit, urlunsplit

import pytest

REQUIRE_ENV = "STEWARD_REQUIRE_SERVICES"
DEFAULT_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
DEFAULT_NATS_URL = "nats://127.0.0.1:4222"

T = TypeVar("T")


def services_required() -> bool:
    return os.environ.get(REQUIRE_ENV, "") not in ("", "0")


def _missing(message: str) -> NoReturn:
    """A closed port: skip on a developer's machine, fail where services are required."""
    if services_required():
        pytest.fail(f"{message} ({REQUIRE_ENV}=1: the cluster tests must not skip here)")
    pytest.skip(message)


def _host_port(url: str, default_port: int) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or default_port


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=2.0):
            return True
    except OSError:
        return False


# ---- PostgreSQL ------------------------------------------------------------------------


def postgres_admin_url() -> str:
    """The URL of a database the fixtures connect to in order to CREATE/DROP test databases."""
    return os.environ.get("STEWARD_TEST_DATABASE_URL", DEFAULT_ADMIN_URL)


def with_database(url: str, name: str) -> str:
    """`url` with its database (path) replaced by `name`."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))


@lru_cache(maxsize=1)
def _check_postgres() -> str:
    """Checked once per test process: '' when usable, else the reason it is not."""
    admin = postgres_admin_url()
    host, port = _host_port(admin, 5432)
    if not _port_open(host, port):
        return (
            f"closed:PostgreSQL not running on {host}:{port}: start it "
            "(or set STEWARD_TEST_DATABASE_URL)"
        )
    import psycopg

    try:
        with psycopg.connect(admin, connect_timeout=5, autocommit=True) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        return f"broken:PostgreSQL on {host}:{port} refused the test connection {admin!r}: {exc}"
    return ""


def require_postgres() -> str:
    """The admin URL after checking the server; skips or fails the test as the rules say."""
    problem = _check_postgres()
    if problem.startswith("closed:"):
        _missing(problem.removeprefix("closed:"))
    if problem:
        pytest.fail(problem.removeprefix("broken:"))
    return postgres_admin_url()


@contextlib.contextmanager
def new_database(prefix: str = "steward_test", admin: str = "") -> Iterator[str]:
    """A fresh, empty database for the duration of the block; its URL. Dropped after,
    with any sessions still connected (a killed subprocess's) cut off. `admin`: the
    server's admin URL (a bench's); default the tests' own, checked first."""
    import psycopg

    admin = admin or require_postgres()
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield with_database(admin, name)
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """The URL of this test's own, empty PostgreSQL database."""
    with new_database() as url:
        yield url


# ---- NATS ------------------------------------------------------------------------------


def nats_server_url() -> str:
    return os.environ.get("STEWARD_TEST_CLUSTER_URL", DEFAULT_NATS_URL)


def _nats_info(host: str, port: int) -> dict[str, object]:
    """The server's INFO line: NATS sends it first on every connection."""
    with socket.create_connection((host, port), timeout=3.0) as sock:
        sock.settimeout(3.0)
        data = b""
        while b"\r\n" not in data:
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
    line = data.split(b"\r\n", 1)[0].decode("utf-8", "replace")
    if not line.startswith("INFO "):
        raise ValueError(f"not a NATS server (first line {line[:60]!r})")
    info: dict[str, object] = json.loads(line[5:])
    return info


@lru_cache(maxsize=1)
def _check_nats() -> str:
    url = nats_server_url()
    host, port = _host_port(url, 4222)
    if not _port_open(host, port):
        return (
            f"closed:NATS not running on {host}:{port}: start `nats-server -js` "
            "(or set STEWARD_TEST_CLUSTER_URL)"
        )
    try:
        info = _nats_info(host, port)
    except (OSError, ValueError) as exc:
        return f"broken:port {host}:{port} is open but does not answer as NATS: {exc}"
    if not info.get("jetstream"):
        return f"broken:NATS on {host}:{port} runs without JetStream: restart it with `-js`"
    if info.get("auth_required") and not urlsplit(url).username:
        return (
            f"broken:NATS on {host}:{port} requires authentication: put the credentials "
            "in STEWARD_TEST_CLUSTER_URL"
        )
    return ""


def require_nats() -> str:
    problem = _check_nats()
    if problem.startswith("closed:"):
        _missing(problem.removeprefix("closed:"))
    if problem:
        pytest.fail(problem.removeprefix("broken:"))
    return nats_server_url()


@pytest.fixture
def nats_url() -> str:
    """The URL of the NATS server (JetStream checked on)."""
    return require_nats()


def _run_in_thread(make: Callable[[], Awaitable[T]]) -> T:
    """Run a coroutine to completion on a private loop (safe inside or outside a running loop)."""
    box: dict[str, T] = {}
    errors: list[BaseException] = []

    def target() -> None:
        async def main() -> T:
            return await make()

        try:
            box["value"] = asyncio.run(main())
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=target, name="services-cleanup")
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return box["value"]


async def _delete_nats_names(url: str, prefix: str) -> list[str]:
    """Delete every stream (KV buckets are streams `KV_<bucket>`) whose name contains prefix."""
    import nats

    deleted: list[str] = []
    nc = await nats.connect(url, connect_timeout=3, max_reconnect_attempts=0)
    try:
        js = nc.jetstream()
        for stream in await js.streams_info():
            name = stream.config.name or ""
            if prefix.lower() in name.lower():
                await js.delete_stream(name)
                deleted.append(name)
    finally:
        await nc.close()
    return deleted


@pytest.fixture
def cluster_prefix() -> Iterator[str]:
    """A name prefix unique to this test, for the transport's streams, consumers and
    buckets (letters and digits only: valid in stream, subject and bucket names)."""
    prefix = "t" + uuid.uuid4().hex[:10]
    yield prefix
    if not _check_nats():
        _run_in_thread(lambda: _delete_nats_names(nats_server_url(), prefix))
