"""Gate: the product carries no private history.

Comments, docstrings, scripts and docs state the rule itself for a reader who
has only this repository. They never cite a tracker number ("issue" and a
number), a numbered work-log heading ("session" and a number), a section
sign, or the path of a document outside the repository (the team's shared
specification and reference folders). This script scans every file git
knows in the repository (tracked, or untracked and not ignored) except the
results page, and prints ``path:line: text`` for each hit; it exits 1 if there
is any.

``ALLOWED`` lists exact (path, line text) pairs that must stay as they are,
for instance an upstream API name or message that happens to match.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

# The benchmark results page has its own history rules.
EXCLUDED = {"benchmarks/RESULTS.md"}

PATTERNS = [
    ("tracker reference", re.compile(r"\b[Ii]ssues? ?#?[0-9]+|\b[Ii]ssue-[0-9]+")),
    ("numbered log heading", re.compile(r"\b[Ss]essions? [0-9]+")),
    ("section sign", re.compile("\u00a7")),
    ("document outside the repository", re.compile(r"\bshared/(spec|reference)/")),
    (
        "spec section named instead of the rule",
        re.compile(
            r"\b(store|pg|engram|tensor|engine) spec\b|\bspec [A-Z][0-9]|\bspec [0-9]+\.[0-9]"
            r"|\bthe issue's\b"
        ),
    ),
]

# (path relative to the repository root, the stripped line) pairs allowed to match.
ALLOWED: set[tuple[str, str]] = set()


def repo_files(root: Path) -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        check=True,
        capture_output=True,
    ).stdout
    return sorted({p for p in out.decode().split("\0") if p})


def scan(root: Path, rel: str) -> list[str]:
    path = root / rel
    if rel in EXCLUDED or not path.is_file() or path.is_symlink():
        return []
    data = path.read_bytes()
    if b"\0" in data[:8192]:
        return []
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return []
    hits = []
    for no, line in enumerate(text.splitlines(), 1):
        for what, pattern in PATTERNS:
            if pattern.search(line) and (rel, line.strip()) not in ALLOWED:
                hits.append(f"{rel}:{no}: {what}: {line.strip()}")
                break
    return hits


def main() -> int:
    root = Path(__file__).resolve().parent.parent
    hits = [h for rel in repo_files(root) for h in scan(root, rel)]
    for h in hits:
        print(h)
    if hits:
        print(
            f"{len(hits)} line(s) cite private history: state the rule itself instead",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
