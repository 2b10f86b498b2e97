"""Who may talk to Steward: per-platform allowlists in every platform's id form,
spaces, admins, pairing codes that survive a restart, owner channels."""

from __future__ import annotations

from pathlib import Path

import pytest

from config.settings import load_settings
from core.access import Access, Rules
from core.clock import SimClock

# One realistic identity per platform: (platform, user id, space id or None).
IDENTITIES = [
    ("slack", "U0123ABCDEF", "T0123ABCD"),
    ("discord", "123456789012345678", "876543210987654321"),
    ("telegram", "123456789", None),
    ("line", "U4af4980629a0b8c2d1e3f4a5b6c7d8e9", "C1234567890abcdef1234567890abcdef"),
    ("whatsapp", "15551234567", None),
    ("googlechat", "users/112233445566778899", "spaces/AAAAbbbbCCC"),
    ("mattermost", "8x4k1a9pbjf3dq6z5y2w7c0e1m", "team8x4k1a9pbjf3dq6z5y2w7c"),
]


def make(tmp_path: Path, env: dict[str, str], clock: SimClock | None = None) -> Access:
    s = load_settings(env={"STEWARD_DATA_DIR": str(tmp_path / "d"), **env}, cwd=tmp_path)
    (tmp_path / "d").mkdir(exist_ok=True)
    return Access.from_settings(s, data_dir=tmp_path / "d", clock=clock or SimClock(0.0))


@pytest.mark.parametrize(("platform", "user", "space"), IDENTITIES)
def test_each_platform_identity_form(
    tmp_path: Path, platform: str, user: str, space: str | None
) -> None:
    key = f"STEWARD_{platform.upper()}_ALLOWED_USERS"
    closed = make(tmp_path, {})
    assert not closed.check(platform, user, space).allowed  # closed by default
    listed = make(tmp_path, {key: f"someone-else, {user}"})
    assert listed.check(platform, user, space).allowed
    assert not listed.check(platform, user + "0", space).allowed
    if space is not None:
        by_space = make(tmp_path, {key: f"space:{space}"})
        assert by_space.check(platform, "anyone-in-that-space", space).allowed
        assert not by_space.check(platform, "anyone", "other-space").allowed
    everyone = make(tmp_path, {key: "*"})
    assert everyone.check(platform, "whoever", None).allowed
    # a rule for one platform never opens another
    other = next(p for p, _, _ in IDENTITIES if p != platform)
    assert not listed.check(other, user, space).allowed


def test_owner_channels_need_no_rules(tmp_path: Path) -> None:
    access = make(tmp_path, {})
    assert access.check("terminal", "owner").allowed and access.check("web", "owner").allowed
    assert access.is_admin("terminal", "owner")


def test_admins_are_allowed_and_can_pair(tmp_path: Path) -> None:
    clock = SimClock(0.0)
    access = make(tmp_path, {"STEWARD_SLACK_ADMINS": "UADMIN"}, clock)
    refusal = access.check("slack", "USTRANGER")
    assert not refusal.allowed and "/pair " in refusal.reply
    code = refusal.reply.split("/pair ")[1][:6]
    assert access.check("slack", "USTRANGER").reply == refusal.reply  # same code, not a new one
    assert access.pair("slack", "USTRANGER", code) == "Only an admin can pair people."
    assert access.pair("slack", "UADMIN", code).startswith("Paired: USTRANGER")
    assert access.check("slack", "USTRANGER").allowed
    assert "No valid pairing code" in access.pair("slack", "UADMIN", code)  # one-time
    # a restart keeps the pairing
    again = make(tmp_path, {"STEWARD_SLACK_ADMINS": "UADMIN"}, clock)
    assert again.check("slack", "USTRANGER").allowed


def test_pairing_codes_expire(tmp_path: Path) -> None:
    clock = SimClock(0.0)
    access = make(
        tmp_path, {"STEWARD_DISCORD_ADMINS": "1", "STEWARD_PAIRING_CODE_TTL": "60"}, clock
    )
    code = access.check("discord", "2").reply.split("/pair ")[1][:6]
    clock._now = 61.0
    assert "No valid pairing code" in access.pair("discord", "1", code)
    assert not access.check("discord", "2").allowed


def test_pairing_off_gives_a_plain_refusal(tmp_path: Path) -> None:
    access = make(tmp_path, {"STEWARD_PAIRING": "false"})
    verdict = access.check("telegram", "42")
    assert not verdict.allowed and "/pair" not in verdict.reply and "allowlist" in verdict.reply


def test_corrupt_access_file_pairs_nobody(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "access.json").write_text("{not json")
    access = Access({"slack": Rules()}, data_dir=tmp_path / "d", clock=SimClock(0.0))
    assert not access.check("slack", "U1").allowed
    assert (tmp_path / "d" / "access.json").read_text() == "{not json"  # kept for a person
