"""The web chat's login token: one random secret per data dir, kept in a file.

Why here: adapters store nothing themselves. The web chat's login
(`adapters/web_login.py`) only checks credentials against a token it is given;
`bot/` reads or makes the token with these functions (`steward run`, `steward
login`, `steward doctor`).

The token lives in ``<data dir>/secrets/web-token`` (folder 0700, file 0600; the
data dir's git repository ignores ``secrets/``). Deleting the file, or `steward
login --new`, makes a new one: every browser logged in with the old one is logged
out. A file that exists but holds no token is an error the person fixes, never a
silent new login.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
from pathlib import Path

import structlog

from memory.atomic import atomic_write_text

log = structlog.get_logger("steward.memory.login_token")

SECRETS_DIR = "secrets"
TOKEN_FILE = "web-token"
#: What a token file must hold: the URL-safe alphabet, at least 128 bits' worth.
TOKEN_RE = re.compile(r"[A-Za-z0-9_-]{22,128}")


class TokenError(ValueError):
    """The token file exists but cannot be used; the message says what to do."""


def token_path(data_dir: Path) -> Path:
    """Where the data dir's token is kept (whether or not it exists yet)."""
    return Path(data_dir) / SECRETS_DIR / TOKEN_FILE


def read_token(data_dir: Path) -> str | None:
    """The data dir's token, or None when there is none yet."""
    path = token_path(data_dir)
    try:
        token = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise TokenError(
            f"Cannot read the web chat login token {path}: {exc}. Fix its permissions, or "
            "delete it and Steward makes a new one."
        ) from exc
    if not TOKEN_RE.fullmatch(token):
        raise TokenError(
            f"The web chat login token {path} is not a token (22-128 letters, digits, '_' "
            "or '-'). Delete it and Steward makes a new one."
        )
    return token


def new_token(data_dir: Path) -> str:
    """Write a fresh token (replacing any), readable by this user only."""
    path = token_path(data_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(OSError):  # not ours to fix when the folder belongs to root
        os.chmod(path.parent, 0o700)
    token = secrets.token_urlsafe(32)
    atomic_write_text(path, token + "\n")
    os.chmod(path, 0o600)  # the temp file was 0600, unless an old file's mode was copied
    log.info("web.login_token_created", path=str(path))
    return token


def load_or_create_token(data_dir: Path) -> str:
    """The token of this data dir, created on first start; loose permissions are tightened."""
    token = read_token(data_dir)
    if token is None:
        return new_token(data_dir)
    path = token_path(data_dir)
    with contextlib.suppress(OSError):
        if path.stat().st_mode & 0o077:
            os.chmod(path, 0o600)
            log.warning("web.login_token_permissions_fixed", path=str(path))
    return token
