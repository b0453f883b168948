"""Preparation: the three forms of one checkpoint, and the sentences every engine gets."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from nmt_contract import BUNDLE_FORMAT, SHORTLIST_FILE, Shortlist, length_limit, sha256_of

MAX_LENGTH = 256  # the engine's default cap on output tokens
EXPORT = Path(__file__).resolve().parents[2] / "export"
EXPORTERS = ("onnx_export.py", "fused_step.py", "marian.py", "m2m100.py", "shortlist.py")
CT2_CONVERT = Path(__file__).with_name("ct2_convert.py")


def prepare(checkpoint: Path, work: Path) -> dict[str, Path]:
    """Bundle, Hugging Face directory and CTranslate2 model of one checkpoint (kept while it
    does not change: a stamp records the checksums of the weights they came from and of the
    exporters' code, and the bundle format). A Marian-shaped checkpoint becomes a Marian
    directory, which the stock `ct2-transformers-converter` converts. Any other (a pre-norm
    student) is converted to CTranslate2 straight from its weights
    (bench/compare/ct2_convert.py), and has a Hugging Face directory, so a transformers engine,
    only in M2M-100's layout (export/m2m100.py)."""
    from export.hf.common import InteropError
    from export.m2m100 import export_m2m100
    from export.marian import export_marian, is_marian_shaped
    from export.model.config import ModelConfig
    from export.onnx_export import export_bundle
    from export.shortlist import write_ctranslate2_vmap

    work.mkdir(parents=True, exist_ok=True)
    paths = {"bundle": work / "bundle", "hf": work / "hf", "ct2": work / "ct2"}
    stamp = work / "stamp.json"
    shortlist = checkpoint / SHORTLIST_FILE
    weights = {
        "checkpoint": str(checkpoint),
        "sha256": sha256_of(checkpoint / "model.safetensors"),
        "shortlist": sha256_of(shortlist) if shortlist.is_file() else None,
        "bundle_format": BUNDLE_FORMAT,
        "decoder": "fused",
        # What the exporters write can change within a format (a new optional graph): their
        # code is part of what the bundle came from.
        "exporters": {name: sha256_of(EXPORT / name) for name in EXPORTERS},
        "ct2_convert": sha256_of(CT2_CONVERT),
    }
    old = json.loads(stamp.read_text()) if stamp.is_file() else {}
    made = old.pop("made", [])
    if old == weights and made and all(name in paths and paths[name].exists() for name in made):
        return {name: paths[name] for name in made}
    stamp.unlink(missing_ok=True)
    shutil.rmtree(paths["hf"], ignore_errors=True)
    print(f"preparing {work}: ONNX bundle, Hugging Face directory, CTranslate2 model", flush=True)
    export_bundle(checkpoint, paths["bundle"], int8=True)
    vmap = None
    if shortlist.is_file():  # the same shortlist as CTranslate2's vocabulary map (use_vmap)
        vmap = work / "vmap.txt"
        write_ctranslate2_vmap(Shortlist.load(shortlist), pieces_by_our_id(checkpoint), vmap)
    if is_marian_shaped(ModelConfig.from_json(checkpoint / "config.json")):
        export_marian(checkpoint, paths["hf"])
        converter = Path(sys.executable).with_name("ct2-transformers-converter")
        command = [converter, "--model", paths["hf"], "--output_dir", paths["ct2"], "--force"]
        if vmap is not None:
            command += ["--vocab_mapping", vmap]
        converted = subprocess.run(command, capture_output=True, text=True)
        if converted.returncode:
            raise SystemExit(f"ct2-transformers-converter failed:\n{converted.stderr[-2000:]}")
    else:
        from bench.compare.ct2_convert import convert

        convert(checkpoint, paths["ct2"], vmap)
        try:
            export_m2m100(checkpoint, paths["hf"])
        except InteropError as error:
            print(f"{error}: no transformers engine", flush=True)
            del paths["hf"]
    stamp.write_text(json.dumps(weights | {"made": sorted(paths)}) + "\n")
    return paths


def pieces_by_our_id(checkpoint: Path) -> list[str]:
    """The piece of each of our ids: how CTranslate2's vocabulary (either conversion) and the
    Marian directory's vocab.json name our words."""
    from export.checkpoint import load_tokenizer
    from export.marian import pieces_of
    from export.model.config import ModelConfig

    config = ModelConfig.from_json(checkpoint / "config.json")
    return pieces_of(load_tokenizer(checkpoint), config.vocab_size)


def load_sources(bundle: Path, data: Path, count: int | None) -> tuple[list[str], list[list[int]]]:
    """The first `count` lines (all when None), tokenized by the bundle's own tokenizer."""
    from service.runtime.bundle import load_bundle
    from service.runtime.tokenizer import BundleTokenizer

    lines = data.read_text(encoding="utf-8").splitlines()
    lines = lines[:count] if count else lines
    return lines, BundleTokenizer(load_bundle(bundle)).encode(lines)


def by_length(
    sources: list[list[int]], max_positions: int
) -> tuple[list[int], list[list[int]], list[int]]:
    """Sources sorted by length, so that a batch holds alike lengths and splits into few groups
    of equal limit: (the order, the sorted sources, each one's length limit)."""
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    ordered = [sources[i] for i in order]
    return order, ordered, [length_limit(len(s), MAX_LENGTH, max_positions) for s in ordered]


def id_maps(checkpoint: Path) -> dict:
    """Our ids -> the Hugging Face directory's ids (a Marian directory moves <pad> to the end;
    an M2M-100 one keeps our ids), and our pieces."""
    from export.marian import is_marian_shaped, our_ids_to_marian
    from export.model.config import ModelConfig

    config = ModelConfig.from_json(checkpoint / "config.json")
    marian = is_marian_shaped(config)
    return {
        "to_hf": our_ids_to_marian(config) if marian else list(range(config.vocab_size)),
        "pieces": pieces_by_our_id(checkpoint),
        "max_positions": config.max_positions,
    }


def pad_norm(checkpoint: Path) -> float:
    """The norm of the `<pad>` embedding, where the decoder starts (CTranslate2 starts at 0)."""
    from safetensors import safe_open

    from export.model.config import ModelConfig

    config = ModelConfig.from_json(checkpoint / "config.json")
    with safe_open(str(checkpoint / "model.safetensors"), "np") as weights:
        row = weights.get_slice("embed_tokens.weight")[config.pad_id]
    return float((row.astype("float64") ** 2).sum() ** 0.5)


def before_jobs(tree: Path, checkpoint: Path, work: Path, template: dict) -> list[dict]:
    """Jobs that time ours fp32 and int8 as another checkout has them (`--before-tree`): its
    exporter writes its bundle (again only when its commit changed), and its own worker runs
    it (`job["tree"]`), on the same sentences and runs as `template`'s."""
    tree = tree.resolve()
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=tree, capture_output=True, text=True, check=True
    ).stdout.strip()
    bundle = work / "before-bundle"
    stamp = work / "before-bundle.commit"
    if not (bundle / "bundle.json").is_file() or not stamp.is_file() or stamp.read_text() != commit:
        print(f"exporting the bundle of {tree} ({commit[:12]})", flush=True)
        command = [sys.executable, "-m", "nmt_cli", "export", "--int8"]
        command += ["--checkpoint", str(checkpoint.resolve()), "--out", str(bundle.resolve())]
        subprocess.run(command, cwd=tree, check=True)
        stamp.write_text(commit)
    jobs = []
    for int8 in (False, True):
        name = f"ours {'int8' if int8 else 'fp32'} (before)"
        # "cache": the spec key of runners older than one cache layout
        spec = {"engine": "ours", "int8": int8, "cache": True}
        paths = {k: str(Path(v).resolve()) for k, v in template["paths"].items()}
        paths["bundle"] = str(bundle.resolve())
        jobs.append({**template, "name": name, "spec": spec, "paths": paths, "tree": str(tree)})
    return jobs
