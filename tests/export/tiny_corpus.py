"""A made-up parallel corpus in Multi30k's layout, for tests that split training pairs."""

from __future__ import annotations

from pathlib import Path


def write_corpus(folder: Path, count: int) -> Path:
    """`count` training pairs ("phrase i" / "sentence i") and a one-line val set."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.fr").write_text("".join(f"phrase {i}\n" for i in range(count)))
    (folder / "train.en").write_text("".join(f"sentence {i}\n" for i in range(count)))
    for lang in ("fr", "en"):
        (folder / f"val.{lang}").write_text("val\n")
    return folder
