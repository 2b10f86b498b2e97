"""The `Guardian`: the policy loaded and cached, tool calls judged, the overlay edited.

The policy (config/policy.toml merged with the deployment's overlay) is re-read only
when a file changed; a policy that cannot be loaded refuses every call. The overlay's
always-allow rules are written and revoked here, and handed as data to /policy and
`steward policy show`.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import stat
import threading
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

import structlog

from core.egress import EgressPolicy, parse_url
from core.git_control import is_control_path
from core.guardian.analysis import _Analysis
from core.guardian.decision import CallDecision, Verdict
from core.guardian.judges import builtin_judges
from core.guardian.knowledge import INTERPRETER_ALIASES, INTERPRETERS, SHELLS, WRAPPERS
from core.guardian.programs import _HANDLERS
from core.guardian.shell_text import _norm, _Scope, _short, _Unparseable, _Word
from core.policy import (
    DIGEST_PREFIX,
    MISSING,
    AlwaysAllowRule,
    OverlayView,
    Policy,
    PolicyError,
    builtin_path,
    merge,
    overlay_text_with_rule,
    overlay_text_without_rule,
    read_document,
    rule_id,
    rule_match,
)
from memory.atomic import atomic_write_text
from memory.effects import Effects

# ════════════════════════════════════════════════════════════════════════════════
# The guardian.
# ════════════════════════════════════════════════════════════════════════════════

FILE_TOOLS = frozenset({"read_file", "write_file", "edit_file", "list_files", "search_files"})
#: Tools judged by the URL they reach (`check_fetch`): a page the browser opens is a fetch.
URL_TOOLS = frozenset({"web_fetch", "browser_open"})

#: Names the engine judges by their arguments: an overlay [allow] entry cannot change them.
ENGINE_COMMANDS = frozenset({*_HANDLERS, *INTERPRETERS, *INTERPRETER_ALIASES, *WRAPPERS, *SHELLS})

_UNLOADED = object()

log = structlog.get_logger("steward.policy")

#: A file an always-allow rule names is hashed on every matching call: larger ones cannot
#: be named (the "Always allow" press says so; approve once instead).
MAX_PINNED_BYTES = 64 * 1024 * 1024
#: A read noted as written (`$OUT`, `*.txt`): not one file that can be named.
_UNKNOWN_PATH_CHARS = frozenset("$`*?[")


class Judge(Protocol):
    """Decides the calls of a family of tools the guardian has no rules of its own for.

    `decide` runs in the guardian's worker thread under its timeout, with the merged
    policy; it must not block on I/O. An exception there is a refusal."""

    def claims(self, tool: str) -> bool: ...

    def decide(self, policy: Policy, tool: str, args: dict[str, Any]) -> CallDecision: ...


class _Unpinnable(Exception):
    """A file a rule would name cannot be hashed (unreadable, too large)."""


def _file_state(path: str) -> str | None:
    """What a rule keeps of one file: "sha256:…" of its content, "missing" when there is
    nothing there, None when it is not a regular file (a folder is not named). Raises
    `_Unpinnable` when it cannot be read or is too large to hash on every call.

    Opened without blocking and checked after opening, so a FIFO or device put in a
    file's place is never read."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except (FileNotFoundError, NotADirectoryError):
        return MISSING
    except IsADirectoryError:
        return None
    except OSError as exc:
        raise _Unpinnable(f"cannot be read ({exc.strerror or exc})") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        digest, size = hashlib.sha256(), 0
        while chunk := os.read(fd, 1 << 20):
            size += len(chunk)
            if size > MAX_PINNED_BYTES:
                raise _Unpinnable(
                    f"is larger than {MAX_PINNED_BYTES >> 20} MiB, too large to check on every call"
                )
            digest.update(chunk)
        return DIGEST_PREFIX + digest.hexdigest()
    except OSError as exc:
        raise _Unpinnable(f"cannot be read ({exc.strerror or exc})") from None
    finally:
        os.close(fd)


def _stamp(path: Path | None) -> object:
    """What changes when a file is edited or replaced (atomic writes change the inode)."""
    if path is None:
        return None
    try:
        st = path.stat()
    except FileNotFoundError:
        return "missing"
    except OSError as exc:
        return ("unreadable", str(exc))
    return (st.st_mtime_ns, st.st_size, st.st_ino)


class Guardian:
    """Judges each tool call before it runs; see the module docstring for the rules.

    The policy is config/policy.toml (or `policy_path`) plus the deployment's overlay
    at `overlay_path` (typically `<data dir>/policy.toml`; it need not exist). Both are
    re-read when they change on disk, so a person's edit or a revoked rule applies to
    the next call; if either cannot be loaded every call is refused with the reason.
    """

    def __init__(
        self,
        workspace: Path,
        *,
        timeout: float = 2.0,
        overlay_path: Path | None = None,
        policy_path: Path | None = None,
        data_dir: Path | None = None,
        undoable: Callable[[str], bool] | None = None,
        egress: EgressPolicy | None = None,
        own_paths: Iterable[Path] = (),
    ) -> None:
        self.workspace = Path(workspace)
        #: Steward's checkout, virtual environment and config files (the sandbox hides
        #: them): no tool may write there, and no approval can grant it.
        self.own_paths = frozenset(
            x for p in own_paths for x in (_norm(os.path.abspath(p)), os.path.realpath(p))
        )
        #: Where web_fetch may connect (core/egress): a literal private host is refused
        #: up front unless it lists it. None: the rules with no exceptions.
        self.egress = egress if egress is not None else EgressPolicy()
        #: With workspace snapshots (core/snapshots) and `undoable_deletes` on: whether a
        #: real path's deletion can be undone (covered by the snapshots). Deletions it
        #: covers need no approval. None: every such deletion is asked as before.
        self.undoable = undoable
        self.data_dir = Path(data_dir) if data_dir is not None else None
        self.timeout = timeout
        self.overlay_path = Path(overlay_path) if overlay_path is not None else None
        self.policy_path = Path(policy_path) if policy_path is not None else builtin_path()
        self._lock = threading.RLock()
        self._stamps: object = _UNLOADED
        self._policy: Policy | None = None
        self._error: str | None = None
        self._guarded_paths: frozenset[str] = frozenset()
        #: Judges for tools beyond the built-in ones (MCP tools, the skill tool), each
        #: for the names it `claims`; registered by whoever offers those tools.
        self._judges: list[Judge] = builtin_judges()

    def add_judge(self, judge: Judge) -> None:
        """Decide the calls of tools `judge.claims` (checked after the built-in tools,
        before "unknown tool": a judge cannot take over shell, file or fetch calls)."""
        self._judges.append(judge)

    # ── the policy ──────────────────────────────────────────────────────────────
    def policy(self) -> Policy:
        """The merged policy, reloaded when a file changed; raises PolicyError if unusable."""
        stamps = (_stamp(self.policy_path), _stamp(self.overlay_path))
        with self._lock:
            if stamps != self._stamps:
                self._load()
                self._guarded_paths = self._guarded()
                self._stamps = stamps
            if self._policy is None:
                raise PolicyError(self._error or "the policy is not loaded")
            return self._policy

    def _load(self) -> None:
        try:
            base = read_document(self.policy_path, overlay=False)
            overlay = None
            if self.overlay_path is not None and self.overlay_path.exists():
                overlay = read_document(self.overlay_path, overlay=True)
            self._policy = merge(
                base,
                overlay,
                engine_commands=ENGINE_COMMANDS,
                builtin=self.policy_path,
                overlay_path=self.overlay_path,
            )
            self._error = None
        except PolicyError as exc:
            self._policy, self._error = None, str(exc)

    def _guarded(self) -> frozenset[str]:
        """The policy files as the engine sees paths (lexical and real; refreshed on reload)."""
        out: set[str] = set()
        for path in (self.policy_path, self.overlay_path):
            if path is not None:
                out.add(_norm(os.path.abspath(path)))
                out.add(os.path.realpath(path))
        return frozenset(out)

    # ── checks ──────────────────────────────────────────────────────────────────
    async def check(
        self, tool: str, args: dict[str, Any], *, person_urls: frozenset[str] | None = None
    ) -> CallDecision:
        """The decision for one call. Never raises: an error or a slow check is a refusal.

        `person_urls`: the (normalised, core/egress/urls.py) URLs the person wrote in this
        conversation; a web_fetch of one of them needs no approval. None: no such URLs."""
        extra = {} if person_urls is None else {"person_urls": person_urls}
        try:
            return await asyncio.wait_for(
                asyncio.to_thread(self.check_sync, tool, args, **extra), self.timeout
            )
        except TimeoutError:
            return CallDecision(
                Verdict.FORBID,
                f"guardian error: the check took longer than {self.timeout:g}s; refused to be safe",
            )
        except Exception as exc:
            return CallDecision(
                Verdict.FORBID,
                f"guardian error: {type(exc).__name__}: {exc}; refused to be safe",
            )

    def check_sync(
        self, tool: str, args: dict[str, Any], *, person_urls: frozenset[str] | None = None
    ) -> CallDecision:
        """The classification itself (synchronous; `check` adds the timeout and error floor).

        The built-in verdict is decided first; an always-allow rule can then lift an
        approval to allow, but never a forbid. A shell rule whose files (`reads`) changed
        since it was allowed no longer matches: the call is asked again, and its reason
        says which file changed (logged as `policy.rule_stale`).
        """
        if not isinstance(args, dict):
            return CallDecision(Verdict.FORBID, "tool arguments must be a JSON object")
        try:
            policy = self.policy()
        except PolicyError as exc:
            return CallDecision(
                Verdict.FORBID,
                f"the guardian's policy could not be loaded, so every tool call is refused: {exc}",
            )
        decision = self._classify(policy, tool, args, person_urls=person_urls)
        rules = policy.rules_for(tool, args)
        if not rules:
            return decision
        if decision.verdict == Verdict.FORBID:
            return CallDecision(
                Verdict.FORBID,
                f"{decision.reason} (always-allow rule {rules[0].id} matches, but a forbidden "
                "call is never allowed)",
                effects=decision.effects,
            )
        stale: list[tuple[AlwaysAllowRule, list[str]]] = []
        for rule in rules:
            changed = self._changed_reads(rule)
            if not changed:
                # The person's "always allow" of this call keeps what it needed to work.
                return CallDecision(
                    Verdict.ALLOW,
                    f"allowed by always-allow rule {rule.id}",
                    decision.needs,
                    decision.effects,
                )
            stale.append((rule, changed))
        if decision.verdict == Verdict.ALLOW:
            return decision
        for rule, changed in stale:
            log.info("policy.rule_stale", rule=rule.id, file=changed[0], files=changed)
        rule, changed = stale[0]
        return CallDecision(
            decision.verdict,
            f"{decision.reason} (always-allow rule {rule.id} no longer matches because "
            f"{', '.join(changed)} changed since it was allowed)",
            decision.needs,
            decision.effects,
            decision.undoable,
        )

    def _classify(
        self,
        policy: Policy,
        tool: str,
        args: dict[str, Any],
        *,
        person_urls: frozenset[str] | None = None,
    ) -> CallDecision:
        if tool == "shell":
            return self.check_shell(args.get("command"), policy)
        if tool in FILE_TOOLS:
            return self.check_file_tool(tool, args, policy)
        if tool in URL_TOOLS:
            return self.check_fetch(args.get("url"), policy, person_urls=person_urls, tool=tool)
        for judge in self._judges:
            if judge.claims(tool):
                return judge.decide(policy, tool, args)
        return CallDecision(
            Verdict.FORBID, f"unknown tool `{tool}`: there is no rule that allows it"
        )

    # ── the overlay's always-allow rules ───────────────────────────────────────
    def _pins(self, effects: Effects) -> dict[str, str]:
        """The workspace files a shell command reads or runs (as its effects note them),
        each with its content's hash, or "missing". Files outside the workspace are not
        named: the agent cannot change them without asking. Raises `_Unpinnable`."""
        out: dict[str, str] = {}
        for path in effects.reads:
            if os.path.isabs(path) or path == ".." or path.startswith("../"):
                continue
            full = os.path.join(self.workspace, path)
            if any(c in path for c in _UNKNOWN_PATH_CHARS) and not os.path.lexists(full):
                continue  # only known at run time (`$OUT`), or a pattern
            try:
                state = _file_state(full)
            except _Unpinnable as exc:
                raise _Unpinnable(f"{path} {exc}") from None
            if state is not None:
                out[path] = state
        return out

    def _changed_reads(self, rule: AlwaysAllowRule) -> list[str]:
        """The files a rule names whose content is no longer what it was when allowed."""
        changed = []
        for path, state in rule.reads or ():
            try:
                now = _file_state(os.path.join(self.workspace, path))
            except _Unpinnable:
                now = None
            if now != state:
                changed.append(path)
        return changed

    def pin(self, tool: str, args: dict[str, Any]) -> str | None:
        """What a session approval of this call keeps of the files it reads (one string:
        the same files with the same content give the same one); "" when it reads none,
        None when one cannot be named (then no grant can cover it)."""
        if tool != "shell" or not isinstance(args, dict):
            return ""
        try:
            pins = self._pins(self.check_sync(tool, args).effects)
        except _Unpinnable:
            return None
        return json.dumps(pins, sort_keys=True) if pins else ""

    def always_allow(self, tool: str, args: dict[str, Any], *, added_by: str) -> str:
        """Write a narrow rule allowing exactly this call from now on; returns the rule id.

        Narrow means exact: the same shell command string (or the same path, or URL; for
        web_fetch, the URL's host), not a pattern. A shell rule also names the content
        (sha256) of each workspace file the command reads or runs, so it stops matching
        when one changes. Raises ValueError for a call that is forbidden (never offered
        for forbidden classes), for a tool no rule can name, for a file that cannot be
        named, or when there is no overlay. The same call twice gives the same id and one
        rule; pressed again after a file changed, the rule is written anew (same id).
        """
        if self.overlay_path is None:
            raise ValueError(
                "no policy overlay is configured, so there is nowhere to keep the rule"
            )
        match = rule_match(tool, args) if isinstance(args, dict) else None
        if not match:
            raise ValueError(
                f"`{tool}` calls cannot be always-allowed (no exact argument to match)"
            )
        with self._lock:
            decision = self.check_sync(tool, args)
            if decision.verdict == Verdict.FORBID:
                raise ValueError(f"a forbidden call cannot be always-allowed: {decision.reason}")
            policy = self.policy()
            for existing in policy.rules_for(tool, args):
                if not self._changed_reads(existing):
                    return existing.id
            judged = self._classify(policy, tool, args)  # its own reason, not a rule's
            reads: tuple[tuple[str, str], ...] | None = None
            if tool == "shell":
                try:
                    reads = tuple(self._pins(judged.effects).items()) or None
                except _Unpinnable as exc:
                    raise ValueError(f"{exc}; approve it once instead") from None
            rule = AlwaysAllowRule(
                id=rule_id(tool, match),
                tool=tool,
                match=match,
                added_by=added_by,
                added_at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                reason=judged.reason,
                reads=reads,
            )
            path = self.overlay_path
            text = path.read_text(encoding="utf-8") if path.exists() else ""
            # The same rule written before a file changed: replaced, so its id stays one.
            text = overlay_text_without_rule(text, rule.id, str(path)) or text
            try:
                new_text = overlay_text_with_rule(text, rule, str(path))
            except PolicyError as exc:
                raise ValueError(str(exc)) from None
            atomic_write_text(path, new_text)
            self._stamps = _UNLOADED
            return rule.id

    def revoke(self, rule_id: str) -> bool:
        """Remove an always-allow rule from the overlay; False when there is no such rule."""
        if self.overlay_path is None:
            return False
        with self._lock:
            path = self.overlay_path
            try:
                text = path.read_text(encoding="utf-8")
            except FileNotFoundError:
                return False
            new_text = overlay_text_without_rule(text, rule_id.strip(), str(path))
            if new_text is None:
                return False
            atomic_write_text(path, new_text)
            self._stamps = _UNLOADED
            return True

    def overlay_view(self) -> OverlayView:
        """The active overlay as data, for /policy and `steward policy show` to render."""
        try:
            policy = self.policy()
        except PolicyError as exc:
            return OverlayView(error=str(exc))
        return OverlayView(
            path=self.overlay_path,
            doc=policy.overlay,
            max_delete_files=policy.max_delete_files,
            notes=policy.notes,
        )

    # ── per tool ────────────────────────────────────────────────────────────────
    def _analysis(self, policy: Policy | None) -> _Analysis:
        root = os.path.realpath(self.workspace)
        home = os.path.realpath(os.path.expanduser("~"))
        policy = policy or self.policy()
        analysis = _Analysis(root, home, policy, self._guarded_paths, self._private_paths())
        analysis.undoable = self.undoable
        analysis.own = self.own_paths
        return analysis

    def _private_paths(self) -> frozenset[str]:
        """Steward's data dir as the engine sees paths: the folder of the overlay policy
        (`<data dir>/policy.toml`) unless `data_dir` was given."""
        folder = self.data_dir
        if folder is None and self.overlay_path is not None:
            folder = self.overlay_path.parent
        if folder is None:
            return frozenset()
        return frozenset({_norm(os.path.abspath(folder)), os.path.realpath(folder)})

    def check_shell(self, command: Any, policy: Policy | None = None) -> CallDecision:
        if not isinstance(command, str):
            return CallDecision(Verdict.FORBID, "shell command must be a string")
        analysis = self._analysis(policy)
        try:
            analysis.script(command, _Scope(cwd=analysis.root))
        except _Unparseable as exc:
            return CallDecision(
                Verdict.FORBID,
                f"could not parse this command safely: {exc}; use a simpler form",
            )
        except RecursionError:
            return CallDecision(
                Verdict.FORBID,
                "could not parse this command safely: nested too deeply; use a simpler form",
            )
        return analysis.decision()

    def check_file_tool(
        self, tool: str, args: dict[str, Any], policy: Policy | None = None
    ) -> CallDecision:
        """File tools are workspace-scoped by construction; credential paths are refused, and
        so is changing the guardian's own policy files (if the data dir is in the workspace).
        A write or edit outside the workspace asks, granting exactly that path for that one
        call (the same grant a shell command gets); Steward's data dir, its config and
        credential files stay refused."""
        path = args.get("path", ".")
        if path is None:
            path = "."
        if not isinstance(path, str):
            return CallDecision(Verdict.FORBID, f"{tool}: path must be a string")
        analysis = self._analysis(policy)
        scope = _Scope(cwd=analysis.root)
        where = f"{tool} `{path}`"
        writes = tool in ("write_file", "edit_file")
        analysis.note("writes" if writes else "reads", _Word(path, path), scope)
        analysis.check_credentials(_Word(path, path), scope, where)
        if tool in ("write_file", "edit_file") and analysis.policy_file(analysis.path(path, scope)):
            analysis.flag(
                Verdict.FORBID,
                f"{where} changes the guardian's policy file; the agent may not change its "
                "own rules",
            )
        if tool in ("write_file", "edit_file"):
            target = analysis.path(path, scope)
            real = target.real or os.path.realpath(os.path.join(analysis.root, path))
            if not analysis.inside(target):
                if analysis.reads_private(target.lexical or real, real) or any(
                    real == d for d in analysis.private
                ):
                    analysis.flag(
                        Verdict.FORBID,
                        f"{where} is in Steward's own data dir: not the agent's to change",
                    )
                elif os.path.basename(real) == "steward.toml":
                    analysis.flag(Verdict.FORBID, f"{where} is Steward's configuration")
                elif analysis.is_own(target):
                    analysis.flag(Verdict.FORBID, analysis.own_reason(where))
                else:
                    analysis.flag(
                        Verdict.APPROVAL,
                        f"{where} writes outside the workspace ({real})",
                        (f"write:{real}",),
                    )
            elif is_control_path(target.lexical or real) or is_control_path(real):
                analysis.flag(
                    Verdict.APPROVAL,
                    f"{where} changes one of git's control files, which decide what programs "
                    "a person's own git runs (config, hooks, .gitattributes, .gitmodules, "
                    "gitdir pointers)",
                )
        decision = analysis.decision()
        if decision.verdict == Verdict.ALLOW:
            return CallDecision(
                Verdict.ALLOW, f"{tool} stays inside the workspace", effects=decision.effects
            )
        return decision

    def check_fetch(
        self,
        url: Any,
        policy: Policy | None = None,
        *,
        person_urls: frozenset[str] | None = None,
        tool: str = "web_fetch",
    ) -> CallDecision:
        """A GET of a URL the person wrote in this conversation (`person_urls`, normalised)
        is allowed; any other needs approval naming its host (`needs` holds `host:NAME`, what
        a session or always grant keys on). A host written as a private, loopback or
        metadata address (127.0.0.1, localhost, 2130706433, [::1] ...) or one of Steward's
        own endpoints is refused here; a name that resolves to one is refused when web_fetch
        connects (core/egress), and so is each redirect hop. `tool`: web_fetch, or
        browser_open (a page the browser opens is judged as a fetch of its URL)."""
        if not isinstance(url, str):
            return CallDecision(Verdict.FORBID, f"{tool}: url must be a string")
        effects = Effects(fetches=(url.strip(),))
        try:
            scheme = urlsplit(url.strip()).scheme.lower()
        except ValueError:
            scheme = ""
        if scheme not in ("http", "https"):
            return CallDecision(
                Verdict.FORBID, f"{tool} only fetches http(s) URLs, not `{_short(url)}`"
            )
        for cred in (policy or self.policy()).credentials:
            if cred.regex.search(url):
                return CallDecision(
                    Verdict.FORBID, f"{tool} `{_short(url)}` reads {cred.what}", effects=effects
                )
        try:
            target = parse_url(url)
        except ValueError as exc:
            return CallDecision(Verdict.FORBID, f"{tool}: {exc}", effects=effects)
        refused = self.egress.literal_refusal(target.host, target.port)
        if refused is not None:
            return CallDecision(
                Verdict.FORBID, f"{tool} `{_short(url)}`: {refused}", effects=effects
            )
        if person_urls and target.url in person_urls:
            return CallDecision(
                Verdict.ALLOW,
                f"{tool} of a URL the person gave in this conversation"
                + (" (a read-only GET)" if tool == "web_fetch" else ""),
                effects=effects,
            )
        return CallDecision(
            Verdict.APPROVAL,
            f"{tool} {_short(url)} — {target.host} is not a site you gave in this conversation",
            (f"host:{target.host}",),
            effects=effects,
        )
