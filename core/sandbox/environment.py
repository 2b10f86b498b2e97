"""The environment a command the agent causes starts with: an allowlist, never a denylist.

Why an allowlist: a denylist of secret-looking names (KEY, TOKEN, SECRET …) let
`DATABASE_URL`, `MYSQL_PWD`, `SLACK_WEBHOOK_URL` and `GH_PAT` through to `env` and
`/proc/1/environ` inside the sandbox. Only what a shell needs to behave (PATH, HOME,
locale, terminal, time zone, user name, temp folder, the git identity) crosses, plus
the names the owner lists in `sandbox_env`. Steward's own `STEWARD_*` settings never
cross, listed or not.

git run in the workspace stops looking for a repository at the workspace
(GIT_CEILING_DIRECTORIES): the default workspace lives inside Steward's own checkout,
and without the ceiling `git status`, `git commit` or `git reset` there would act on
Steward's repository instead of saying "not a git repository".

Package installs land where they are useful: a `pip install` with no virtual
environment to land in gets one, `<workspace>/.venv` (with the system's packages
visible), which is active in every later command; `pip install --user` goes to
`<workspace>/.local` (PYTHONUSERBASE), whose `bin` is on PATH. What a person approved
installing is there for the next command too, instead of vanishing with the
sandbox's throwaway home.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path

#: Variables that cross into every command, by exact name.
PASSED = (
    "PATH",
    "HOME",
    "LANG",
    "LANGUAGE",
    "TERM",
    "COLORTERM",
    "TZ",
    "USER",
    "LOGNAME",
    "TMPDIR",
    "GIT_AUTHOR_NAME",
    "GIT_AUTHOR_EMAIL",
    "GIT_COMMITTER_NAME",
    "GIT_COMMITTER_EMAIL",
    # Where git stops looking for a repository: the workspace's parent is put first.
    "GIT_CEILING_DIRECTORIES",
)
#: Variables that cross by prefix (the locale's categories).
PASSED_PREFIXES = ("LC_",)
#: Steward's own settings: never passed, even when listed in `sandbox_env`.
OWN_PREFIX = "STEWARD_"
#: Variables that point git at a repository directly, bypassing discovery (and so the
#: ceiling): they are not in the allowlist, and an owner listing them is ignored too.
GIT_LOCATORS = (
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_COMMON_DIR",
    "GIT_INDEX_FILE",
    "GIT_OBJECT_DIRECTORY",
    "GIT_ALTERNATE_OBJECT_DIRECTORIES",
)
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"


def passes(name: str, listed: Iterable[str] = ()) -> bool:
    """Whether the variable `name` of Steward's environment reaches a command."""
    if name.startswith(OWN_PREFIX) or name in GIT_LOCATORS:
        return False
    return name in PASSED or name.startswith(PASSED_PREFIXES) or name in set(listed)


def command_env(
    workspace: Path,
    *,
    listed: Iterable[str] = (),
    extra: Mapping[str, str] | None = None,
    source: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The environment of a command run in `workspace` (a real path): the allowlist of
    `source` (default os.environ) plus the owner's `listed` names, then `extra` (set by
    Steward itself), git confined to the workspace, installs kept in the workspace."""
    source = os.environ if source is None else source
    names = tuple(listed)
    env = {k: v for k, v in source.items() if passes(k, names)}
    env.setdefault("PATH", DEFAULT_PATH)
    if extra:
        env.update(extra)
    git_confined(env, workspace)
    installs_in(env, workspace)
    for key, value in git_identity().items():  # the sandbox's empty home has no ~/.gitconfig
        env.setdefault(key, value)
    return env


def git_confined(env: dict[str, str], workspace: Path) -> None:
    """Make git find no repository above `workspace` (a real path): its parent goes first
    in GIT_CEILING_DIRECTORIES, so discovery checks the workspace and the folders inside
    it, never the ones above; a `git init` or clone inside the workspace works as usual.
    Variables naming a repository outright are dropped, since they skip discovery."""
    for name in GIT_LOCATORS:
        env.pop(name, None)
    parent = workspace.parent
    if parent == workspace:  # the workspace is "/": nothing above it
        return
    others = env.get("GIT_CEILING_DIRECTORIES", "")
    env["GIT_CEILING_DIRECTORIES"] = f"{parent}:{others}" if others else str(parent)


def installs_in(env: dict[str, str], workspace: Path) -> None:
    """Python user installs go to `<workspace>/.local`; `<workspace>/.venv` is active
    when it exists. Both `bin` folders lead PATH."""
    local = workspace / ".local"
    env["PYTHONUSERBASE"] = str(local)
    first = [str(local / "bin")]
    venv = workspace / ".venv"
    if (venv / "bin" / "python").exists():
        env["VIRTUAL_ENV"] = str(venv)
        first.insert(0, str(venv / "bin"))
    path = [p for p in env.get("PATH", DEFAULT_PATH).split(":") if p and p not in first]
    env["PATH"] = ":".join([*first, *path])


@functools.cache
def git_identity() -> dict[str, str]:
    """The host's git user name and email as variables: the empty home inside has no
    ~/.gitconfig, and `git commit` in the workspace should sign as it does outside.
    Only these two values cross; the rest of the global config (aliases, helpers,
    credential settings) does not."""
    found: dict[str, str] = {}
    for key, names in (
        ("user.name", ("GIT_AUTHOR_NAME", "GIT_COMMITTER_NAME")),
        ("user.email", ("GIT_AUTHOR_EMAIL", "GIT_COMMITTER_EMAIL")),
    ):
        try:
            done = subprocess.run(
                ["git", "config", "--get", key],
                capture_output=True,
                text=True,
                timeout=5,
                check=False,
                cwd="/",
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        value = done.stdout.strip()
        if done.returncode == 0 and value:
            found.update(dict.fromkeys(names, value))
    return found


#: A pip install (pip, pip3, python -m pip), and the options that choose where it goes.
_PIP_INSTALL = re.compile(r"(?:^|[;&|(\s])(?:pip3?|python3?(?:\.\d+)?\s+-m\s+pip)\s+install\b")
_PIP_WHERE = re.compile(r"\s(?:--user|--target|--prefix|--root|-t)(?:[\s=]|$)")


def with_workspace_venv(command: str, workspace: Path) -> tuple[str, bool]:
    """`command` run in a new `<workspace>/.venv` when it is a pip install and there is
    no environment for it yet (and it does not say where to install); True when one is
    made. The venv sees the system's packages, so what worked before still does."""
    if (
        not _PIP_INSTALL.search(command)
        or _PIP_WHERE.search(command)
        or os.path.lexists(workspace / ".venv")
    ):
        return command, False
    made = "python3 -m venv --system-site-packages .venv && . .venv/bin/activate"
    return f"{made} && {{\n{command}\n}}", True
