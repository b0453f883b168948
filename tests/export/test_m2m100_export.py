"""`nmt export-hf` of a model trained in M2M-100's layout: transformers loads the directory with
its Auto classes (M2M100ForConditionalGeneration, MarianTokenizer), reads a source as we do,
computes our logits, and its `generate` finds our greedy and beam-4 translations."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers", reason="needs the bench extra")

from export.checkpoint import load_model_dir  # noqa: E402
from export.decoding import beam_search, greedy_search  # noqa: E402
from export.train import run_training  # noqa: E402
from nmt_cli import main  # noqa: E402
from nmt_contract import length_limit  # noqa: E402
from tests.export.test_marian import GENERATE_LIKE_OURS  # noqa: E402
from tests.export.test_training import toy_config  # noqa: E402


@pytest.fixture(scope="module")
def m2m100_layout_model(reverse_corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A toy model trained as a student would be for M2M-100's layout; trained a little, so
    that it ends its outputs at varied lengths by itself (M2M-100 has no output bias with which
    a random model could be made to)."""
    folder = tmp_path_factory.mktemp("m2m100-layout")
    config = toy_config(
        reverse_corpus, max_steps=120, pre_norm=True, positions="sinusoidal_offset",
        decoder_start="eos",
    )  # fmt: skip
    run_training(config, folder / "run", folder / "model", show_progress=False)
    return folder / "model"


@pytest.fixture(scope="module")
def exported(m2m100_layout_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("hf") / "m2m100"
    assert main(["export-hf", "--checkpoint", str(m2m100_layout_model), "--out", str(out)]) == 0
    return out


def test_transformers_reads_sources_as_we_do_and_computes_our_logits(
    m2m100_layout_model: Path, exported: Path, reverse_corpus: Path
) -> None:
    hf = transformers.AutoModelForSeq2SeqLM.from_pretrained(exported).eval()
    assert type(hf).__name__ == "M2M100ForConditionalGeneration"
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(exported)
    ours, tokenizer = load_model_dir(m2m100_layout_model)
    texts = (reverse_corpus / "val.src").read_text().splitlines()[:8]
    sources = [tokenizer.encode(t) for t in texts]
    assert [hf_tokenizer(t).input_ids for t in texts] == sources  # pieces, then </s>
    pad = ours.config.pad_id
    width = max(map(len, sources))
    ids = torch.tensor([s + [pad] * (width - len(s)) for s in sources])
    generator = torch.Generator().manual_seed(3)
    target = torch.randint(3, ours.config.vocab_size, (len(sources), 7), generator=generator)
    target[:, 0] = ours.config.decoder_start_id  # </s>
    with torch.no_grad():
        expected = ours(ids, ids != pad, target)
        got = hf(input_ids=ids, attention_mask=(ids != pad).long(), decoder_input_ids=target)
    assert (got.logits - expected).abs().max() <= 1e-4


@pytest.mark.parametrize("beam", [1, 4])
def test_generate_finds_our_translations_token_for_token(
    m2m100_layout_model: Path, exported: Path, reverse_corpus: Path, beam: int
) -> None:
    hf = transformers.AutoModelForSeq2SeqLM.from_pretrained(exported).eval()
    ours, tokenizer = load_model_dir(m2m100_layout_model)
    ours.eval()
    lengths = set()
    for text in (reverse_corpus / "val.src").read_text().splitlines()[:24]:
        source = torch.tensor([tokenizer.encode(text)])
        mask = source != ours.config.pad_id
        limit = length_limit(source.shape[1], 256, ours.config.max_positions)
        with torch.no_grad():
            if beam == 1:
                expected = greedy_search(ours, source, mask)[0].tokens
            else:
                expected = beam_search(ours, source, mask, beam)[0][0].tokens
            out = hf.generate(
                input_ids=source, attention_mask=mask.long(), num_beams=beam,
                max_new_tokens=limit, **GENERATE_LIKE_OURS,
            )  # fmt: skip
        produced = out[0, 1:].tolist()  # without the decoder start (</s>)
        assert produced[-1] == ours.config.eos_id
        assert produced[:-1] == expected, text
        lengths.add(len(produced))
    assert len(lengths) >= 4, lengths  # ended by the model, at varied lengths


def test_the_directory_says_what_it_is(exported: Path) -> None:
    config = json.loads((exported / "config.json").read_text())
    assert config["model_type"] == "m2m_100"
    assert config["decoder_start_token_id"] == config["eos_token_id"]
    tokenizer_config = json.loads((exported / "tokenizer_config.json").read_text())
    assert tokenizer_config["tokenizer_class"] == "MarianTokenizer"


def test_a_model_in_neither_layout_is_refused_saying_why(
    reverse_corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    config = toy_config(reverse_corpus, max_steps=1, pre_norm=True)  # Marian's positions
    run_training(config, tmp_path / "run", tmp_path / "model", show_progress=False)
    assert (
        main(["export-hf", "--checkpoint", str(tmp_path / "model"), "--out", str(tmp_path / "hf")])
        == 2
    )
    error = capsys.readouterr().err
    assert "not in M2M-100's layout" in error
    assert "positions='sinusoidal'" in error and "</s>" in error
    assert not (tmp_path / "hf").exists()


def test_importing_the_export_gives_back_the_same_model(
    m2m100_layout_model: Path, exported: Path, reverse_corpus: Path, tmp_path: Path
) -> None:
    assert main(["import-hf", "--hf-dir", str(exported), "--out", str(tmp_path / "back")]) == 0
    ours, tokenizer = load_model_dir(m2m100_layout_model)
    back, back_tokenizer = load_model_dir(tmp_path / "back")
    assert back.config == ours.config
    texts = (reverse_corpus / "val.src").read_text().splitlines()[:6]
    sources = [tokenizer.encode(t) for t in texts]
    assert [back_tokenizer.encode(t) for t in texts] == sources
    width = max(map(len, sources))
    ids = torch.tensor([s + [0] * (width - len(s)) for s in sources])
    target = torch.full((len(sources), 5), 7)
    target[:, 0] = ours.config.decoder_start_id
    with torch.no_grad():
        assert torch.equal(back(ids, ids != 0, target), ours(ids, ids != 0, target))
