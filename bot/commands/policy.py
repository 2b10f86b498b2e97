"""/policy: the safety policy overlay, and /policy revoke RULE for admins.

The guardian hands over the overlay as data (`OverlayView`); the chat text is
written here, and `steward policy show` prints the same text.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bot.router import CommandContext, CommandRouter, Filter, admin_only, requires
from core.policy import OverlayView

if TYPE_CHECKING:
    from bot.dispatcher import Dispatcher

Ctx = CommandContext["Dispatcher"]

_OVERLAY: Filter[Dispatcher] = requires(
    lambda d: d.policy is not None, "The policy overlay is not available here."
)


def describe(view: OverlayView) -> str:
    """The active overlay in a few chat-sized lines."""
    if view.error is not None:
        return f"Policy error: {view.error}\nEvery tool call is refused until this is fixed."
    doc = view.doc
    if doc is None or doc.is_empty():
        return "No overlay: the built-in policy applies (config/policy.toml)."
    lines = [f"Policy overlay: {view.path}"]

    def listed(label: str, items: list[str]) -> None:
        if items:
            lines.append(f"{label}: {', '.join(items)}")

    listed("Allowed commands added", doc.allow)
    listed("Workspace writers added", doc.workspace_writers)
    listed("Approval added", [f"{k} ({v})" for k, v in doc.approval.items()])
    listed("Forbidden added", [f"{k} ({v})" for k, v in doc.forbid.items()])
    listed("Credentials added", [f"{c.shown} ({c.what})" for c in doc.credentials])
    listed("Protected folders added", doc.protected_dirs)
    listed("Risky variables added", doc.risky_env_vars)
    listed("Secrets files added", doc.env_files)
    for programs, spec in doc.subcommands.items():
        parts = [*(f"allow {a}" for a in spec.allow)]
        parts += [f"approval {k}" for k in spec.approval]
        parts += [f"forbid {k}" for k in spec.forbid]
        listed(f"Subcommands of {programs}", parts)
    for programs, risks in doc.options.items():
        parts = [*(f"runs {k}" for k in risks.runs)]
        parts += [f"writes {k}" for k in risks.writes]
        parts += [f"settings {k}" for k in risks.configs]
        listed(f"Options of {programs}", parts)
    if doc.max_delete_files is not None:
        lines.append(f"max_delete_files: {view.max_delete_files}")
    if doc.always_allow:
        lines.append("Always-allow rules:")
        for r in doc.always_allow:
            by = f" by {r.added_by}" if r.added_by else ""
            at = f" {r.added_at[:10]}" if r.added_at else ""
            what = f"any URL on {r.host}" if r.host is not None else f"`{_short(r.match, 60)}`"
            lines.append(f"  {r.id}  {r.tool} {what}{by}{at}")
            if r.reads:
                files = ", ".join(f"{_short(path, 60)} ({_state(s)})" for path, s in r.reads)
                lines.append(f"    while these files are unchanged: {files}")
        lines.append("Revoke one with /policy revoke RULE_ID.")
    for note in view.notes:
        lines.append(f"Note: {note}")
    return "\n".join(lines)


async def show(ctx: Ctx) -> str:
    assert ctx.services.policy is not None  # the filter
    return describe(ctx.services.policy.overlay_view())


async def revoke(ctx: Ctx) -> str:
    assert ctx.services.policy is not None  # the filter
    rule = ctx.arg
    if not rule:
        return "Usage: /policy revoke RULE_ID"
    if ctx.services.policy.revoke(rule):
        return f"Revoked {rule}."
    return f"No rule {rule} in the overlay."


def register(router: CommandRouter[Dispatcher]) -> None:
    router.command(
        "policy",
        show,
        help="the safety policy overlay; /policy revoke RULE — drop an always-allow rule (admins)",
        filters=[_OVERLAY],
    )
    router.command(
        "policy revoke",
        revoke,
        filters=[_OVERLAY, admin_only("Only an admin can change the policy.")],
    )


def _state(state: str) -> str:
    """A file's state as a rule names it, short: `sha256:1a2b3c4d5e6f…` or `missing`."""
    return state[: len("sha256:") + 12] + "…" if state.startswith("sha256:") else state


def _short(text: str, limit: int) -> str:
    """One line of at most `limit` characters, so a long command keeps the list readable."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
