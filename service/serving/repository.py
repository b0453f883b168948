"""The model repository on disk (NMT_MODEL_DIR), read as files: which models it holds and which
of their versions a version policy selects. Loading them is the registry's job (registry.py).

    NMT_MODEL_DIR/<name>/<version>/bundle.json    a versioned model (versions are integers)
    NMT_MODEL_DIR/<name>/bundle.json              an unversioned model
    NMT_MODEL_DIR/bundle.json                     a single bundle: the whole repository

As in Triton's model repository, the folder's name is the model's name, and a new version is a
new folder beside the old ones: copy it in complete (or under another name, then rename it:
a rename is atomic), then ask the server to load it (`POST /v1/models/<name>/load`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from service.runtime.bundle import BundleError

MANIFEST = "bundle.json"


@dataclass(frozen=True)
class VersionPolicy:
    """Which versions of a model to serve, as Triton's `version_policy`:
    `latest` (the newest version that loads), `latest:N` (the N newest that load), `all`, or
    `specific:1,3` (exactly those). Requests go to the newest version loaded."""

    kind: str  # "latest", "all" or "specific"
    count: int = 1  # for latest
    versions: tuple[int, ...] = ()  # for specific

    @classmethod
    def parse(cls, text: str) -> VersionPolicy:
        text = text.strip().lower()
        if text == "all":
            return cls("all")
        if text == "latest":
            return cls("latest", 1)
        if match := re.fullmatch(r"latest:(\d+)", text):
            count = int(match.group(1))
            if count >= 1:
                return cls("latest", count)
        if match := re.fullmatch(r"specific:(\d+(?:,\d+)*)", text):
            return cls("specific", versions=tuple(sorted({int(v) for v in match[1].split(",")})))
        raise ValueError(
            f"version policy {text!r}: use latest, latest:N (N >= 1), all or specific:1,3"
        )

    def __str__(self) -> str:
        if self.kind == "latest":
            return "latest" if self.count == 1 else f"latest:{self.count}"
        if self.kind == "specific":
            return "specific:" + ",".join(map(str, self.versions))
        return self.kind

    def candidates(self, versions: list[int]) -> list[int]:
        """The versions to try, newest first. For `latest:N` that is all of them: the registry
        takes the N newest that load, so a broken newest version leaves the one before it
        serving."""
        ordered = sorted(versions, reverse=True)
        if self.kind == "specific":
            return [v for v in ordered if v in self.versions]
        return ordered

    @property
    def wanted(self) -> int | None:
        """How many of the candidates should load (None: every one)."""
        return self.count if self.kind == "latest" else None


@dataclass(frozen=True)
class ModelEntry:
    """One model of the repository: its folder and its versions' bundle folders."""

    name: str
    path: Path
    versions: dict[int | None, Path]  # None: an unversioned model (a bundle in its folder)


class ModelRepository:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def scan(self) -> dict[str, ModelEntry]:
        """Every model in the repository, by name. Raises BundleError when the folder is missing
        or holds nothing that looks like a model."""
        root = self.root
        if (root / MANIFEST).is_file():
            return {(entry := self._single()).name: entry}
        if not root.is_dir():
            raise BundleError(
                f"NMT_MODEL_DIR={root} does not exist: export a model there first, e.g. "
                f"`nmt export --checkpoint models/fr-en --out {root}/fr-en/1`"
            )
        found = {}
        for folder in sorted(p for p in root.iterdir() if p.is_dir()):
            if entry := self._entry(folder):
                found[entry.name] = entry
        if not found:
            raise BundleError(
                f"no bundle under NMT_MODEL_DIR={root} (no <name>/bundle.json or "
                f"<name>/<version>/bundle.json): export one with "
                f"`nmt export --checkpoint models/fr-en --out {root}/fr-en/1`"
            )
        return found

    def entry(self, name: str) -> ModelEntry | None:
        """One model, read again from disk (None when it is not there, or not a model)."""
        if (self.root / MANIFEST).is_file():
            single = self._single()
            return single if single.name == name else None
        if "/" in name or name in (".", ".."):
            return None
        folder = self.root / name
        try:
            if not folder.is_dir():
                return None
        except OSError:  # a name no folder can have (too long for the file system): no model
            return None
        return self._entry(folder)

    def _single(self) -> ModelEntry:
        """NMT_MODEL_DIR is itself a bundle: a model named as its bundle.json says."""
        return ModelEntry(_manifest_name(self.root), self.root, {None: self.root})

    @staticmethod
    def _entry(folder: Path) -> ModelEntry | None:
        if (folder / MANIFEST).is_file():
            return ModelEntry(folder.name, folder, {None: folder})
        versions: dict[int | None, Path] = {
            int(child.name): child
            for child in folder.iterdir()
            if child.is_dir() and child.name.isdigit() and (child / MANIFEST).is_file()
        }
        return ModelEntry(folder.name, folder, versions) if versions else None

    def fingerprint(self) -> dict[str, tuple]:
        """What a repository watch compares: per model, its versions and when each version's
        bundle.json last changed (a re-export rewrites it last)."""
        try:
            models = self.scan()
        except BundleError:
            return {}
        return {
            name: tuple(
                sorted(
                    ((-1 if v is None else v), _mtime(path / MANIFEST))
                    for v, path in entry.versions.items()
                )
            )
            for name, entry in models.items()
        }


def _manifest_name(path: Path) -> str:
    try:
        return str(json.loads((path / MANIFEST).read_text())["name"])
    except (OSError, ValueError, KeyError, TypeError):
        return path.name


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
