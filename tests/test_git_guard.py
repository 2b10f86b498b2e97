"""git's control files planted in ways a simple scan misses, then the person's own git.

Each case is a sandboxed command (through the real shell tool and sandbox, as the
product runs it) that plants `core.fsmonitor` somewhere git will read it; then a person
runs `git status` (or `commit`) outside the sandbox, and the test asserts the planted
program never ran. The cases came from an adversarial review of the first git guard:
a repository inside an existing `.git`, a git dir whose objects and refs come through
`commondir`, a common dir without a HEAD, a config too large to read whole, a pointer
with a second line, a scan budget spent on a deep tree, a repair made to crash, and
many planted repositories sharing one large config.
"""

from __future__ import annotations

import secrets
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.sandbox import detect, setup
from core.sandbox import gitguard as gitguard_module
from core.tools.base import ToolContext, ToolError
from core.tools.shell import run as shell_run

AVAILABLE = detect()
CHECKOUT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(
    not AVAILABLE.ok, reason=f"no OS sandbox on this machine: {AVAILABLE.reason}"
)


class Place:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.ws = root / "ws"
        self.ws.mkdir()
        self.canary = root / f"PWNED-{secrets.token_hex(4)}"
        self.sandbox = setup("auto", self.ws, [root / "data"]).sandbox
        self.fsmonitor = f'"touch {self.canary}; false"'

    async def run(self, command: str) -> str:
        ctx = ToolContext(workspace=self.ws, sandbox=self.sandbox, shell_timeout=60)
        try:
            return await shell_run(ctx, {"command": command})
        except ToolError as exc:
            return str(exc)

    def person_runs_git(self, where: str, *args: str) -> None:
        subprocess.run(
            ["git", "-c", "safe.directory=*", *(args or ("status", "--short"))],
            cwd=self.ws / where,
            capture_output=True,
            timeout=60,
            check=False,
            env={"PATH": "/usr/bin:/bin", "HOME": str(self.root)},
        )


@pytest.fixture
def place(tmp_path: Path) -> Iterator[Place]:
    yield Place(tmp_path)


def planted_config(fsmonitor: str) -> str:
    return f"printf '[core]\\n\\trepositoryformatversion = 0\\n\\tfsmonitor = {fsmonitor}\\n'"


async def test_a_repository_hidden_inside_an_existing_git_dir(place: Place) -> None:
    await place.run("git init -q .")
    out = await place.run(
        "mkdir -p .git/x && cp -r .git/objects .git/refs .git/HEAD .git/x/ && "
        f"{planted_config(place.fsmonitor)} > .git/x/config && "
        "mkdir -p sub && printf 'gitdir: ../.git/x\\n' > sub/.git && echo x > .git/commondir"
    )
    assert "fsmonitor" in out  # said what was undone
    place.person_runs_git(".")
    place.person_runs_git("sub")
    assert not place.canary.exists()


async def test_objects_and_refs_through_commondir(place: Place) -> None:
    await place.run(
        "git init -q base && git -C base config extensions.worktreeConfig true && "
        "git -C base config core.repositoryformatversion 1"
    )
    await place.run(
        "mkdir -p evil wt && echo 'ref: refs/heads/master' > evil/HEAD && "
        "echo ../base/.git > evil/commondir && "
        f"printf '[core]\\n\\tfsmonitor = {place.fsmonitor}\\n' > evil/config.worktree && "
        'echo "gitdir: $PWD/evil" > wt/.git'
    )
    place.person_runs_git("wt")
    assert not place.canary.exists()


async def test_a_common_dir_without_a_head(place: Place) -> None:
    await place.run(
        "mkdir -p evil c/objects c/refs && echo 'ref: refs/heads/main' > evil/HEAD && "
        f"echo ../c > evil/commondir && {planted_config(place.fsmonitor)} > c/config && "
        "echo 'gitdir: evil' > .git"
    )
    place.person_runs_git(".")
    assert not place.canary.exists()


async def test_a_config_too_large_to_read_whole_is_reset(place: Place) -> None:
    out = await place.run(
        "git init -q . && { printf '#'; head -c 300000 /dev/zero | tr '\\0' x; echo; "
        f"printf '[core]\\n\\tfsmonitor = %s\\n' {place.fsmonitor!r}; }} >> .git/config"
    )
    assert "reset .git/config" in out
    place.person_runs_git(".")
    assert not place.canary.exists()


async def test_a_pointer_is_read_whole_as_git_reads_it(place: Place) -> None:
    odd = "good/.git\nx"
    (place.ws / "good").mkdir()
    await place.run(
        f'd="$(printf \'{odd}\')"; git init -q --bare "$d" && '
        f'git -C "$d" config core.fsmonitor {place.fsmonitor!r} ; mkdir -p wt && '
        "printf 'gitdir: ../good/.git\\nx\\n' > wt/.git"
    )
    place.person_runs_git("wt")
    assert not place.canary.exists()


async def test_a_scan_that_runs_out_of_budget_still_finds_shallow_repositories(
    place: Place, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gitguard_module, "SCAN_FOLDERS", 500)
    out = await place.run(
        f"git init -q aaa && {planted_config(place.fsmonitor)} >> aaa/.git/config && "
        "python3 -c \"import os; [os.makedirs(f'zzz/{i // 30}/{i % 30}') for i in range(900)]\""
    )
    assert "not reached in time" in out  # the model is told the scan was cut
    place.person_runs_git("aaa")
    assert not place.canary.exists()


async def test_a_repair_made_to_crash_neither_stops_nor_leaves_a_plant(place: Place) -> None:
    out = await place.run(
        f"git init -q a && git init -q z && {planted_config(place.fsmonitor)} >> a/.git/config"
        " && python3 -c \"import os; os.chdir('z/.git'); os.mkdir('commondir'); "
        "os.chdir('commondir'); [(os.mkdir('d'), os.chdir('d')) for _ in range(1500)]\""
    )
    assert "removed core.fsmonitor from a/.git/config" in out
    await place.run("true")  # the next command's scan sees nothing left to undo
    place.person_runs_git("a")
    assert not place.canary.exists()


async def test_many_planted_repositories_cost_one_read_of_their_config(place: Place) -> None:
    """A thousand repositories sharing one large (safe) config: read by git once, not a
    thousand times in the conversation's path (it took minutes)."""
    place.ws.joinpath("plant.py").write_text(
        "import os\n"
        "os.makedirs('seed')\n"
        "open('seed/config', 'w').write('[core]\\n' + '\\tbare = false\\n' * 18000)\n"
        "open('seed/HEAD', 'w').write('ref: refs/heads/main\\n')\n"
        "for i in range(1000):\n"
        "    g = f'r/{i}/.git'\n"
        "    os.makedirs(g + '/objects'); os.makedirs(g + '/refs')\n"
        "    os.link('seed/HEAD', g + '/HEAD'); os.link('seed/config', g + '/config')\n"
    )
    start = time.monotonic()
    out = await place.run("python3 plant.py && echo planted")
    assert "planted" in out and time.monotonic() - start < 10


async def test_the_persons_own_settings_are_left_alone(place: Place) -> None:
    """What is there when Steward first looks is the person's: their alias stays."""
    place.person_runs_git(".", "init", "-q", "mine")
    place.person_runs_git("mine", "config", "alias.st", "!git status")
    out = await place.run("git -C mine log --oneline 2>&1 | head -1; echo ok")
    assert "undid" not in out
    assert "alias" in (place.ws / "mine" / ".git" / "config").read_text()


async def test_a_command_killed_with_steward_is_checked_at_the_next_start(
    tmp_path: Path,
) -> None:
    """Steward is killed (-9) while a command that planted is still running: nothing
    checked it. At the next start the guard knows a command was left unchecked and
    checks the workspace against what it trusted before, before anything else runs."""
    import asyncio
    import os
    import signal
    import sys

    ws, data = tmp_path / "ws", tmp_path / "data"
    ws.mkdir()
    canary = tmp_path / "PWNED"
    script = tmp_path / "first.py"
    script.write_text(
        "import asyncio, sys\n"
        "from pathlib import Path\n"
        "from core.sandbox import setup\n"
        "from core.tools.base import ToolContext\n"
        "from core.tools.shell import run\n"
        f"ws, data = Path({str(ws)!r}), Path({str(data)!r})\n"
        "s = setup('auto', ws, [data], state_dir=data / 'sandbox').sandbox\n"
        "ctx = ToolContext(workspace=ws, sandbox=s, shell_timeout=60)\n"
        "cmd = \"git init -q p && printf '[core]\\\\n\\\\tfsmonitor = %s\\\\n' "
        f"'touch {canary}' >> p/.git/config && touch planted && sleep 60\"\n"
        "asyncio.run(run(ctx, {'command': cmd}))\n"
    )
    first = await asyncio.create_subprocess_exec(sys.executable, str(script), cwd=CHECKOUT)
    for _ in range(200):
        if (ws / "planted").exists():
            break
        await asyncio.sleep(0.05)
    assert (ws / "planted").exists()
    os.kill(first.pid, signal.SIGKILL)
    await first.wait()
    assert "fsmonitor" in (ws / "p" / ".git" / "config").read_text()
    # The next start (a new process's first setup) checks before anything runs.
    await asyncio.to_thread(setup, "auto", ws, [data], state_dir=data / "sandbox")
    assert "fsmonitor" not in (ws / "p" / ".git" / "config").read_text()
    person = await asyncio.create_subprocess_exec(
        "git", "-c", "safe.directory=*", "status", cwd=ws / "p", stdout=asyncio.subprocess.DEVNULL
    )
    await person.wait()
    assert not canary.exists()


async def test_a_workspace_made_to_look_like_a_bare_repository_hides_nothing(
    place: Place,
) -> None:
    """The walk keeps going into a folder git takes for a repository (only its objects,
    refs and logs are skipped): the person's own .git below it stays guarded."""
    place.person_runs_git(".", "init", "-q", ".")
    await place.run("mkdir -p objects refs && echo 'ref: refs/heads/main' > HEAD")
    await place.run(f"printf '\\tfsmonitor = %s\\n' {place.fsmonitor!r} >> .git/config")
    place.person_runs_git(".")
    assert not place.canary.exists()


@pytest.mark.parametrize(
    "head",
    [
        "echo 0123456789ABCDEF0123456789ABCDEF01234567 > HEAD && mkdir -p objects refs",
        "echo 'ref: refs/heads/main' > HEAD && touch objects refs && chmod 755 objects refs",
    ],
    ids=["uppercase-hex-head", "objects-and-refs-as-files"],
)
async def test_a_repository_as_git_sees_it(place: Place, head: str) -> None:
    """git's own test of a repository, not a stricter one: a HEAD in uppercase hex, and
    objects/refs that are only executable files, make a repository for git."""
    place.person_runs_git(".", "init", "-q", ".")
    await place.run(
        f"{head} && printf '[core]\\n\\tbare = false\\n\\tworktree = {place.ws}\\n"
        f"\\tfsmonitor = %s\\n' {place.fsmonitor!r} > config && echo garbage > .git/HEAD"
    )
    place.person_runs_git(".")
    assert not place.canary.exists()


async def test_a_head_made_valid_later_is_seen(place: Place) -> None:
    place.person_runs_git(".", "init", "-q", ".")
    await place.run(
        "echo nothing > HEAD && mkdir -p objects refs && "
        f"printf '[core]\\n\\tbare = false\\n\\tworktree = {place.ws}\\n"
        f"\\tfsmonitor = %s\\n' {place.fsmonitor!r} > config && echo garbage > .git/HEAD"
    )
    await place.run("echo 'ref: refs/heads/main' > HEAD")
    place.person_runs_git(".")
    assert not place.canary.exists()


async def test_a_failed_write_back_never_skips_the_git_check(
    place: Place, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Writing an approved file back can fail (a full disk, a file system that refuses);
    the check of git's control files after the command still runs, and both are said."""
    from core.sandbox import Grant
    from core.sandbox.staging import Staging

    def refuse(self: Staging) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Staging, "settle", refuse)
    target = tmp_path / "approved.txt"
    target.write_text("x\n")
    ctx = ToolContext(
        workspace=place.ws,
        sandbox=place.sandbox,
        grant=Grant.from_needs([f"write:{target}"]),
    )
    out = await shell_run(
        ctx,
        {
            "command": f"echo y >> {target}; git init -q r && "
            f"{planted_config(place.fsmonitor)} >> r/.git/config"
        },
    )
    assert "could not be written back" in out and "removed core.fsmonitor" in out
    place.person_runs_git("r")
    assert not place.canary.exists()
