"""What asking for the alignment costs: /v1/translate latency with and without it, side by side.

    python -m bench.alignment_latency

One server (the committed checkpoint's bundle, cache off so every request is decoded), one
client sending one-sentence requests one after the other. Each round sends the same sentence
in every variant, in a rotating order (so that drifting background load hits all alike):
no alignment; `return_alignment` (the last layer, head mean: what the service computed before
per-layer weights existed); `alignment_layer: 0`; and `alignment_heads: "all"`. Greedy and
beam 4. Reports medians, and each variant's median ratio to "no alignment" over the same
sentences. Writes the `alignment-latency` section of docs/attention.md.

A benchmark, not a test: it reports what it measured and asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx

from bench.harness import ensure_bundle, running_server
from bench.report import replace_section

ROOT = Path(__file__).resolve().parent.parent
REPORT = ROOT / "docs" / "attention.md"
MULTI30K_TEST = ROOT.parent / "shared" / "data" / "multi30k" / "test_2016_flickr.fr"
VARIANTS = {
    "no alignment": {},
    "return_alignment (last layer, head mean)": {"return_alignment": True},
    "alignment_layer 0": {"return_alignment": True, "alignment_layer": 0},
    'alignment_heads "all"': {"return_alignment": True, "alignment_heads": "all"},
}


def measure(url: str, sentences: list[str], beam: int) -> dict[str, list[float]]:
    """Seconds per request, by variant, in rounds over the sentences (rotating the order)."""
    names = list(VARIANTS)
    found: dict[str, list[float]] = {name: [] for name in names}
    with httpx.Client(base_url=url, timeout=60) as client:
        for round_number, sentence in enumerate(sentences):
            shift = round_number % len(names)
            for name in names[shift:] + names[:shift]:
                body = {"text": sentence, "source_lang": "fr", "target_lang": "en"}
                body |= {"beam_size": beam, **VARIANTS[name]}
                started = time.perf_counter()
                client.post("/v1/translate", json=body).raise_for_status()
                found[name].append(time.perf_counter() - started)
    return found


def report(results: dict[int, dict[str, list[float]]], count: int, load: str) -> str:
    lines = [
        "## What the alignment costs",
        "",
        "Reproduce: `.venv/bin/python -m bench.alignment_latency`",
        "",
        f"- when: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; machine: {platform.machine()}, "
        f"{os.cpu_count()} CPU cores, load average before the run {load}",
        f"- {count} one-sentence requests per variant and beam size (test_2016_flickr), one "
        "client, cache off; each sentence is sent in every variant in turn, rotating the order",
        "- latency measured by the client (HTTP included); ratio: the median over sentences of "
        "the variant's latency divided by the same sentence's without alignment",
        "",
        "| beam | variant | median ms | p90 ms | median ratio to no alignment |",
        "|---:|---|---:|---:|---:|",
    ]
    for beam, found in results.items():
        plain = found["no alignment"]
        for name, seconds in found.items():
            ordered = sorted(seconds)
            p90 = ordered[round(0.9 * (len(ordered) - 1))]
            ratio = statistics.median(a / b for a, b in zip(seconds, plain, strict=True))
            lines.append(
                f"| {beam} | {name} | {statistics.median(seconds) * 1000:.1f} | "
                f"{p90 * 1000:.1f} | {ratio:.2f}x |"
            )
    lines += [
        "",
        "Without `return_alignment` the engine asks the decoder graph for no attention output "
        "at all, so requests that do not ask pay nothing; with it, each step also copies the "
        "chosen layer's weights out, and the response carries the matrices.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sentences", type=int, default=100)
    parser.add_argument("--out", type=Path, default=REPORT)
    args = parser.parse_args()
    if MULTI30K_TEST.is_file():
        sentences = MULTI30K_TEST.read_text(encoding="utf-8").splitlines()[: args.sentences]
    else:
        sentences = ["Un homme en chemise bleue marche dans la rue."] * args.sentences
    load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    with (
        tempfile.TemporaryDirectory(prefix="nmt-alignment-") as logs,
        running_server(ensure_bundle(), Path(logs), cache_entries=0) as server,
    ):
        measure(server.url, sentences[:10], 1)  # warm-up
        results = {beam: measure(server.url, sentences, beam) for beam in (1, 4)}
    text = report(results, len(sentences), load)
    replace_section("alignment-latency", text, args.out)
    print(text)


if __name__ == "__main__":
    main()
