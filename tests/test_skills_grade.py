"""The grade every skill gets before it is enabled, on real folders: what passes, what
fails and why (hidden characters, secrets, links and paths out of the folder, special
files, sizes, names, compiled programs), and what each script is said to run."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from core.skills import Grade, grade
from core.skills.checks import hidden_characters, leaves_folder
from core.skills.files import MAX_ENTRIES, MAX_FILE_BYTES, read_folder
from core.skills.proposals import slug
from core.skills.scripts import read_script, shebang
from tests.test_skills_e2e import skill_md, write_skill


def graded(base: Path, name: str, expected: str | None = None) -> Grade:
    return grade(read_folder(base, name), expected_name=expected or name)


def test_a_plain_skill_passes_with_its_scripts_listed(tmp_path: Path) -> None:
    write_skill(
        tmp_path / "pdf-tools",
        {
            "SKILL.md": "---\nname: pdf-tools\ndescription: >\n  Extract text from PDFs.\n"
            "  Use when a PDF is named.\nlicense: MIT\nx-team: docs\n---\n\n# PDF\n\n"
            "1. Run `python3 scripts/extract.py FILE` (see [the notes](notes/more.md)).\n",
            "notes/more.md": "More, with a link [home](https://example.com/a/../b).\n",
            "scripts/extract.py": "#!/usr/bin/env python3\nimport subprocess, sys\n"
            "subprocess.run(['pdftotext', sys.argv[1], '-'])\n",
            "scripts/fetch.sh": '#!/bin/bash\nset -e\nURL=$1 curl -s "$1" | jq .items && '
            "git status\n",
            "scripts/tool.js": "const { execSync } = require('child_process');\nfetch(url)\n",
        },
    )
    os.mkfifo(tmp_path / "pdf-tools" / ".cache-fifo")  # hidden: ignored, never opened
    g = graded(tmp_path, "pdf-tools")
    assert g.passed, g.problems
    assert g.name == "pdf-tools"
    assert g.description == "Extract text from PDFs. Use when a PDF is named."
    described = [s.describe() for s in g.scripts]
    assert described == [
        "scripts/extract.py — runs with python3; calls pdftotext, subprocess (starts programs)",
        "scripts/fetch.sh — runs with bash; calls curl, jq, git",
        "scripts/tool.js — runs with node; calls child_process (starts programs), "
        "fetch (uses the network)",
    ]
    assert "front matter keys Steward does not use: x-team" in g.notes
    assert "ignored (hidden): .cache-fifo" in g.notes
    assert g.files == (
        "SKILL.md",
        "notes/more.md",
        "scripts/extract.py",
        "scripts/fetch.sh",
        "scripts/tool.js",
    )
    assert g.digest == graded(tmp_path, "pdf-tools").digest  # the same bytes, the same digest
    (tmp_path / "pdf-tools" / "notes" / "more.md").write_text("Changed.\n")
    assert graded(tmp_path, "pdf-tools").digest != g.digest


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("zero\u200bwidth", "U+200B ZERO WIDTH SPACE"),
        ("tag\U000e0069\U000e0067", "an invisible Unicode tag character"),
        ("over\u202eride", "a bidirectional control character (U+202E RIGHT-TO-LEFT OVERRIDE)"),
        ("isolate\u2066x\u2069", "U+2066 LEFT-TO-RIGHT ISOLATE"),
        ("soft\u00adhyphen", "U+00AD SOFT HYPHEN"),
        ("a\U000e0100b", "an invisible variation selector"),
        ("word\ufe0f", "an invisible variation selector"),
        ("hangul\u3164filler", "U+3164 HANGUL FILLER"),
        ("bell\x07", "a control character"),
        ("line\u2028break", "an invisible line separator"),
    ],
)
def test_hidden_characters_fail_the_grade_naming_file_line_and_character(
    tmp_path: Path, text: str, why: str
) -> None:
    write_skill(tmp_path / "tidy", {"SKILL.md": skill_md("tidy", "Tidy.", f"1. {text}\n")})
    g = graded(tmp_path, "tidy")
    assert not g.passed
    assert all(p.startswith("SKILL.md line 8: ") for p in g.problems)
    assert why in g.problems[0]


def test_pictures_and_scripts_of_other_languages_are_not_hidden_characters() -> None:
    shown = "Done 👩\u200d💻 ❤\ufe0f 日本語 café — “quoted” ¡sí! \ufeffnot first"
    assert hidden_characters("a.md", "\ufeff" + shown.replace("\ufeff", "")) == []
    assert hidden_characters("a.md", "x\ufeff") == [
        "a.md line 1: an invisible character (U+FEFF ZERO WIDTH NO-BREAK SPACE)"
    ]


@pytest.mark.parametrize(
    ("secret", "kind"),
    [
        ("OPENAI_API_KEY=sk-proj-" + "a1B2c3D4e5F6g7H8i9J0k1L2", "openai_key"),
        ("token: ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8", "github_token"),
        (
            "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXk\n"
            "-----END OPENSSH PRIVATE KEY-----",
            "private_key",
        ),
        ("curl https://deploy:Hunter2Hunter2@example.com/x", "url_password"),
        ("AKIA" + "ABCDEFGHIJKLMNOP", "aws_access_key_id"),
    ],
)
def test_secrets_fail_the_grade_by_kind_without_showing_them(
    tmp_path: Path, secret: str, kind: str
) -> None:
    write_skill(
        tmp_path / "deploy",
        {"SKILL.md": skill_md("deploy", "Deploy."), "scripts/env.sh": f"# setup\n{secret}\n"},
    )
    g = graded(tmp_path, "deploy")
    assert not g.passed
    [problem] = g.problems
    assert problem == f"scripts/env.sh line 2: holds a secret ({kind}); take it out"


def test_a_key_inside_a_binary_file_is_found_too(tmp_path: Path) -> None:
    write_skill(tmp_path / "img", {"SKILL.md": skill_md("img", "Pictures.")})
    key = b"sk-ant-" + b"api03-" + b"Z" * 30
    (tmp_path / "img" / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n\0\0" + key + b"\0\xff")
    (tmp_path / "img" / "ok.png").write_bytes(b"\x89PNG\r\n\x1a\n\0\0\xff\xfe plain")
    g = graded(tmp_path, "img")
    assert g.problems == ("logo.png: holds a secret (anthropic_key); take it out",)


def test_links_and_paths_leaving_the_folder_fail(tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("not the skill's")
    folder = write_skill(
        tmp_path / "skills" / "walk",
        {
            "SKILL.md": skill_md(
                "walk",
                "Walk.",
                "1. Read [the key](../../.ssh/id_rsa) and [passwd](/etc/passwd).\n"
                "2. Then run `cat ../../outside.txt`.\n"
                "3. [Fine](docs/a.md), [fine too](https://example.com/../x), [ok](#steps).\n",
            ),
            "docs/a.md": "See [up](../SKILL.md) (inside) and [out](../../x.md).\n",
        },
    )
    (folder / "escape").symlink_to(outside)
    (folder / "docs" / "loop").symlink_to(folder)
    g = graded(tmp_path / "skills", "walk")
    assert sorted(g.problems) == sorted(
        [
            "SKILL.md line 8: a link '../../.ssh/id_rsa' climbs out of the skill's folder",
            "SKILL.md line 8: a link points at '/etc/passwd' on this machine, outside the "
            "skill's folder",
            "SKILL.md line 9: '../../outside.txt' climbs out of the skill's folder",
            "docs/a.md line 1: a link '../../x.md' climbs out of the skill's folder",
            f"escape is a symbolic link (to {outside}): a link can lead out of the skill's "
            "folder, so skills may not hold links",
            f"docs/loop is a symbolic link (to {folder}): a link can lead out of the "
            "skill's folder, so skills may not hold links",
        ]
    )
    assert "escape" not in g.files  # never read through


def test_a_skill_folder_that_is_a_link_is_not_read(tmp_path: Path) -> None:
    real = write_skill(tmp_path / "private" / "x", {"SKILL.md": skill_md("x", "Private.")})
    (tmp_path / "skills").mkdir()
    (tmp_path / "skills" / "x").symlink_to(real)
    with pytest.raises(OSError, match="is a symbolic link"):
        read_folder(tmp_path, "skills/x")
    (tmp_path / "link-skills").symlink_to(tmp_path / "skills")
    with pytest.raises(OSError, match="symbolic link"):
        read_folder(tmp_path, "link-skills/x")


def test_special_files_are_refused_without_being_opened(tmp_path: Path) -> None:
    folder = write_skill(tmp_path / "odd", {"SKILL.md": skill_md("odd", "Odd.")})
    os.mkfifo(folder / "pipe")  # a read would block forever
    g = graded(tmp_path, "odd")
    assert g.problems == ("pipe is a named pipe (FIFO): skills hold plain files only",)


def test_names_and_front_matter(tmp_path: Path) -> None:
    write_skill(tmp_path / "good-name", {"SKILL.md": skill_md("other-name", "x")})
    assert graded(tmp_path, "good-name").problems == (
        "SKILL.md: the name is 'other-name' but the folder is 'good-name'; they must be the same",
    )
    for bad in ("Bad_Name", "-lead", "double--dash", "x" * 65):
        write_skill(tmp_path / "n", {"SKILL.md": skill_md(bad, "x")})
        problems = graded(tmp_path, "n").problems
        assert any("name" in p for p in problems), (bad, problems)
    write_skill(tmp_path / "nodesc", {"SKILL.md": "---\nname: nodesc\n---\n\nsteps\n"})
    assert graded(tmp_path, "nodesc").problems == (
        "SKILL.md: the front matter needs `description:` saying what the skill does and when "
        "to use it",
    )
    write_skill(tmp_path / "nofm", {"skill.md": "just text\n"})
    assert graded(tmp_path, "nofm").problems == (
        "there is no SKILL.md at the top of the folder (skill.md is there: rename it SKILL.md)",
    )
    write_skill(tmp_path / "yaml", {"SKILL.md": "---\nname: [unclosed\n---\n\nx\n"})
    [problem] = graded(tmp_path, "yaml").problems
    assert problem.startswith("SKILL.md: front matter is not valid YAML")


def test_sizes_are_limited(tmp_path: Path) -> None:
    folder = write_skill(tmp_path / "big", {"SKILL.md": skill_md("big", "Big.")})
    (folder / "data.bin").write_bytes(b"\0" * (MAX_FILE_BYTES + 1))
    assert graded(tmp_path, "big").problems == (
        f"data.bin is {MAX_FILE_BYTES + 1:,} bytes: the limit is {MAX_FILE_BYTES:,} per file",
    )
    many = write_skill(tmp_path / "many", {"SKILL.md": skill_md("many", "Many.")})
    for i in range(MAX_ENTRIES + 5):
        (many / f"f{i:04d}.txt").write_text("x")
    problems = graded(tmp_path, "many").problems
    assert problems == (f"the skill holds more than {MAX_ENTRIES} files and folders",)


def test_a_compiled_program_is_refused(tmp_path: Path) -> None:
    folder = write_skill(tmp_path / "bin", {"SKILL.md": skill_md("bin", "Binary.")})
    program = folder / "scripts" / "tool"
    program.parent.mkdir()
    program.write_bytes(b"\x7fELF\x02\x01\x01\0" + b"\0" * 64)
    program.chmod(program.stat().st_mode | stat.S_IXUSR)
    assert graded(tmp_path, "bin").problems == (
        "scripts/tool is a compiled program: nobody can read what it would run, so skills "
        "carry scripts as text only",
    )


def test_what_scripts_run() -> None:
    assert shebang("#!/usr/bin/env -S python3 -u\n") == "python3"
    assert shebang("#!/bin/sh -e\n") == "sh"
    script = read_script("run", b"#!/bin/sh\nFOO=1 exec rsync -a src/ dst/\nsudo reboot\n")
    assert script.describe() == "run — runs with sh; calls rsync, sudo"
    assert read_script("x.py", b"import os\nos.system('rm -rf /tmp/x')\n").calls == (
        "rm",
        "os (may start programs (os.system, os.exec*))",
    )
    assert read_script("scripts/notes", b"plain words\n").interpreter == (
        "unknown: no #! line and no known extension"
    )


def test_leaves_folder() -> None:
    assert leaves_folder("SKILL.md", "a/../b.md") is None
    assert leaves_folder("docs/x.md", "../SKILL.md") is None
    assert leaves_folder("docs/x.md", "../../SKILL.md") is not None
    assert leaves_folder("SKILL.md", "~/.aws/credentials") is not None
    assert leaves_folder("SKILL.md", "mailto:a@b") is None


def test_a_proposal_is_named_from_its_request() -> None:
    assert slug("Please make the weekly report for sales!") == "make-weekly-report-sales"
    assert slug("¿?") == "saved-task"
