"""git's control files: the files in a repository that decide which programs git runs.

Why this matters: a person runs `git status` or `git commit` in the workspace with
their own git, outside every sandbox. A repository's config (`core.fsmonitor`,
`core.hooksPath`, `diff.external`, filter and merge drivers, aliases…), its hooks,
a `commondir` or `gitdir:` file that points git at another repository, and a
`.gitmodules` whose `update = !command` runs on `git submodule update` all turn that
harmless command into any program. So changing them is never routine work: the
guardian asks before any tool changes one (core/guardian), and the sandbox keeps the
existing ones read-only and undoes what a command planted in a repository it created
(core/sandbox/gitguard.py). Attributes (`.gitattributes`, `info/attributes`) only
*name* drivers, which are defined in config: they need approval from the file tools
but run nothing by themselves.

This module is the vocabulary both share: which paths are control files, and which
config entries are safe (written by `git init`, `git clone` and everyday commands,
and running nothing).
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

#: Inside a git dir: what decides which programs git runs or which repository it uses.
GITDIR_FILES = ("config", "config.worktree", "commondir", "gitdir")
#: Inside a git dir, by relative path.
GITDIR_PATHS = ("hooks", "info/attributes", "objects/info/alternates")
#: In a working tree, by name.
TREE_FILES = (".gitattributes", ".gitmodules")

#: Config entries that run nothing and point nowhere new: what `git init`, `git clone`,
#: `git submodule`, `git worktree` and everyday commands write. `SECTION.KEY` or
#: `SECTION.*.KEY` (any subsection); compared lowercase, as git compares them.
SAFE_CONFIG = frozenset(
    {
        *(
            f"core.{k}"
            for k in (
                "repositoryformatversion",
                "filemode",
                "bare",
                "logallrefupdates",
                "ignorecase",
                "precomposeunicode",
                "symlinks",
                "autocrlf",
                "eol",
                "safecrlf",
                "checkstat",
                "trustctime",
                "quotepath",
                "sparsecheckout",
                "sparsecheckoutcone",
                "splitindex",
                "untrackedcache",
                "compression",
                "loosecompression",
                "bigfilethreshold",
                "abbrev",
                "commentchar",
                "whitespace",
                "preloadindex",
                "multipackindex",
                "commitgraph",
                "warnambiguousrefs",
                "sharedrepository",
                "protecthfs",
                "protectntfs",
            )
        ),
        *(
            f"remote.*.{k}"
            for k in (
                "url",
                "pushurl",
                "fetch",
                "push",
                "mirror",
                "tagopt",
                "prune",
                "prunetags",
                "promisor",
                "partialclonefilter",
                "skipdefaultupdate",
                "skipfetchall",
            )
        ),
        *(f"branch.*.{k}" for k in ("remote", "merge", "rebase", "pushremote", "description")),
        *(
            f"submodule.*.{k}"
            for k in ("url", "path", "active", "branch", "update", "ignore", "shallow")
        ),
        "submodule.active",
        "submodule.recurse",
        "user.name",
        "user.email",
        "init.defaultbranch",
        *(
            f"extensions.{k}"
            for k in ("objectformat", "worktreeconfig", "partialclone", "refstorage", "noop")
        ),
        *(f"gc.{k}" for k in ("auto", "autopacklimit", "autodetach", "pruneexpire")),
        *(f"fetch.{k}" for k in ("prune", "prunetags", "recursesubmodules", "parallel")),
        "pull.rebase",
        "pull.ff",
        "push.default",
        "push.autosetupremote",
        "push.followtags",
        "merge.ff",
        "merge.conflictstyle",
        *(f"diff.{k}" for k in ("renames", "algorithm", "mnemonicprefix", "noprefix", "context")),
        "index.version",
        "index.sparse",
        "status.showuntrackedfiles",
        "color.ui",
        "lfs.repositoryformatversion",
        "maintenance.auto",
        "maintenance.strategy",
    }
)

#: What ConfigUnreadable says when there is no git to read a config with.
NO_GIT = "git is not installed on this machine"
#: How much of one config file is read to check it.
MAX_CONFIG_BYTES = 256_000


def gitdir_control(rest: Sequence[str]) -> bool:
    """Is the path `rest` (components below a git dir) one of its control files?"""
    if not rest:
        return True  # the git dir (or a `.git` file or link) itself
    if len(rest) == 1 and rest[0] in GITDIR_FILES:
        return True
    joined = "/".join(rest)
    if any(joined == p or joined.startswith(p + "/") for p in GITDIR_PATHS):
        return True
    # Nested admin folders: worktrees/<name>/{commondir,gitdir,config.worktree}, and
    # modules/<name>/… (a whole git dir of a submodule).
    if rest[0] == "worktrees" and len(rest) == 3 and rest[2] in GITDIR_FILES:
        return True
    if rest[0] == "modules" and len(rest) > 2:
        return gitdir_control(rest[2:]) or gitdir_control(rest[1:])
    return False


def looks_like_gitdir(folder: str) -> bool:
    """A folder git would take for a repository (a bare one, or a `.git` folder under
    another name): `HEAD`, `objects/` and `refs/`. Not following links."""
    try:
        head = os.lstat(os.path.join(folder, "HEAD"))
        objects = os.lstat(os.path.join(folder, "objects"))
        refs = os.lstat(os.path.join(folder, "refs"))
    except OSError:
        return False
    return (
        stat.S_ISREG(head.st_mode) and stat.S_ISDIR(objects.st_mode) and stat.S_ISDIR(refs.st_mode)
    )


def is_control_path(path: str) -> bool:
    """Is `path` (absolute or relative; not resolved) a git control file of any
    repository: below a `.git` folder, a `.git` entry itself, a tree's
    `.gitattributes` or `.gitmodules`, or a control file of a folder that looks like a
    git dir (a bare repository)?"""
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if not parts:
        return False
    if parts[-1] in TREE_FILES:
        return True
    if ".git" in parts:
        last = len(parts) - parts[::-1].index(".git")
        if gitdir_control(parts[last:]):
            return True
    # A bare repository (or a git dir with another name) somewhere above.
    absolute = os.path.abspath(path)
    folder = os.path.dirname(absolute)
    rest: list[str] = [os.path.basename(absolute)]
    for _ in range(4):
        if looks_like_gitdir(folder) and gitdir_control(rest):
            return True
        parent = os.path.dirname(folder)
        if parent == folder:
            break
        rest.insert(0, os.path.basename(folder))
        folder = parent
    return False


# ── config entries ──────────────────────────────────────────────────────────────


@dataclass(frozen=True, slots=True)
class Entry:
    """One config entry as git reads it: `section[.subsection].key` and its value."""

    name: str
    value: str

    @property
    def section(self) -> str:
        return self.name.split(".", 1)[0].lower()

    @property
    def key(self) -> str:
        return self.name.rsplit(".", 1)[-1].lower()

    @property
    def subsection(self) -> str | None:
        parts = self.name.split(".")
        return ".".join(parts[1:-1]) if len(parts) > 2 else None

    def safe(self) -> bool:
        """Whether this entry runs nothing (see SAFE_CONFIG); `update = !…` of a
        submodule runs a command, whatever its name says."""
        pattern = (
            f"{self.section}.*.{self.key}"
            if self.subsection is not None
            else f"{self.section}.{self.key}"
        )
        if pattern not in SAFE_CONFIG:
            return False
        return not (
            self.section == "submodule" and self.key == "update" and self.value.startswith("!")
        )


class ConfigUnreadable(Exception):
    """git is not installed here, or could not read the file as config."""


def read_entries(text: bytes) -> list[Entry]:
    """The entries of a config file's bytes, read by git itself (what git reads is what
    matters; a parser of our own could read the same bytes differently). Includes are
    not followed; no other config is consulted."""
    git = shutil.which("git")
    if git is None:
        raise ConfigUnreadable(NO_GIT)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "GIT_CONFIG_NOSYSTEM": "1",
        "HOME": "/nonexistent",
    }
    try:
        done = subprocess.run(
            [git, "config", "--no-includes", "-z", "--file", "-", "--list"],
            input=text,
            capture_output=True,
            timeout=10,
            check=False,
            cwd="/",
            env=env,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigUnreadable(str(exc)) from None
    if done.returncode != 0:
        raise ConfigUnreadable(done.stderr.decode("utf-8", "replace").strip()[:200])
    entries = []
    for item in done.stdout.split(b"\0"):
        if not item:
            continue
        name, _, value = item.decode("utf-8", "surrogateescape").partition("\n")
        entries.append(Entry(name, value))
    return entries


def unsafe(entries: Iterable[Entry]) -> list[Entry]:
    return [e for e in entries if not e.safe()]


_KEY = re.compile(r"^[A-Za-z][A-Za-z0-9-]*$")


def render(entries: Iterable[Entry]) -> str:
    """Config text holding exactly `entries`, in order (sections as they come)."""
    lines: list[str] = []
    current: tuple[str, str | None] | None = None
    for entry in entries:
        section_key = (entry.name.split(".", 1)[0], entry.subsection)
        if section_key != current:
            current = section_key
            name, sub = section_key
            if sub is None:
                lines.append(f"[{name}]")
            else:
                quoted = sub.replace("\\", "\\\\").replace('"', '\\"')
                lines.append(f'[{name} "{quoted}"]')
        key = entry.name.rsplit(".", 1)[-1]
        if not _KEY.match(key):
            continue
        value = (
            entry.value.replace("\\", "\\\\")
            .replace('"', '\\"')
            .replace("\n", "\\n")
            .replace("\t", "\\t")
        )
        lines.append(f'\t{key} = "{value}"')
    return "\n".join(lines) + ("\n" if lines else "")
