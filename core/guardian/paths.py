"""Where a command's words point: the walker's path checks (a part of `_Analysis`).

A word becomes a path (lexical and real, symlinks resolved, globs expanded up to a
cap) and is judged against the workspace, the protected folders, devices, credential
files, the policy files and Steward's own data; `check_write` and `delete_count` are
what the handlers of writing and deleting programs call.
"""

from __future__ import annotations

import glob
import itertools
import os
import re
from typing import TYPE_CHECKING

from core.guardian.decision import Verdict
from core.guardian.knowledge import (
    _GLOB_CHARS,
    BLOCK_DEVICE_RE,
    HARMLESS_DEVICE_RE,
    HARMLESS_DEVICES,
    KERNEL_FILE_RE,
    MAX_GLOB_MATCHES,
)
from core.guardian.shell_text import (
    _count_files,
    _expand_braces,
    _git_runs_it,
    _glob_matches,
    _norm,
    _Path,
    _Scope,
    _under,
    _Word,
)

if TYPE_CHECKING:
    from core.guardian.analysis import _Analysis


class _PathChecks:
    """The paths part of the walker; mixed into `_Analysis`, whose state it reads."""

    # ── paths ───────────────────────────────────────────────────────────────────
    def path(self: _Analysis, text: str, scope: _Scope) -> _Path:
        value = os.path.expanduser(text) if text.startswith("~") else text
        glob = False
        if any(c in _GLOB_CHARS for c in value):
            glob = True
            kept = []
            for piece in value.split("/"):
                if any(c in _GLOB_CHARS for c in piece):
                    break
                kept.append(piece)
            value = "/".join(kept) or ("/" if value.startswith("/") else ".")
        if not value.startswith("/"):
            if scope.cwd is None:
                return _Path(text, None, None, glob)
            value = os.path.join(scope.cwd, value)
        lexical = _norm(value)
        return _Path(text, lexical, os.path.realpath(lexical), glob)

    def inside(self: _Analysis, p: _Path) -> bool:
        return p.real is not None and _under(p.real, self.root)

    def can_undo(self: _Analysis, p: _Path) -> bool:
        """Deleting `p` can be undone: it is in the workspace and the snapshots cover all
        of it (nothing skipped or .gitignore'd under it; for a glob, its folder)."""
        if self.undoable is None or p.real is None or not self.inside(p):
            return False
        try:
            return self.undoable(p.real)
        except Exception:  # fail-closed: it is asked
            return False

    def is_own(self: _Analysis, p: _Path) -> bool:
        """Is `p` Steward's checkout, virtual environment or config, or inside one? No
        approval can open them (the sandbox refuses such a grant too)."""
        return any(
            x is not None and _under(x, own) for x in (p.lexical, p.real) for own in self.own
        )

    @staticmethod
    def own_reason(where: str) -> str:
        return (
            f"{where} is in Steward's own files (its code, virtual environment or "
            "configuration): not the agent's to change, and no approval can open them"
        )

    def is_protected(self: _Analysis, p: _Path) -> bool:
        return any(x is not None and x in self.protected for x in (p.lexical, p.real))

    def is_device(self: _Analysis, p: _Path) -> bool:
        return any(x is not None and BLOCK_DEVICE_RE.match(x) for x in (p.lexical, p.real))

    def check_credentials(self: _Analysis, word: _Word, scope: _Scope, where: str) -> None:
        """Refuse a word naming credentials, also through globs, `..`, symlinks and variables."""
        texts = [word.raw]
        concrete: list[str] = []  # paths to test against the dotenv rule
        if word.value is not None:
            texts.append(word.value)
            value = word.value.partition("=")[2] if word.value.startswith("-") else word.value
            if value:
                p = self.path(value, scope)
                if p.glob:
                    matches = self.expand_glob(value, scope)
                    texts += matches + self.glob_reaches_credentials(value, scope)
                    concrete += matches
                    if p.lexical is not None and any(
                        _under(x, d) for d in self.private for x in (p.lexical, p.real or "")
                    ):
                        concrete.append(os.path.join(p.lexical, "*"))  # what the glob reaches
                elif p.lexical is not None:
                    texts += [x for x in (p.lexical, p.real) if x]
                    concrete.append(p.lexical)
                elif self.policy.is_env_file(os.path.basename(value.rstrip("/"))):
                    self.flag(
                        Verdict.APPROVAL,
                        f"{where} uses `{value}` in a folder only known at run time",
                    )
        if word.value is None:
            # `/proc/$PPID/envi''ron`: judge the shape too, quotes removed
            shape = re.sub(r"[\'\"\\]", "", word.raw)
            texts.append(shape)
            base = os.path.basename(shape.rstrip("/"))
            if "$" not in base and "`" not in base and self.policy.is_env_file(base):
                self.flag(
                    Verdict.APPROVAL,
                    f"{where} uses `{base}` in a folder only known at run time",
                )
            if re.search(r"(?:^|[\s=:])/proc\b", shape):
                self.flag(
                    Verdict.APPROVAL,
                    f"{where} names a /proc path only known at run time (another process's "
                    "files and environment are there)",
                )
        for text in texts:
            for cred in self.policy.credentials:
                if cred.regex.search(text):
                    self.flag(Verdict.FORBID, f"{where} touches credentials ({cred.what})")
                    return
        for path in concrete:
            real = os.path.realpath(path)
            if self.reads_private(path, real):
                self.flag(
                    Verdict.FORBID,
                    f"{where} uses Steward's own data dir ({path}): its approvals, access "
                    "list and memory are not the agent's to read or change",
                )
                return
            names = (os.path.basename(path), os.path.basename(real))
            if any(self.policy.is_env_file(n) for n in names) and not _under(real, self.root):
                self.flag(
                    Verdict.FORBID,
                    f"{where} touches `{path}`, a secrets file outside the workspace",
                )
                return

    def expand_glob(
        self: _Analysis, value: str, scope: _Scope, cap: int = MAX_GLOB_MATCHES
    ) -> list[str]:
        """What a glob matches right now (bash would expand it the same way), capped."""
        pattern = os.path.expanduser(value)
        if not pattern.startswith("/"):
            if scope.cwd is None:
                return []
            pattern = os.path.join(scope.cwd, pattern)
        found: list[str] = []
        for alternative in _expand_braces(pattern):
            found.extend(itertools.islice(glob.iglob(alternative), cap))
            if len(found) >= cap:
                break
        return found[:cap]

    def glob_reaches_credentials(self: _Analysis, value: str, scope: _Scope) -> list[str]:
        """Credential paths a glob could match even if they do not exist on this machine."""
        pattern = os.path.expanduser(value)
        if not pattern.startswith("/"):
            if scope.cwd is None:
                return []
            pattern = os.path.join(scope.cwd, pattern)
        hits = []
        for alternative in _expand_braces(_norm(pattern)):
            for example in self.policy.credential_examples:
                concrete = (
                    example.replace("~", self.home, 1) if example.startswith("~") else example
                )
                if _glob_matches(alternative, concrete):
                    hits.append(concrete)
        return hits

    def holds_credentials(self: _Analysis, p: _Path) -> bool:
        """Is `p` the home folder, a folder above it, /etc, or a folder outside the workspace
        holding Steward's data dir (reading all of it reads secrets)?"""
        real = p.real or p.lexical
        if real is None:
            return False
        if any(_under(d, real) for d in self.private) and not _under(real, self.root):
            return True
        return real in ("/etc", "/root") or _under(self.home, real) or _under("/root", real)

    def reads_private(self: _Analysis, lexical: str, real: str) -> bool:
        """Is this path in Steward's data dir (the policy files there may be read)?"""
        if lexical in self.guarded or real in self.guarded:
            return False
        # Below it: the folder as a whole is judged by what is done to it (a search through
        # it needs approval, deleting or moving it takes the policy file along).
        return any(_under(x, d) and x != d for d in self.private for x in (lexical, real))

    def policy_file(self: _Analysis, p: _Path, *, holding: bool = False) -> bool:
        """Is `p` one of the guardian's own policy files (or, `holding`, a folder above one)?"""
        for x in (p.lexical, p.real):
            if x is None or p.glob:
                continue
            if any(x == g or (holding and _under(g, x)) for g in self.guarded):
                return True
        return False

    def deletes_policy_file(
        self: _Analysis, value: str, p: _Path, scope: _Scope, *, recursive: bool
    ) -> bool:
        """Would deleting `value` (a path or a glob) delete a policy file?"""
        if not p.glob:
            return self.policy_file(p, holding=recursive)
        pattern = os.path.expanduser(value)
        if not pattern.startswith("/"):
            if scope.cwd is None:
                return False
            pattern = os.path.join(scope.cwd, pattern)
        for guarded in self.guarded:
            reached = [guarded]
            if recursive:
                parent = os.path.dirname(guarded)
                while parent not in ("/", ""):
                    reached.append(parent)
                    parent = os.path.dirname(parent)
            for alternative in _expand_braces(_norm(pattern)):
                if any(_glob_matches(alternative, r) for r in reached):
                    return True
        return False

    def delete_count(
        self: _Analysis, value: str, p: _Path, scope: _Scope, recursive: bool, cap: int
    ) -> int:
        """How many files deleting `value` removes, counted up to `cap` (cheap: stops there).

        A path counts one; a glob counts its matches; with -r a folder counts the files in it.
        """
        if not p.glob and p.real is None:
            return 1
        targets = self.expand_glob(value, scope, cap) if p.glob else [p.real or value]
        count = 0
        for target in targets:
            if count >= cap:
                break
            if not recursive or os.path.islink(target) or not os.path.isdir(target):
                count += 1
                continue
            count += max(1, _count_files(target, cap - count))
        return count

    def check_write(
        self: _Analysis,
        word: _Word,
        scope: _Scope,
        where: str,
        verb: str = "writes",
        effect: str | None = None,
    ) -> None:
        """Writing to `word`: a disk device is refused, outside the workspace needs approval.

        The path is noted as an effect: `effect` names the kind ("reads" for a copy's
        source, "" for none: a folder checked for the files a download names), else it
        follows the verb ("deletes" deletes, "uses" notes nothing, any
        other verb writes)."""
        kind = (
            effect if effect is not None else {"deletes": "deletes", "uses": ""}.get(verb, "writes")
        )
        if word.value is None:
            if kind:
                self.note(kind, word, scope)
            self.flag(
                Verdict.APPROVAL,
                f"{where} {verb} `{word.raw}`, a path only known at run time",
            )
            return
        value = word.value
        if value in HARMLESS_DEVICES or HARMLESS_DEVICE_RE.match(value) or value == "-":
            return
        if kind:
            self.note(kind, word, scope)
        p = self.path(value, scope)
        if self.is_device(p):
            self.flag(Verdict.FORBID, f"{where} writes to the disk device {value}")
        elif any(x and KERNEL_FILE_RE.match(x) for x in (p.lexical, p.real)):
            self.flag(Verdict.FORBID, f"{where} writes to the kernel interface {value}")
        elif self.policy_file(p):
            self.flag(
                Verdict.FORBID,
                f"{where} {verb} `{value}`, the guardian's policy file; the agent may not "
                "change its own rules",
            )
        elif p.real is None:
            self.flag(
                Verdict.APPROVAL,
                f"{where} {verb} `{value}` after changing to a folder only known at run time",
            )
        elif not self.inside(p) and self.is_own(p):
            self.flag(Verdict.FORBID, self.own_reason(f"{where} {verb} `{value}`:"))
        elif not self.inside(p):
            self.flag(
                Verdict.APPROVAL,
                f"{where} {verb} outside the workspace ({p.lexical})",
                (f"write:{p.real}",),
            )
        elif verb != "uses" and (_git_runs_it(p.lexical) or _git_runs_it(p.real)):
            # Granted, exactly that file becomes writable in the sandbox (the rest stays).
            self.flag(
                Verdict.APPROVAL,
                f"{where} {verb} `{value}`: git's control files (config, hooks, "
                ".gitattributes, .gitmodules, gitdir pointers) decide what programs git runs "
                "later",
                (f"write:{p.real}",),
            )
