"""Same weights, same translations? Beam 4, each sentence with its own length limit, token for
token against ours (the "compare-parity" section)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from bench.compare.prepare import by_length, id_maps, load_sources, prepare
from bench.compare.runners import REFERENCE, needs_hf
from bench.compare.worker import make_job, spawn

PARITY_ENGINES = ("ours fp32", "transformers fp32", "ctranslate2 fp32")


def differences(
    results: dict[str, dict], lines: list[str], decode: Callable[[list[int]], str]
) -> dict:
    """Each engine's beam-4 outputs against ours, line by line."""
    ours = results[REFERENCE]["runs"][0]["outputs"]
    report = {}
    for name, result in results.items():
        if name == REFERENCE:
            continue
        theirs = result["runs"][0]["outputs"]
        found = [
            {"line": i + 1, "source": lines[i], "ours": decode(a), name: decode(b)}
            for i, (a, b) in enumerate(zip(ours, theirs, strict=True))
            if a != b
        ]
        report[name] = {
            "equal": len(ours) - len(found),
            "total": len(ours),
            "share": (len(ours) - len(found)) / len(ours),
            "differences": found,
        }
    return report


def run_parity(
    checkpoint: Path, data: Path, work: Path, threads: int, count: int | None = None
) -> dict:
    """Beam 4 on every line (or the first `count`): ours, transformers and CTranslate2."""
    from service.runtime.bundle import load_bundle
    from service.runtime.tokenizer import BundleTokenizer

    paths = prepare(checkpoint, work)
    lines, sources = load_sources(paths["bundle"], data, count)
    maps = id_maps(checkpoint)
    order, sources, limits = by_length(sources, maps["max_positions"])
    runs = [{"beam": 4, "batch": 32, "repeat": 1, "exact_limits": True}]
    results = {}
    for name in PARITY_ENGINES:
        if needs_hf(name) and "hf" not in paths:
            continue  # (no Hugging Face form: no transformers class holds it)
        result = spawn(make_job(name, paths, threads, maps, sources, limits, runs), work)
        outputs = result["runs"][0]["outputs"]
        restored: list[list[int]] = [[] for _ in outputs]
        for position, index in enumerate(order):
            restored[index] = outputs[position]
        result["runs"][0]["outputs"] = restored  # back in line order
        results[name] = result
    tokenizer = BundleTokenizer(load_bundle(paths["bundle"]))
    report = differences(results, lines, tokenizer.decode)
    return {"data": str(data), "lines": len(lines), "engines": report}


def parity_markdown(result: dict, command: str, pad_norm: float | None) -> str:
    lines = [
        "## Same weights, same translations: ours vs transformers vs CTranslate2",
        "",
        f"Reproduce: `{command}`",
        "",
        f"Beam 4, length penalty 1, {result['lines']} lines of `{Path(result['data']).name}`; "
        "every engine gets each sentence's own length limit; outputs compared token for token.",
        "",
        "| engine | lines equal to ours | share |",
        "|---|---|---|",
    ]
    for name, r in result["engines"].items():
        lines.append(f"| {name} | {r['equal']} / {r['total']} | {r['share']:.2%} |")
    if pad_norm:
        lines += [
            "",
            f"Note: this checkpoint's `<pad>` embedding is not zero (norm {pad_norm:.3g}). "
            "transformers and our engine start decoding from it (the decoder start token is "
            "<pad>); CTranslate2's Marian converter starts from a zero vector (Marian's own "
            "convention), so its translations can differ. A model trained with the `<pad>` row "
            "kept at zero is translated identically by all three.",
        ]
    for name, r in result["engines"].items():
        if not r["differences"]:
            continue
        shown = r["differences"][:20]
        lines += ["", f"### Differences: {name} ({len(r['differences'])}, first {len(shown)})", ""]
        for d in shown:
            lines += [
                f"- line {d['line']}: {d['source']}",
                f"  - ours: {d['ours']}",
                f"  - {name}: {d[name]}",
            ]
    return "\n".join(lines)
