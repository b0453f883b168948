"""Corpus BLEU and chrF with sacrebleu: default tokenizer, cased, on detokenized text."""

from __future__ import annotations

import sacrebleu


def corpus_scores(hypotheses: list[str], references: list[str]) -> dict[str, float]:
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    return {
        "bleu": round(sacrebleu.corpus_bleu(hypotheses, [references]).score, 2),
        "chrf": round(sacrebleu.corpus_chrf(hypotheses, [references]).score, 2),
        "sentences": len(hypotheses),
    }
