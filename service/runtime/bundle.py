"""Reading an exported bundle, and refusing one whose files do not match `bundle.json`."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from nmt_contract import BUNDLE_FORMAT, Languages, sha256_of


class BundleError(Exception):
    """The bundle is missing, incomplete, altered or of an unknown format."""


@dataclass(frozen=True)
class Bundle:
    path: Path
    manifest: dict

    @property
    def name(self) -> str:
        return self.manifest["name"]

    @property
    def source_lang(self) -> str:
        return self.manifest["source_lang"]

    @property
    def target_lang(self) -> str:
        return self.manifest["target_lang"]

    @property
    def description(self) -> str:
        """What the model was trained on and is for ("" in bundles exported without one)."""
        return str(self.manifest.get("description") or "")

    @property
    def dims(self) -> dict:
        return self.manifest["model"]

    @property
    def vocab_sizes(self) -> tuple[int, int]:
        """(source, target): the ids the encoder reads and the decoder writes."""
        target = self.dims["vocab_size"]
        return self.dims.get("source_vocab_size", target), target

    @property
    def special_ids(self) -> dict:
        return self.manifest["special_ids"]

    @property
    def has_int8(self) -> bool:
        return bool(self.manifest.get("int8"))

    @property
    def force_eos_at_limit(self) -> bool:
        """A sentence that reaches its length limit ends with </s> (Hugging Face's
        forced_eos_token_id, kept from an imported Marian model)."""
        return bool(self.manifest.get("decoding", {}).get("force_eos_at_limit", False))

    @property
    def languages(self) -> Languages | None:
        """A multilingual bundle's languages and how a sentence names them (language tokens:
        nmt_contract.Languages); None for a bilingual bundle, whose pair is source_lang and
        target_lang. A multilingual bundle's source_lang and target_lang are its default pair."""
        section = self.manifest.get("languages")
        return Languages.from_manifest(section) if section else None

    def graph(self, role: str, int8: bool = False) -> Path:
        """Path of a graph ("encoder", "decoder", "decoder_shortlist"), fp32 or int8."""
        if role not in self.manifest["graphs"]:
            raise BundleError(f"{self.path} has no {role} graph: re-export it with `nmt export`")
        name = self.manifest["graphs"][role]
        if int8:
            if not self.has_int8:
                raise BundleError(f"{self.path} has no int8 graphs: export it with --int8")
            name = name.removesuffix(".onnx") + ".int8.onnx"
        return self.path / name

    @property
    def has_shortlist(self) -> bool:
        """Exported from a model directory with a vocabulary shortlist (`nmt shortlist`)."""
        return "shortlist" in self.manifest and "decoder_shortlist" in self.manifest["graphs"]

    def shortlist_files(self, int8: bool = False) -> tuple[Path, list[Path]]:
        """The shortlist (nmt_contract.Shortlist) and the output projection's files: [D, V]
        float (.npy), or for the int8 step the int8 [D, V] and its column scales [V]."""
        if not self.has_shortlist:
            raise BundleError(
                f"{self.path} has no vocabulary shortlist: build one with `nmt shortlist` "
                "and re-export the model"
            )
        entry = self.manifest["shortlist"]
        keys = ["projection_int8", "projection_scale"] if int8 else ["projection"]
        if not all(key in entry for key in keys):
            raise BundleError(
                f"{self.path} has no int8 output projection for its shortlist: it was "
                "exported by an older `nmt export`, or without --int8; re-export it"
            )
        return self.path / entry["file"], [self.path / entry[key] for key in keys]

    def tokenizer_file(self, side: str) -> Path:
        return self.path / self.manifest["tokenizer"][side]

    @property
    def tokenizer_files(self) -> dict[str, Path]:
        """Each tokenizer role ("source", "target", "vocab", ...) and its file."""
        return {side: self.tokenizer_file(side) for side in self.manifest["tokenizer"]}


def load_bundle(path: Path, verify: bool = True) -> Bundle:
    """Read `bundle.json` and check every file it lists against its checksum."""
    path = Path(path)
    manifest_path = path / "bundle.json"
    if not manifest_path.is_file():
        raise BundleError(f"{path} is not a bundle: bundle.json is missing (run `nmt export`)")
    try:
        manifest = json.loads(manifest_path.read_text())
    except json.JSONDecodeError as error:
        raise BundleError(f"{manifest_path} is not valid JSON: {error}") from error
    if manifest.get("format") != BUNDLE_FORMAT:
        raise BundleError(
            f"{manifest_path} has format {manifest.get('format')!r}; "
            f"this service reads format {BUNDLE_FORMAT}: re-export the bundle"
        )
    if verify:
        problems = []
        for name, expected in manifest["files"].items():
            file = path / name
            if not file.is_file():
                problems.append(f"{name} is missing")
            elif (found := sha256_of(file)) != expected:
                problems.append(
                    f"{name} has checksum {found[:12]}…, bundle.json says {expected[:12]}…"
                )
        if problems:
            raise BundleError(
                f"bundle {path} does not match its bundle.json: {'; '.join(problems)}. "
                "Re-export it with `nmt export`."
            )
    return Bundle(path, manifest)
