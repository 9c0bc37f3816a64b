"""Gate: inside every crate, the modules form a tree.

For each pair of sibling modules (children of the same parent module), a
reference from anything inside one to anything inside the other is an edge
between the two siblings; the gate fails if these edges form a cycle at any
level, i.e. if some module uses a module that (directly or through others)
uses it back. References from a module to its own ancestors or descendants
(`super::Thing`, a parent using its child) are not sibling edges and are
allowed. References are read from `crate::`, `super::` and `self::` paths in
the source (use declarations and inline paths); comments and test-only code
(`#[cfg(test)]` modules) are ignored.

usage: python scripts/module_tree.py [CRATES_DIR]   (default: crates)
Exit status 1 with each cycle printed, 0 when every crate is a tree.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

MOD_DECL = re.compile(
    r"^([ \t]*#\[cfg\(test\)\]\s*)?[ \t]*(?:pub(?:\([^)]*\))?\s+)?mod\s+([a-z_][a-z0-9_]*)\s*;",
    re.MULTILINE,
)
# An inline test module runs to the end of its file by convention.
TEST_BODY = re.compile(r"#\[cfg\(test\)\]\s*mod\s+\w+\s*\{.*", re.DOTALL)
PATH = re.compile(r"\b(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")
GROUP = re.compile(r"\b(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)*)::\{")
COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)


def module_files(src: Path) -> dict[tuple[str, ...], Path]:
    """Every module of the crate rooted at src/lib.rs (or main.rs), by path."""
    root = src / "lib.rs"
    if not root.exists():
        root = src / "main.rs"
    mods: dict[tuple[str, ...], Path] = {}

    def walk(path: tuple[str, ...], file: Path, dir_: Path) -> None:
        mods[path] = file
        text = COMMENT.sub("", file.read_text())
        for test_only, name in MOD_DECL.findall(text):
            if test_only:
                continue  # test-only code is not part of the crate's graph
            for cand, sub in (
                (dir_ / f"{name}.rs", dir_ / name),
                (dir_ / name / "mod.rs", dir_ / name),
            ):
                if cand.exists():
                    walk((*path, name), cand, sub)
                    break

    walk((), root, src)
    return mods


def references(mods: dict[tuple[str, ...], Path]) -> dict[tuple[str, ...], set[tuple[str, ...]]]:
    """Module -> modules it names (resolved to the longest module prefix)."""
    out: dict[tuple[str, ...], set[tuple[str, ...]]] = {}
    for path, file in mods.items():
        text = TEST_BODY.sub("", COMMENT.sub("", file.read_text()))
        targets: set[tuple[str, ...]] = set()
        for m in [*PATH.finditer(text), *GROUP.finditer(text)]:
            kind, rest = m.group(1), [p for p in m.group(2).split("::") if p]
            if kind == "crate":
                base: tuple[str, ...] = ()
            elif kind == "self":
                base = path
            else:
                base = path[:-1]
                while rest and rest[0] == "super":
                    base, rest = base[:-1], rest[1:]
            full = (*base, *rest)
            best: tuple[str, ...] = ()
            for i in range(len(full), -1, -1):
                if tuple(full[:i]) in mods:
                    best = tuple(full[:i])
                    break
            targets.add(best)
        out[path] = targets
    return out


def cycles(refs: dict[tuple[str, ...], set[tuple[str, ...]]]) -> list[list[tuple[str, ...]]]:
    """Cycles among siblings, at every level."""
    edges: dict[tuple[str, ...], set[tuple[str, ...]]] = {}
    for a, targets in refs.items():
        for b in targets:
            n = 0
            while n < min(len(a), len(b)) and a[n] == b[n]:
                n += 1
            if n == len(a) or n == len(b):
                continue  # ancestor or descendant
            sa, sb = a[: n + 1], b[: n + 1]
            edges.setdefault(sa, set()).add(sb)
    # Tarjan's strongly connected components.
    index: dict[tuple[str, ...], int] = {}
    low: dict[tuple[str, ...], int] = {}
    stack: list[tuple[str, ...]] = []
    on: set[tuple[str, ...]] = set()
    found: list[list[tuple[str, ...]]] = []
    counter = [0]

    def visit(v: tuple[str, ...]) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in list(edges):
        if v not in index:
            visit(v)
    return found


def main() -> int:
    crates = Path(sys.argv[1] if len(sys.argv) > 1 else "crates")
    bad = 0
    for src in sorted(crates.glob("*/src")):
        mods = module_files(src)
        for comp in cycles(references(mods)):
            bad += 1
            names = ", ".join("::".join(p) for p in comp)
            print(f"{src.parent.name}: modules that use each other: {names}")
    if bad:
        return 1
    print(f"module tree: no cycles in {len(list(crates.glob('*/src')))} crates")
    return 0


if __name__ == "__main__":
    sys.exit(main())
