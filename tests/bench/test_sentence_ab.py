"""bench/sentence_ab.py plays two code trees' products against each other, sentence by
sentence, each in its own process running its own tree's code (a benchmark: its times are not
checked, only that both trees ran and what they translated was compared)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SENTENCES = [
    "Un homme fait du vélo dans la rue.",
    "Deux chiens jouent dans la neige.",
    "Une femme lit un livre sur un banc.",
]


def run(before: Path, bundle: Path, lines: Path) -> str:
    command = [sys.executable, "-m", "bench.sentence_ab", "--before-tree", str(before)]
    command += ["--bundle", str(bundle), "--lines", str(lines), "--sentences", "3"]
    command += ["--rounds", "1"]
    done = subprocess.run(command, cwd=ROOT, check=True, timeout=300, capture_output=True)
    return done.stdout.decode()


def rows(report: str) -> dict[str, tuple[float, float, str]]:
    found = re.findall(
        r"^\| (greedy|beam 4) \| ([0-9.]+) \| ([0-9.]+) \| [0-9.]+x \| (\d+ / 3) \|$", report, re.M
    )
    return {search: (float(a), float(b), same) for search, a, b, same in found}


def test_each_tree_translates_with_its_own_code(fr_en_bundle: Path, tmp_path: Path) -> None:
    lines = tmp_path / "lines.fr"
    lines.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")

    same_code = rows(run(ROOT, fr_en_bundle, lines))
    assert set(same_code) == {"greedy", "beam 4"}
    for before, after, same in same_code.values():
        assert before > 0 and after > 0
        assert same == "3 / 3"

    # A "before" tree whose search writes one token more than it found: every sentence differs.
    tree = tmp_path / "before"
    for part in ("service", "nmt_contract.py"):
        source = ROOT / part
        if source.is_dir():
            shutil.copytree(source, tree / part, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(source, tree / part)
    translator = tree / "service" / "runtime" / "translator.py"
    text = translator.read_text()
    marker = "                results[index] = hypotheses\n"
    assert marker in text
    changed = "                hypotheses[0].tokens.append(3)\n" + marker
    translator.write_text(text.replace(marker, changed))
    assert all(same == "0 / 3" for _, _, same in rows(run(tree, fr_en_bundle, lines)).values())
