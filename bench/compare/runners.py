"""The engines: one runner class each, all translating our token ids into our token ids.

A runner is built from a job (see `worker.make_job`) inside the engine's own process, and
imports its engine only there, so that the parent process never loads any of them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

# Every configuration in the table, in order. "ours" fp32 with the cache is the reference.
ENGINES = {
    "ours fp32": {"engine": "ours", "int8": False},
    "ours int8": {"engine": "ours", "int8": True},
    # The vocabulary shortlist (opt-in; needs CHECKPOINT/shortlist.npz, `nmt shortlist`).
    "ours int8 shortlist": {"engine": "ours", "int8": True, "shortlist": True},
    "ctranslate2 fp32": {"engine": "ctranslate2", "compute_type": "float32"},
    "ctranslate2 int8": {"engine": "ctranslate2", "compute_type": "int8"},
    # Its default patience: it stops a beam search earlier than ours (and Hugging Face's) rule,
    # so it does less work; shown for what a user running it as shipped gets.
    "ctranslate2 int8 patience 1": {
        "engine": "ctranslate2",
        "compute_type": "int8",
        "patience": 1.0,
    },
    # The same shortlist as its vocabulary map (converted with --vocab_mapping, use_vmap).
    "ctranslate2 int8 vmap": {"engine": "ctranslate2", "compute_type": "int8", "vmap": True},
    "transformers fp32": {"engine": "transformers"},
}
REFERENCE = "ours fp32"


def needs_hf(name: str) -> bool:
    """Whether the engine reads the checkpoint's Hugging Face directory (Marian-shaped ones and
    those in M2M-100's layout have one: bench/compare/prepare.py)."""
    return ENGINES[name]["engine"] == "transformers"


SEARCHES = ((1, 1), (1, 32), (4, 1), (4, 32))  # (beam, batch): the table's columns


class Runner(Protocol):
    def translate(self, sources: list[list[int]], beam: int, limit: int) -> list[list[int]]:
        """Best hypothesis of each source, without </s>; `limit` caps its length."""
        ...


class OursRunner:
    def __init__(self, job: dict) -> None:
        from service.runtime.bundle import load_bundle
        from service.runtime.sessions import EngineOptions
        from service.runtime.translator import Translator

        spec = job["spec"]
        options = EngineOptions(
            int8=spec["int8"],
            intra_op_threads=job["threads"],
            shortlist=spec.get("shortlist", False),
            profile_prefix=job.get("profile_prefix", ""),
        )
        self.translator = Translator(load_bundle(job["paths"]["bundle"]), options)

    def translate(self, sources: list[list[int]], beam: int, limit: int) -> list[list[int]]:
        from service.runtime.search import SearchOptions

        # The engine derives each sentence's limit from its length; `limit` is the same rule.
        found = self.translator.translate_ids(sources, SearchOptions(beam_size=beam), len(sources))
        return [h[0].tokens for h in found]


class CTranslate2Runner:
    def __init__(self, job: dict) -> None:
        import ctranslate2

        self.translator = ctranslate2.Translator(
            job["paths"]["ct2"],
            device="cpu",
            compute_type=job["spec"]["compute_type"],
            intra_threads=job["threads"],
            inter_threads=1,
        )
        self.patience = job["spec"].get("patience", 2.0)
        self.vmap = job["spec"].get("vmap", False)
        self.pieces = job["maps"]["pieces"]  # by our id: CTranslate2 looks words up by piece
        self.our_id = {piece: i for i, piece in enumerate(self.pieces)}

    def translate(self, sources: list[list[int]], beam: int, limit: int) -> list[list[int]]:
        results = self.translator.translate_batch(
            [[self.pieces[i] for i in source] for source in sources],
            beam_size=beam,
            length_penalty=1.0,
            max_decoding_length=limit,
            min_decoding_length=0,  # ours may end at once too
            # CTranslate2 stops a sentence once beam_size * patience hypotheses have finished;
            # with its default (1) it stops earlier than Hugging Face's rule, which ours follows,
            # and returns shorter translations on some lines (docs/interop.md has the count).
            # With 2 it searches as far as ours: the parity section of `python -m bench.compare`
            # checks it.
            patience=self.patience,
            use_vmap=self.vmap,
        )
        return [[self.our_id[p] for p in r.hypotheses[0]] for r in results]


class TransformersRunner:
    def __init__(self, job: dict) -> None:
        import torch
        from transformers import AutoModelForSeq2SeqLM

        torch.set_num_threads(job["threads"])
        self.torch = torch
        # MarianMTModel, or M2M100ForConditionalGeneration (export/m2m100.py)
        self.model = AutoModelForSeq2SeqLM.from_pretrained(job["paths"]["hf"]).eval()
        self.to_hf = torch.tensor(job["maps"]["to_hf"])
        self.from_hf = torch.argsort(self.to_hf)
        self.pad = self.model.config.pad_token_id
        self.eos = self.model.config.eos_token_id

    def translate(self, sources: list[list[int]], beam: int, limit: int) -> list[list[int]]:
        torch = self.torch
        width = max(len(s) for s in sources)
        ids = torch.full((len(sources), width), self.pad, dtype=torch.long)
        for row, source in enumerate(sources):
            ids[row, : len(source)] = self.to_hf[torch.tensor(source)]
        with torch.inference_mode():
            out = self.model.generate(
                input_ids=ids,
                attention_mask=(ids != self.pad).long(),
                num_beams=beam,
                max_new_tokens=limit,
                do_sample=False,
                length_penalty=1.0,
                early_stopping=False,
                forced_eos_token_id=None,  # MarianConfig's default would force </s> at the limit
            )
        found = []
        for row in out[:, 1:].tolist():  # drop the decoder start token
            tokens = row[: row.index(self.eos)] if self.eos in row else row
            found.append([int(self.from_hf[t]) for t in tokens if t != self.pad])
        return found


RUNNERS: dict[str, Callable[[dict], Runner]] = {
    "ours": OursRunner,
    "ctranslate2": CTranslate2Runner,
    "transformers": TransformersRunner,
}
