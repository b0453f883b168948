"""`nmt import-hf`: M2M-100, NLLB (both placements of the source language), mBART-50 and Marian
tc-big models, built here (tests/export/hf_families.py), become our model directory. Our
tokenizer gives their tokenizer's ids; our torch model gives their logits and decodes like
`transformers` `generate`, token for token (greedy and beam 4, the target language forced
first), in three directions of one model.

The ONNX bundle on the runtime is held to the same: tests/runtime/test_family_parity.py.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers", reason="needs the bench extra")

from export.checkpoint import load_model_dir  # noqa: E402
from export.decoding import beam_search, greedy_search  # noqa: E402
from export.hf import InteropError, import_hf  # noqa: E402
from export.model.config import ModelConfig  # noqa: E402
from nmt_contract import Languages, UnknownLanguage, length_limit  # noqa: E402
from tests.export.hf_families import (  # noqa: E402
    DIRECTIONS,
    LANGUAGES,
    family_dir,
    hf_generate,
    imported_dir,
    sentences,
)

MULTILINGUAL = ("m2m100", "nllb", "nllb-legacy", "mbart50")
MAX_LENGTH = 20  # tokens a translation may produce (the forced first one and </s> included)
PER_DIRECTION = 8  # sentences decoded in each direction


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One thread for torch: on a busy machine, threads that wait for each other make a tiny
    model's step 40x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Shared with tests/runtime/test_family_parity.py: each family is built once a session."""
    return tmp_path_factory.getbasetemp() / "hf-families"


def directions(family: str) -> tuple[tuple[str, str], ...]:
    return DIRECTIONS if family in MULTILINGUAL else (("fr", "en"),)


def test_each_family_is_a_configuration_of_our_one_model(root: Path) -> None:
    shapes = {
        family: ModelConfig.from_json(imported_dir(family, root) / "config.json")
        for family in ("m2m100", "nllb", "mbart50", "marian-separate")
    }
    for family in ("m2m100", "nllb"):
        config = shapes[family]
        assert (config.pre_norm, config.final_layer_norm, config.embedding_norm) == (
            True,
            True,
            False,
        )
        assert config.positions == "sinusoidal_offset" and config.scale_embedding
        assert (config.pad_id, config.eos_id, config.unk_id, config.decoder_start_id) == (
            1,
            2,
            3,
            2,
        )
        assert not config.force_eos_at_limit and config.activation == "relu"
    mbart = shapes["mbart50"]
    assert (mbart.pre_norm, mbart.final_layer_norm, mbart.embedding_norm) == (True,) * 3
    assert mbart.positions == "learned" and mbart.force_eos_at_limit
    assert mbart.activation == "gelu" and mbart.decoder_start_id == mbart.eos_id == 2
    marian = shapes["marian-separate"]
    assert not marian.share_encoder_decoder_embeddings and not marian.pre_norm
    assert marian.target_vocab_size < marian.vocab_size  # a vocabulary per side
    assert marian.decoder_start_id == marian.pad_id == marian.target_vocab_size - 1
    for config in shapes.values():  # the unusual shape of every test model
        assert (config.encoder_layers, config.decoder_layers, config.d_model) == (3, 2, 64)
        assert (config.n_heads, config.ffn_dim, config.max_positions) == (4, 88, 96)


@pytest.mark.parametrize("family", MULTILINGUAL)
def test_the_languages_are_the_tokenizer_s_language_tokens(root: Path, family: str) -> None:
    hf = family_dir(family, root)
    languages = Languages.from_manifest(
        json.loads((imported_dir(family, root) / "languages.json").read_text())
    )
    count = {"m2m100": 100, "nllb": 202, "nllb-legacy": 202, "mbart50": 52}[family]
    assert len(languages.tokens) == count
    assert languages.source_token == ("suffix" if family == "nllb-legacy" else "prefix")
    for language in LANGUAGES:  # our codes are the API's: ISO 639-1 here
        assert languages.model_codes[language] == hf.codes[language]
        assert languages.token_of(language) == hf.forced_bos(language)
    if family.startswith("nllb"):
        assert languages.model_codes["zh"] == "zho_Hans"
        assert languages.model_codes["zh-Hant"] == "zho_Hant"
        assert languages.model_codes["ast"] == "ast_Latn"
    with pytest.raises(UnknownLanguage, match="no language 'tlh'"):
        languages.token_of("tlh")


@pytest.mark.parametrize("family", [*MULTILINGUAL, "marian-separate"])
def test_our_tokenizer_gives_the_family_tokenizer_s_ids(root: Path, family: str) -> None:
    """Sources in every language (their language's token where the tokenizer puts it), and
    target ids back to the text the family's tokenizer decodes."""
    hf = family_dir(family, root)
    _, ours = load_model_dir(imported_dir(family, root))
    odd = ["Ünïcödé ½ ☃ 漢字 emoji 😀", "x" * 40, "a", "Deux   espaces, et\tune tabulation."]
    for source, target in directions(family):
        texts = sentences(source, 60, seed=3) + odd
        tokenizer = hf.tokenizer(source)
        expected = [tokenizer(text).input_ids for text in texts]
        lang = source if family in MULTILINGUAL else None
        assert [ours.encode(text, lang) for text in texts] == expected
        assert any(ours.unk_id in ids for ids in expected)  # unknown pieces: <unk> on all sides
        # Target ids back to text, as the family's tokenizer decodes them, but for <unk>,
        # which it leaves out and we write as SentencePiece's "⁇" (as for Marian models).
        targets = sentences(target, 20, seed=4)
        for text in targets:
            ids = hf.tokenizer(source, target)(text_target=text).input_ids
            known = [i for i in ids if i != ours.unk_id]
            assert ours.decode(known) == tokenizer.decode(known, skip_special_tokens=True)


@pytest.mark.parametrize("family", [*MULTILINGUAL, "marian-separate"])
def test_our_model_gives_their_logits_on_a_padded_batch(root: Path, family: str) -> None:
    hf = family_dir(family, root)
    ours, tokenizer = load_model_dir(imported_dir(family, root))
    model = hf.model()
    source, target = directions(family)[0]
    lang = source if family in MULTILINGUAL else None
    sources = [tokenizer.encode(text, lang) for text in sentences(source, 6, seed=5)]
    width = max(len(ids) for ids in sources)
    pad = ours.config.pad_id
    ids = torch.tensor([s + [pad] * (width - len(s)) for s in sources])
    mask = torch.tensor([[i < len(s) for i in range(width)] for s in sources])
    assert not mask.all()
    generator = torch.Generator().manual_seed(6)
    vocab = ours.config.target_vocab_size
    target_in = torch.randint(4, vocab, (len(sources), 9), generator=generator)
    target_in[:, 0] = ours.config.decoder_start_id
    if family in MULTILINGUAL:
        target_in[:, 1] = hf.forced_bos(target)
    with torch.no_grad():
        expected = model(
            input_ids=ids, attention_mask=mask.long(), decoder_input_ids=target_in
        ).logits
        got = ours(ids, mask, target_in)
    assert (got - expected).abs().max() <= 1e-4


def decode_like_generate(family: str, root: Path, beam: int) -> list[int]:
    """Our torch model's search against `generate`, sentence by sentence, in every direction;
    the lengths of the outputs."""
    hf = family_dir(family, root)
    ours, tokenizer = load_model_dir(imported_dir(family, root))
    model = hf.model()
    lengths = []
    for source, target in directions(family):
        multilingual = family in MULTILINGUAL
        forced = hf.forced_bos(target) if multilingual else None
        count = PER_DIRECTION * 3 // len(directions(family))  # as many sentences for each
        for text in sentences(source, count, seed=7):
            ids = tokenizer.encode(text, source if multilingual else None)
            limit = length_limit(len(ids), MAX_LENGTH, ours.config.max_positions)
            out = hf_generate(model, ids, beam, limit, forced)
            produced = out.sequences[0, 1:].tolist()  # without the decoder start
            x = torch.tensor([ids])
            first = None if forced is None else [forced]
            if beam == 1:
                found = greedy_search(ours, x, x >= 0, MAX_LENGTH, first_tokens=first)[0]
            else:
                found = beam_search(
                    ours, x, x >= 0, beam, max_length=MAX_LENGTH, first_tokens=first
                )[0][0]
                assert found.score == pytest.approx(float(out.sequences_scores[0]), abs=1e-4)
            ended = produced[-1] == ours.config.eos_id
            assert found.tokens == (produced[:-1] if ended else produced), (source, target)
            if multilingual:
                assert produced[0] == forced
            lengths.append(len(produced))
    return lengths


@pytest.mark.parametrize("beam", [1, 4])
@pytest.mark.parametrize("family", [*MULTILINGUAL, "marian-separate"])
def test_our_model_decodes_like_generate(root: Path, family: str, beam: int) -> None:
    lengths = decode_like_generate(family, root, beam)
    print(f"{family} beam {beam}: output lengths {sorted(lengths)}")
    assert len(set(lengths)) >= 2  # not all the same length: some end by themselves


# ----------------------------------------------------------------------------- the command


def test_nmt_import_hf_detects_the_family_and_import_marian_is_its_alias(root: Path, tmp_path):
    from nmt_cli import main

    hf = family_dir("mbart50", root)
    assert main(["import-hf", "--hf-dir", str(hf.path), "--out", str(tmp_path / "a")]) == 0
    config = ModelConfig.from_json(tmp_path / "a" / "config.json")
    assert config.positions == "learned"
    assert (config.source_lang, config.target_lang) == ("en", "fr")  # the default pair
    args = ["--source-lang", "de", "--target-lang", "en", "--description", "Tested."]
    out = tmp_path / "b"
    assert main(["import-marian", "--hf-dir", str(hf.path), "--out", str(out), *args]) == 0
    config = ModelConfig.from_json(out / "config.json")
    assert (config.source_lang, config.target_lang) == ("de", "en")
    assert (out / "description.txt").read_text().strip() == "Tested."
    described = (imported_dir("mbart50", root) / "description.txt").read_text()
    assert described.startswith("hf-mbart50: a Hugging Face mBART-50 model, 52 languages")


def _copy(hf_dir: Path, folder: Path) -> Path:
    shutil.copytree(hf_dir, folder)
    return folder


def _edit_json(path: Path, **changes) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    data.update(changes)
    path.write_text(json.dumps(data), encoding="utf-8")


def test_what_cannot_be_imported_is_refused_with_the_reason(root: Path, tmp_path) -> None:
    m2m100 = _copy(family_dir("m2m100", root).path, tmp_path / "m2m100")
    _edit_json(m2m100 / "config.json", model_type="t5", architectures=["T5Model"])
    with pytest.raises(InteropError, match="model_type 't5'"):
        import_hf(m2m100, tmp_path / "out")

    mbart = _copy(family_dir("mbart50", root).path, tmp_path / "mbart")
    _edit_json(mbart / "tokenizer_config.json", tokenizer_class="MBartTokenizer")
    with pytest.raises(InteropError, match="MBart50Tokenizer"):
        import_hf(mbart, tmp_path / "out")

    nllb = _copy(family_dir("nllb", root).path, tmp_path / "nllb")
    tokenizer = json.loads((nllb / "tokenizer.json").read_text(encoding="utf-8"))
    for token in tokenizer["added_tokens"]:
        if token["content"] == "fra_Latn":
            token["id"] += 1
    (nllb / "tokenizer.json").write_text(json.dumps(tokenizer), encoding="utf-8")
    with pytest.raises(InteropError, match="numbers tokens otherwise: fra_Latn"):
        import_hf(nllb, tmp_path / "out")

    with pytest.raises(InteropError, match="no language 'xx'"):
        import_hf(family_dir("m2m100", root).path, tmp_path / "out", source_lang="xx")
    decoder = _copy(family_dir("m2m100", root).path, tmp_path / "decoder")
    _edit_json(decoder / "config.json", decoder_ffn_dim=64)
    with pytest.raises(InteropError, match="encoder_ffn_dim=88 differs"):
        import_hf(decoder, tmp_path / "out")
    assert not (tmp_path / "out").exists()
