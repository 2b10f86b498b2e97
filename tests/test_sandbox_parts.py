"""The sandbox's small parts on their own: hosts a grant names, git's control-file
vocabulary, the settings that shape the sandbox. Their effects are tested through the
product in tests/test_boundary_e2e.py and tests/test_sandbox_effects.py."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from config.settings import ConfigError
from core import git_control
from core.sandbox import Grant, Limits, SandboxUser, parse_user
from core.sandbox.environment import command_env
from core.sandbox.hosts import hosts_for, valid_host


def test_a_grant_names_the_hosts_a_command_needs() -> None:
    runs = [("pip", "install", "requests"), ("python3", "-m", "npm", "ci")]
    hosts = hosts_for("curl -s https://API.example.com/x && git clone git://h.example/r", runs)
    assert hosts == (
        "api.example.com",
        "files.pythonhosted.org",
        "h.example",
        "pypi.org",
        "registry.npmjs.org",
    )
    assert hosts_for("true", [], ["Docs.Example.org", "bad host\x00", "*.cdn.example"]) == (
        "*.cdn.example",
        "docs.example.org",
    )
    assert not valid_host("a..b") and not valid_host("x.example:443")
    grant = Grant.from_needs(["network"], hosts)
    assert grant.hosts == hosts and "pypi.org" in grant.describe()
    assert Grant.from_needs(["write:/tmp/x"], hosts).hosts == ()  # no network: no hosts


@pytest.mark.parametrize(
    ("path", "control"),
    [
        ("ws/.git/config", True),
        ("ws/a/b/.git/hooks/pre-commit", True),
        ("ws/.git/commondir", True),
        ("ws/.git/worktrees/w/gitdir", True),
        ("ws/.git/modules/sub/config", True),
        ("ws/.git/modules/sub/hooks/post-merge", True),
        ("ws/.git/info/attributes", True),
        ("ws/.git/objects/info/alternates", True),
        ("ws/deep/.gitattributes", True),
        ("ws/.gitmodules", True),
        ("ws/sub/.git", True),
        ("ws/.git/objects/ab/cdef", False),
        ("ws/.git/refs/heads/main", False),
        ("ws/src/config", False),
        ("ws/hooks/x", False),
    ],
)
def test_control_paths(path: str, control: bool) -> None:
    assert git_control.is_control_path(path) is control


def test_a_bare_repository_s_config_is_a_control_file(tmp_path: Path) -> None:
    subprocess.run(["git", "init", "-q", "--bare", str(tmp_path / "r.git")], check=True)
    assert git_control.is_control_path(str(tmp_path / "r.git" / "config"))
    assert git_control.is_control_path(str(tmp_path / "r.git" / "hooks" / "x"))
    assert not git_control.is_control_path(str(tmp_path / "plain" / "config"))


def test_config_entries_are_read_by_git_and_unsafe_ones_named() -> None:
    text = (
        b"[core]\n\trepositoryformatversion = 0\n\tfsmonitor = touch /tmp/x\n"
        b'[remote "origin"]\n\turl = https://example.com/r.git\n'
        b'[submodule "s"]\n\tupdate = !sh -c evil\n[submodule "t"]\n\tupdate = rebase\n'
        b'[alias]\n\tst = !sh\n[diff "x"]\n\ttextconv = cat\n'
    )
    entries = git_control.read_entries(text)
    bad = sorted(e.name for e in git_control.unsafe(entries))
    assert bad == ["alias.st", "core.fsmonitor", "diff.x.textconv", "submodule.s.update"]
    kept = [e for e in entries if e.safe()]
    again = git_control.read_entries(git_control.render(kept).encode())
    assert again == kept  # what is written back reads the same, quotes and all


def test_a_value_that_is_hard_to_quote_survives_render() -> None:
    entries = [git_control.Entry('remote.we"ird\\name.url', 'a "b" \\ c\td\ne')]
    assert git_control.read_entries(git_control.render(entries).encode()) == entries


def test_the_environment_is_an_allowlist(tmp_path: Path) -> None:
    source = {
        "PATH": "/usr/bin",
        "HOME": "/root",
        "LC_ALL": "C.UTF-8",
        "DATABASE_URL": "postgres://secret",
        "GIT_DIR": "/elsewhere/.git",
        "STEWARD_API_KEY": "k",
        "NODE_ENV": "production",
    }
    env = command_env(tmp_path, listed=["NODE_ENV", "STEWARD_API_KEY"], source=source)
    assert env["LC_ALL"] == "C.UTF-8" and env["NODE_ENV"] == "production"
    assert not {"DATABASE_URL", "GIT_DIR", "STEWARD_API_KEY"} & env.keys()
    assert env["PATH"].startswith(f"{tmp_path}/.local/bin:")
    assert env["PYTHONUSERBASE"] == f"{tmp_path}/.local"
    assert env["GIT_CEILING_DIRECTORIES"] == str(tmp_path.parent)


def test_limits_become_one_ulimit_line_and_explain_what_was_hit() -> None:
    limits = Limits(processes=10, memory_mb=100, file_size_mb=1, cpu_seconds=5)
    assert limits.ulimit() == "ulimit -u 10 -d 102400 -f 1024 && ulimit -St 5 && ulimit -Ht 10"
    assert Limits(0, 0, 0, 0).ulimit() == ""
    assert "sandbox_max_file_size" in limits.explain(153, "")
    assert "sandbox_max_cpu" in limits.explain(152, "")
    assert "sandbox_max_memory" in limits.explain(1, "MemoryError")
    assert "sandbox_max_processes" in limits.explain(1, "fork: Resource temporarily unavailable")
    assert limits.explain(1, "No such file") == ""


def test_sandbox_user_setting(settings_for: Callable) -> None:
    assert settings_for(None).sandbox_user == "auto"
    assert settings_for(None, sandbox_user="1234").sandbox_user == "1234:1234"
    assert parse_user(settings_for(None, sandbox_user="1234:99").sandbox_user) == SandboxUser(
        1234, 99
    )
    assert parse_user("auto") is None
    with pytest.raises(ConfigError, match="may not be root"):
        settings_for(None, sandbox_user="0")
    with pytest.raises(ConfigError, match="not a user"):
        settings_for(None, sandbox_user="no-such-user-here")
    assert settings_for(None, sandbox_env="A, B;C").sandbox_env == ["A", "B", "C"]


@pytest.mark.skipif(os.geteuid() != 0, reason="where Steward is root")
def test_as_root_only_a_folder_grant_keeps_stewards_uid(tmp_path: Path) -> None:
    from core.sandbox import Sandbox

    sandbox = Sandbox(bwrap="bwrap", workspace=tmp_path, user=SandboxUser(65534, 65534))
    assert sandbox.as_root(Grant(write=("/etc",)))  # a folder: only root may write in it
    assert not sandbox.as_root(Grant(write=("/etc/hosts",)))  # a file: through a copy
    assert not sandbox.as_root(Grant(write=(str(tmp_path / ".git" / "config"),)))
    assert not sandbox.as_root(Grant(network=True))


def test_a_pip_install_gets_a_workspace_venv_once(tmp_path: Path) -> None:
    from core.sandbox.environment import with_workspace_venv

    command, made = with_workspace_venv("pip install requests", tmp_path)
    assert made and command.startswith("python3 -m venv --system-site-packages .venv")
    assert with_workspace_venv("ls && python3 -m pip install -q x", tmp_path)[1]
    for where in ("pip install --user x", "pip install -t lib x", "pip list", "pipx install x"):
        assert with_workspace_venv(where, tmp_path) == (where, False)
    (tmp_path / ".venv").mkdir()
    assert with_workspace_venv("pip install requests", tmp_path)[1] is False
