"""Who may talk to Steward: closed by default, per platform, with pairing codes.

Why here and not in adapters: every platform must refuse strangers the same way,
before anything of theirs reaches the model, and an admin must be able to let a
person in from any chat (`/pair CODE`). Paired people are stored in the data dir
so a restart does not lock them out again.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from config import platforms
from core.clock import Clock
from memory.atomic import atomic_write_text

log = structlog.get_logger("steward.access")

#: Channels that belong to the person running Steward: the terminal and the local
#: web chat (bound to 127.0.0.1 unless configured otherwise).
OWNER_CHANNELS = frozenset({"terminal", "web"})
PLATFORMS = platforms.NAMES
EVERYONE = "*"


@dataclass(slots=True)
class Rules:
    """One platform's access rules: ids, `space:<id>` entries, or `*`."""

    allowed: set[str] = field(default_factory=set)
    admins: set[str] = field(default_factory=set)
    open: bool = False  # True: no rules set (replay before an `access` line)


@dataclass(frozen=True, slots=True)
class AccessVerdict:
    """Whether a person may use Steward here, and what a stranger is told."""

    allowed: bool
    reply: str = ""  # what the stranger is told (empty when allowed)


class Access:
    def __init__(
        self,
        rules: dict[str, Rules],
        *,
        data_dir: Path,
        clock: Clock,
        pairing: bool = True,
        code_ttl: float = 3600.0,
    ) -> None:
        self.rules = rules
        self.clock = clock
        self.pairing = pairing
        self.code_ttl = code_ttl
        self.path = data_dir / "access.json"
        self.paired: dict[str, set[str]] = {}
        #: code -> (platform, user, expires_at)
        self.codes: dict[str, tuple[str, str, float]] = {}
        self._broken = False  # an unreadable file is never overwritten
        self._load()

    @classmethod
    def from_settings(cls, settings: Any, *, data_dir: Path, clock: Clock) -> Access:
        return cls(
            rules_from_settings(settings),
            data_dir=data_dir,
            clock=clock,
            pairing=settings.pairing,
            code_ttl=settings.pairing_code_ttl,
        )

    def _load(self) -> None:
        if not self.path.is_file():
            return
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            self.paired = {p: set(users) for p, users in data.get("paired", {}).items()}
            self.codes = {c: (v[0], v[1], float(v[2])) for c, v in data.get("codes", {}).items()}
        except (OSError, ValueError, TypeError, IndexError) as exc:
            # Fail closed: a broken file pairs nobody, and it is kept for a person to fix.
            log.error("access.file_unreadable", path=str(self.path), error=str(exc))
            self._broken = True

    def _save(self) -> None:
        if self._broken:
            log.warning("access.not_saved", path=str(self.path), why="file unreadable; fix it")
            return
        data = {
            "paired": {p: sorted(u) for p, u in self.paired.items()},
            "codes": {c: list(v) for c, v in self.codes.items()},
        }
        atomic_write_text(self.path, json.dumps(data, indent=2, sort_keys=True))

    def _rules(self, platform: str) -> Rules:
        return self.rules.setdefault(platform, Rules())

    def is_owner_channel(self, platform: str) -> bool:
        return platform in OWNER_CHANNELS

    def is_admin(self, platform: str, user: str) -> bool:
        if self.is_owner_channel(platform):
            return True
        rules = self._rules(platform)
        return rules.open or user in rules.admins or EVERYONE in rules.admins

    def named_admin(self, platform: str, user: str) -> bool:
        """An admin listed by id (not everyone, not an open platform), or the owner's
        terminal and web chat: whom a notice for admins may be sent to directly."""
        if self.is_owner_channel(platform):
            return True
        return user in self._rules(platform).admins

    def allows(self, platform: str, user: str, space: str | None = None) -> bool:
        if self.is_owner_channel(platform):
            return True
        rules = self._rules(platform)
        if rules.open or EVERYONE in rules.allowed:
            return True
        if user in rules.allowed or user in rules.admins:
            return True
        if space and f"space:{space}" in rules.allowed:
            return True
        return user in self.paired.get(platform, set())

    def check(self, platform: str, user: str, space: str | None = None) -> AccessVerdict:
        """Allowed, or the short text the stranger gets (a refusal or a pairing code)."""
        if self.allows(platform, user, space):
            return AccessVerdict(True)
        log.info("access.refused", platform=platform, user=user)
        if not self.pairing:
            return AccessVerdict(
                False, "Sorry, I only work for people on this deployment's allowlist."
            )
        code = self._code_for(platform, user)
        return AccessVerdict(
            False,
            f"I don't know you yet. Ask an admin to send `/pair {code}` to me; "
            f"the code is valid for {self.code_ttl / 60:.0f} minutes.",
        )

    def _code_for(self, platform: str, user: str) -> str:
        now = self.clock.now()
        self.codes = {c: v for c, v in self.codes.items() if v[2] > now}
        for code, (p, u, _) in self.codes.items():
            if p == platform and u == user:
                return code
        code = f"{secrets.randbelow(10**6):06d}"
        while code in self.codes:
            code = f"{secrets.randbelow(10**6):06d}"
        self.codes[code] = (platform, user, now + self.code_ttl)
        self._save()
        return code

    def pair(self, platform: str, admin: str, code: str) -> str:
        """An admin confirms a code; returns the line to answer with."""
        if not self.is_admin(platform, admin):
            return "Only an admin can pair people."
        entry = self.codes.get(code.strip())
        if entry is None or entry[2] <= self.clock.now():
            return f"No valid pairing code {code.strip()!r} (codes expire; ask for a new one)."
        target_platform, user, _ = entry
        del self.codes[code.strip()]
        self.paired.setdefault(target_platform, set()).add(user)
        self._save()
        log.info("access.paired", platform=target_platform, user=user, by=admin)
        return f"Paired: {user} on {target_platform} may now talk to me."


def rules_from_settings(settings: Any) -> dict[str, Rules]:
    """Build per-platform rules from `<platform>_allowed_users` / `<platform>_admins`."""
    rules: dict[str, Rules] = {}
    for platform in PLATFORMS:
        ids = settings.ids
        rules[platform] = Rules(
            allowed=set(ids(f"{platform}_allowed_users")),
            admins=set(ids(f"{platform}_admins")),
        )
    return rules
