"""How big the product is, counted the same way for any checkout (the redesign's before/after).

    python -m bench.counts                      # this checkout
    python -m bench.counts /tmp/before          # another one (e.g. `git worktree add`)

Counts, from the files alone (nothing is imported, so any commit can be counted):
* lines of `service/`, `bench/` and `docs/` (Python and Markdown files, as `wc -l`);
* settings: the fields of `Settings` in service/serving/settings.py (each an `NMT_*`);
* classes on the decoding path: every class defined in service/runtime/, and in the modules
  of service/serving/ that queue and decode sentences (the waiting queue, the loop, admission;
  under their names before and after the serving split).
"""

from __future__ import annotations

import argparse
import ast
import json
from pathlib import Path

# The serving modules a sentence passes through between a request and the engine, under
# every name they have had.
DECODING_SERVING_MODULES = (
    "scheduler.py",
    "continuous.py",
    "queue.py",
    "loop.py",
    "observer.py",
    "admission.py",
)


def lines(folder: Path) -> int:
    return sum(
        len(path.read_text(encoding="utf-8", errors="replace").splitlines())
        for pattern in ("*.py", "*.md")
        for path in folder.rglob(pattern)
    )


def settings_count(settings: Path) -> int:
    tree = ast.parse(settings.read_text())
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "Settings":
            return sum(isinstance(item, ast.AnnAssign) for item in node.body)
    raise SystemExit(f"{settings}: no class Settings")


def classes_in(paths: list[Path]) -> list[str]:
    found = []
    for path in paths:
        tree = ast.parse(path.read_text())
        found += [
            f"{path.stem}.{node.name}" for node in ast.walk(tree) if isinstance(node, ast.ClassDef)
        ]
    return sorted(found)


def count(root: Path) -> dict:
    runtime = sorted((root / "service" / "runtime").glob("*.py"))
    serving = [root / "service" / "serving" / name for name in DECODING_SERVING_MODULES]
    classes = classes_in(runtime + [path for path in serving if path.is_file()])
    return {
        "lines": {name: lines(root / name) for name in ("service", "bench", "docs")},
        "settings": settings_count(root / "service" / "serving" / "settings.py"),
        "decoding_classes": len(classes),
        "classes": classes,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.counts", description=__doc__)
    parser.add_argument("root", nargs="?", type=Path, default=Path("."))
    parser.add_argument("--classes", action="store_true", help="also list the classes")
    args = parser.parse_args(argv)
    result = count(args.root)
    if not args.classes:
        result.pop("classes")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
