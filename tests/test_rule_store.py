"""RuleStore.load runs on the event loop before every task: lean, and still
fresh on every call (a file added, edited by hand or removed is seen at once), in id
order, each rule a copy a caller may change."""

from __future__ import annotations

import os
from pathlib import Path

from memory.rules import Rule, RuleStore


def _write(root: Path, rule: Rule, *, mtime_ns: int | None = None) -> Path:
    import yaml

    path = root / f"{rule.id}.md"
    path.write_text("---\n" + yaml.safe_dump(rule.front_matter()) + "---\n" + rule.text + "\n")
    if mtime_ns is not None:
        os.utime(path, ns=(mtime_ns, mtime_ns))
    return path


def test_every_call_sees_the_files_as_they_are_in_id_order_as_copies(tmp_path: Path) -> None:
    store = RuleStore(tmp_path)
    assert store.load() == ([], [])  # no folder yet
    root = tmp_path / "rules"
    root.mkdir()
    for i in (10, 2, 1):
        _write(root, Rule(id=f"r-{i}", text=f"rule {i}", signature=f"shell:E{i}"))
    (root / "notes.txt").write_text("not a rule")
    (root / "broken.md").write_text("---\nid: [unclosed\n---\nx\n")
    rules, problems = store.load()
    assert [r.id for r in rules] == ["r-1", "r-2", "r-10"]
    assert len(problems) == 1 and "broken.md" in problems[0]

    # A copy each time: changing one changes neither the file nor the next load.
    rules[0].text, rules[0].trials = "changed", 99
    again, _ = store.load()
    assert (again[0].text, again[0].trials) == ("rule 1", 0)
    assert (again[0].signature, again[0].path) == ("shell:E1", root / "r-1.md")
    assert again[0] is not rules[0]

    # Edited by hand (same size, another mtime), added, removed: seen at the next call.
    _write(root, Rule(id="r-2", text="RULE 2", signature="shell:E2"), mtime_ns=10**18)
    _write(root, Rule(id="r-3", text="rule 3", signature="shell:E3"))
    (root / "r-10.md").unlink()
    assert [(r.id, r.text) for r in store.load()[0]] == [
        ("r-1", "rule 1"),
        ("r-2", "RULE 2"),
        ("r-3", "rule 3"),
    ]
