"""The code index (core/code) at 1k and 10k files: the first build, then the code tools'
questions once it is built (each call includes the stat walk that finds what changed),
and a question right after 1% of the files changed (walk + re-parse + answer).

Generated repositories, in five languages (60% Python, 20% TypeScript, 10% Go, 5% Rust,
5% Java), ~40 lines a file: a class with methods, functions calling into two other
modules they import, and one widely used `helper` every tenth file calls.

Baseline in the same run: `grep -rn helper` over the repository (the full scan a
search without an index makes), and the first build itself; ratios to both are printed.

`BENCH_CODE_SIZES=1000,10000` picks the sizes (default 1000,10000).
"""

from __future__ import annotations

import asyncio
import os
import random
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

PER_DIR = 100
RUNS = 5


def _python(i: int, n: int, rnd: random.Random) -> str:
    a, b = rnd.randrange(n), rnd.randrange(n)
    uses = "    helper(x)\n" if i % 10 == 0 else ""
    return (
        f"from pkg{a // PER_DIR}.m{a} import f{a}_0\n"
        f"from pkg{b // PER_DIR}.m{b} import f{b}_1\n"
        "from pkg0.m0 import helper\n\n\n"
        f"class C{i}:\n"
        "    def __init__(self, x: int) -> None:\n"
        "        self.x = x\n\n"
        "    def total(self) -> int:\n"
        f"        return f{a}_0(self.x) + f{b}_1(self.x)\n\n"
        "    def twice(self) -> int:\n"
        "        return self.total() * 2\n\n\n"
        + "".join(
            f"def f{i}_{k}(x: int) -> int:\n{uses}    return x + {rnd.randint(0, 999)}\n\n\n"
            for k in range(4)
        )
        + f"def main() -> int:\n    return C{i}(1).twice() + f{i}_0(2)\n"
    )


def _typescript(i: int, n: int, rnd: random.Random) -> str:
    a = rnd.randrange(n)
    return (
        f"import {{ g{a} }} from '../t{a // PER_DIR}/t{a}';\n\n"
        f"export interface R{i} {{ value: number }}\n\n"
        f"export class K{i} {{\n"
        "  constructor(private x: number) {}\n"
        f"  total(): R{i} {{ return {{ value: g{a}(this.x) }}; }}\n"
        "}\n\n"
        f"export function g{i}(x: number): number {{\n"
        f"  return x * {rnd.randint(0, 999)};\n"
        "}\n\n"
        f"export const h{i} = (x: number) => g{i}(x) + new K{i}(x).total().value;\n"
    )


def _go(i: int, rnd: random.Random) -> str:
    return (
        f"package p{i // PER_DIR}\n\n"
        'import "strings"\n\n'
        f"type S{i} struct{{ Name string }}\n\n"
        f"func (s *S{i}) Upper() string {{ return strings.ToUpper(s.Name) }}\n\n"
        f"func New{i}(name string) *S{i} {{\n"
        f'\treturn &S{i}{{Name: name + "{rnd.randint(0, 999)}"}}\n'
        "}\n"
    )


def _rust(i: int, rnd: random.Random) -> str:
    return (
        f"pub struct P{i} {{ pub x: i64 }}\n\n"
        f"impl P{i} {{\n"
        f"    pub fn new(x: i64) -> Self {{ P{i} {{ x: x + {rnd.randint(0, 999)} }} }}\n"
        "    pub fn double(&self) -> i64 { self.x * 2 }\n"
        "}\n\n"
        f"pub fn make{i}() -> i64 {{ P{i}::new(1).double() }}\n"
    )


def _java(i: int, rnd: random.Random) -> str:
    return (
        f"package j{i // PER_DIR};\n\n"
        f"public class J{i} {{\n"
        f"    private int x = {rnd.randint(0, 999)};\n"
        "    public int get() { return x; }\n"
        "    public int twice() { return get() * 2; }\n"
        "}\n"
    )


def _seed(root: Path, n: int) -> dict[str, int]:
    """Write an `n`-file repository; the count per language."""
    rnd = random.Random(n)
    counts: dict[str, int] = {}
    for i in range(n):
        slot = i % 20
        if slot < 12:
            lang, rel, text = "python", f"pkg{i // PER_DIR}/m{i}.py", _python(i, n, rnd)
        elif slot < 16:
            lang, rel, text = "typescript", f"t{i // PER_DIR}/t{i}.ts", _typescript(i, n, rnd)
        elif slot < 18:
            lang, rel, text = "go", f"p{i // PER_DIR}/s{i}.go", _go(i, rnd)
        elif slot < 19:
            lang, rel, text = "rust", f"r{i // PER_DIR}/src/p{i}.rs", _rust(i, rnd)
        else:
            lang, rel, text = "java", f"j{i // PER_DIR}/J{i}.java", _java(i, rnd)
        if i == 0:  # pkg0/m0.py also defines the helper everyone calls
            text += "\n\ndef helper(x: int) -> int:\n    return x\n"
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        for pkg in {path.parent} if lang == "python" else ():
            (pkg / "__init__.py").touch()
        counts[lang] = counts.get(lang, 0) + 1
    return counts


def _change(root: Path, n: int, rnd: random.Random) -> None:
    """1% of the Python files edited (a function added)."""
    for i in rnd.sample([i for i in range(n) if i % 20 < 12], max(1, n // 100)):
        path = root / f"pkg{i // PER_DIR}" / f"m{i}.py"
        path.write_text(path.read_text() + f"\n\ndef added_{rnd.randrange(10**9)}():\n    pass\n")


def _grep(root: Path) -> float:
    t0 = time.perf_counter()
    subprocess.run(["grep", "-rn", "helper", str(root)], capture_output=True, check=False)
    return time.perf_counter() - t0


def _du(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


async def _one(n: int) -> None:
    from core.code.service import CodeIntel
    from core.tools import ALL_TOOLS
    from core.tools.base import ToolContext

    with tempfile.TemporaryDirectory() as tmp:
        ws = Path(tmp) / "ws"
        ws.mkdir()
        counts = _seed(ws, n)
        ctx = ToolContext(workspace=ws, code=CodeIntel(Path(tmp) / "data"), shell_timeout=600)

        async def ask(tool: str, **args: object) -> float:
            t0 = time.perf_counter()
            await ALL_TOOLS[tool].run(ctx, dict(args))
            return time.perf_counter() - t0

        first = await ask("code_symbols", path="pkg0/m0.py")
        assert ctx.code is not None
        index = ctx.code.index(ws)
        assert index.last.parsed >= n, index.last
        queries = {
            "definition": ("code_definition", {"name": "helper"}),
            "references": ("code_references", {"name": "helper"}),
            "impact": ("code_impact", {"path_or_symbol": "helper", "depth": 2}),
            "symbols": ("code_symbols", {"path": "pkg1"}),
        }
        took = {
            label: statistics.median([await ask(tool, **args) for _ in range(RUNS)])
            for label, (tool, args) in queries.items()
        }
        assert index.last.parsed == 0
        rnd = random.Random(7)
        changed = []
        for _ in range(RUNS):
            _change(ws, n, rnd)
            changed.append(await ask("code_references", name="helper"))
            assert index.last.parsed >= n // 100, index.last
        grep = statistics.median(_grep(ws) for _ in range(RUNS))
        size = _du(Path(tmp) / "data" / "code_index")
        files, defs, uses = index.store.counts()
        ctx.code.close()
    langs = ", ".join(f"{v} {k}" for k, v in counts.items())
    slowest = max(took.values())
    after_change = statistics.median(changed)
    print(
        f"{n:>6} files ({langs}): first build {first:.2f} s "
        f"({files} files, {defs} definitions, {uses} uses; index {size / 1e6:.1f} MB) | "
        f"a question once built: "
        + ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in took.items())
        + f" | 1% changed, then references: {after_change * 1e3:.0f} ms | "
        f"grep -rn helper {grep * 1e3:.0f} ms: slowest question / grep {slowest / grep:.1f}x, "
        f"after a change / first build {after_change / first:.3f}x",
        flush=True,
    )


def main() -> None:
    sizes = [int(s) for s in os.environ.get("BENCH_CODE_SIZES", "1000,10000").split(",")]
    for n in sizes:
        asyncio.run(_one(n))


if __name__ == "__main__":
    main()
