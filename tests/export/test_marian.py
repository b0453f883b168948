"""Hugging Face Marian interop: imported models decode exactly like `MarianMTModel.generate`,
and our checkpoints exported to Marian load in transformers and CTranslate2 unchanged.

No hub access: the Marian model is a small random `MarianMTModel` built here from a
`MarianConfig`, with source and target SentencePiece models trained here on sentences written
here, saved with `save_pretrained` plus the files `MarianTokenizer` reads (opus-mt's layout:
</s> = 0, <unk> = 1, <pad> = last id, decoding starts from <pad>).
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers", reason="needs the bench extra")

import sentencepiece as spm  # noqa: E402

from export.checkpoint import load_model_dir, save_model_dir  # noqa: E402
from export.hf import InteropError, import_hf  # noqa: E402
from export.marian import export_marian, our_ids_to_marian  # noqa: E402
from export.model.config import ModelConfig  # noqa: E402
from export.model.transformer import Transformer  # noqa: E402
from export.onnx_export import export_bundle  # noqa: E402
from export.tokenizer import VocabTokenizer, train_sentencepiece  # noqa: E402
from nmt_contract import length_limit  # noqa: E402
from service.runtime.bundle import load_bundle  # noqa: E402
from service.runtime.engine import Engine  # noqa: E402
from service.runtime.search import SearchOptions  # noqa: E402
from service.runtime.sessions import EngineOptions  # noqa: E402
from service.runtime.tokenizer import BundleTokenizer  # noqa: E402
from service.runtime.translator import Translator  # noqa: E402
from tests.conftest import ROOT  # noqa: E402
from tests.runtime.steps import full_log_probs  # noqa: E402

# Two toy languages, so that the source and target SentencePiece models really differ.
SOURCE_TEXT = (
    "le la un une chien chat homme femme enfant rouge bleu vert maison rue parc mange regarde "
    "joue avec dans sur sous grand petit vieux jeune ballon vélo voiture eau plage montagne "
    "neige soleil musique guitare livre table fenêtre porte jardin fleur arbre oiseau poisson "
    "café école été hiver très et mais où qui garçon fille crêpe noël âgé août"
)
TARGET_TEXT = (
    "the a dog cat man woman child red blue green house street park eats looks plays with in "
    "on under big small old young ball bike car water beach mountain snow sun music guitar "
    "book table window door garden flower tree bird fish coffee school summer winter very and "
    "but where who boy girl pancake christmas aged august"
)
SOURCE_WORDS, TARGET_WORDS = SOURCE_TEXT.split(), TARGET_TEXT.split()
SPECIAL_PIECES = ("<unk>", "<s>", "</s>")  # SentencePiece's own control pieces

# What `generate` must do to decode as our engine does (see test_greedy_and_beam_...):
# MarianConfig's forced_eos_token_id=0 (written to generation_config.json by save_pretrained,
# as in every opus-mt model) forces </s> at the length limit, and so does our engine for the
# imported model; every other logits processor is off by default, and is turned off
# explicitly here so that a changed default cannot creep in.
GENERATE_LIKE_OURS = {
    "do_sample": False,
    "length_penalty": 1.0,
    "early_stopping": False,
    "num_return_sequences": 1,
    "forced_bos_token_id": None,
    "bad_words_ids": None,
    "no_repeat_ngram_size": 0,
    "encoder_no_repeat_ngram_size": 0,
    "repetition_penalty": 1.0,
    "min_length": 0,
    "min_new_tokens": None,
    "suppress_tokens": None,
    "begin_suppress_tokens": None,
    "renormalize_logits": False,
}


def sentences(words: list[str], count: int, seed: int, longest: int = 18) -> list[str]:
    rng = random.Random(seed)
    return [
        " ".join(rng.choice(words) for _ in range(rng.randint(1, longest))).capitalize() + "."
        for _ in range(count)
    ]


def train_spm(lines: list[str], prefix: Path, vocab_size: int) -> Path:
    """Trained like opus-mt's: SentencePiece's default ids (<unk> 0, <s> 1, </s> 2)."""
    text = prefix.with_suffix(".txt")
    text.write_text("\n".join(lines) + "\n", encoding="utf-8")
    spm.SentencePieceTrainer.train(
        input=str(text),
        model_prefix=str(prefix),
        vocab_size=vocab_size,
        model_type="unigram",
        character_coverage=1.0,
        hard_vocab_limit=False,
        num_threads=1,
        minloglevel=2,
    )
    return prefix.with_suffix(".model")


def randomize(model, seed: int) -> None:
    """Random weights that behave enough like a trained model's for the comparison to bite.

    A plain random model repeats one token forever: its decoder state hardly changes from step
    to step. So: small embeddings (std 0.02, the positions then drive the decoder input),
    sharper attention (query/key projections x2.5), sub-layers that outweigh the residual
    (out_proj/fc2 x2), and a larger last layer-norm gain (x8) to spread the logits (no near
    ties). Not more: sharper models amplify float rounding beyond 1e-4 between any two fp32
    implementations (transformers' own eager and sdpa attention included). A non-zero
    final_logits_bias with </s> favoured (+4) ends outputs at varied lengths.
    The <pad> row is not zero: decoding starts from <pad>'s embedding, so this checks we use it.
    """
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator)
            if "layer_norm" in name:
                parameter.copy_((1.0 if name.endswith("weight") else 0.0) + 0.1 * noise)
            elif name.endswith("bias"):
                parameter.copy_(0.1 * noise)
            elif parameter.dim() == 2 and "shared" not in name:
                gain = 2.5 if ("q_proj" in name or "k_proj" in name) else 1.0
                gain = 2.0 if ("out_proj" in name or "fc2" in name) else gain
                parameter.copy_(noise * gain / parameter.shape[1] ** 0.5)
            else:  # the shared embedding
                parameter.copy_(0.02 * noise)
        model.model.decoder.layers[-1].final_layer_norm.weight.mul_(8.0)
        vocab = model.config.vocab_size
        model.final_logits_bias.copy_(torch.randn((1, vocab), generator=generator))
        model.final_logits_bias[0, model.config.eos_token_id] = 4.0


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One thread for torch (and ONNX Runtime below): on a busy machine, threads that wait for
    each other make a tiny model's step 40x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


ONE_THREAD = EngineOptions(intra_op_threads=1)


@pytest.fixture(scope="module")
def marian_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small random MarianMTModel saved as an opus-mt directory."""
    from transformers import MarianConfig, MarianMTModel

    folder = tmp_path_factory.mktemp("marian")
    work = tmp_path_factory.mktemp("marian-spm")
    source_spm = train_spm(sentences(SOURCE_WORDS, 400, 1), work / "source", 120)
    target_spm = train_spm(sentences(TARGET_WORDS, 400, 2), work / "target", 120)
    source, target = (
        spm.SentencePieceProcessor(model_file=str(p)) for p in (source_spm, target_spm)
    )
    source_pieces = [source.id_to_piece(i) for i in range(source.get_piece_size())]
    target_pieces = [target.id_to_piece(i) for i in range(target.get_piece_size())]
    # Three source pieces left out of the vocab: the tokenizers must map them to <unk>.
    dropped = {p for p in source_pieces[20:] if p not in target_pieces}
    dropped = set(sorted(dropped)[:3])
    vocab = {"</s>": 0, "<unk>": 1}
    for piece in source_pieces + target_pieces:
        if piece not in vocab and piece not in SPECIAL_PIECES and piece not in dropped:
            vocab[piece] = len(vocab)
    vocab["<pad>"] = len(vocab)

    config = MarianConfig(
        vocab_size=len(vocab),
        d_model=64,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
        max_position_embeddings=96,
        activation_function="swish",  # as opus-mt
        scale_embedding=True,
        pad_token_id=vocab["<pad>"],
        eos_token_id=0,
        decoder_start_token_id=vocab["<pad>"],
    )
    torch.manual_seed(0)
    model = MarianMTModel(config).eval()
    randomize(model, seed=5)
    model.save_pretrained(folder)
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    shutil.copyfile(source_spm, folder / "source.spm")
    shutil.copyfile(target_spm, folder / "target.spm")
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"source_lang": "xx", "target_lang": "yy", "separate_vocabs": False})
    )
    return folder


@pytest.fixture(scope="module")
def hf_model(marian_dir: Path):
    from transformers import MarianMTModel

    return MarianMTModel.from_pretrained(marian_dir).eval()


@pytest.fixture(scope="module")
def hf_tokenizer(marian_dir: Path):
    from transformers import MarianTokenizer

    return MarianTokenizer.from_pretrained(marian_dir)


@pytest.fixture(scope="module")
def imported(marian_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("imported") / "xx-yy"
    import_hf(marian_dir, out)
    return out


@pytest.fixture(scope="module")
def imported_bundle(imported: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("imported-bundle") / "xx-yy"
    export_bundle(imported, out)
    return out


@pytest.fixture(scope="module")
def inputs() -> list[str]:
    """60 inputs of 1 to 30 words (so up to ~70 tokens)."""
    texts = sentences(SOURCE_WORDS, 60, seed=11, longest=30)
    texts[0] = "Chien."  # one very short
    return texts


def test_import_writes_our_config_and_marian_tokenizer(marian_dir, imported, imported_bundle):
    config = ModelConfig.from_json(imported / "config.json")
    vocab = json.loads((marian_dir / "vocab.json").read_text())
    assert (config.activation, config.d_model, config.n_heads, config.ffn_dim) == (
        "swish",
        64,
        4,
        128,
    )
    assert (config.eos_id, config.unk_id) == (0, 1)
    assert config.pad_id == config.decoder_start_id == vocab["<pad>"] == config.vocab_size - 1
    assert (config.max_positions, config.scale_embedding) == (96, True)
    assert (config.source_lang, config.target_lang) == ("xx", "yy")
    manifest = json.loads((imported_bundle / "bundle.json").read_text())
    assert manifest["tokenizer"] == {
        "source": "source.spm",
        "target": "target.spm",
        "vocab": "vocab.json",
    }
    assert {"source.spm", "target.spm", "vocab.json"} <= set(manifest["files"])
    # What the model is, said at import, travels into the bundle (/v1/models shows it).
    assert manifest["description"] == f"{marian_dir.name}: a Hugging Face Marian model (xx→yy)."
    assert manifest["special_ids"] == {
        "pad": config.pad_id,
        "eos": 0,
        "unk": 1,
        "decoder_start": config.pad_id,
    }


def test_tokenizers_agree_with_marian_tokenizer(imported, imported_bundle, hf_tokenizer, inputs):
    ours = VocabTokenizer(imported / "source.spm", imported / "target.spm", imported / "vocab.json")
    served = BundleTokenizer(load_bundle(imported_bundle))
    expected = [hf_tokenizer(text).input_ids for text in inputs]
    assert [ours.encode(text) for text in inputs] == expected
    assert served.encode(inputs) == expected
    assert any(ours.unk_id in ids for ids in expected)  # the dropped pieces: <unk> on all sides
    coded = ">>yy<< Le chien mange."  # a multilingual model's target-language code: one piece
    assert ours.encode(coded) == served.encode([coded])[0] == hf_tokenizer(coded).input_ids
    targets = sentences(TARGET_WORDS, 20, seed=3)
    for text in targets:
        ids = hf_tokenizer(text_target=text).input_ids
        assert served.decode(ids) == ours.decode(ids) == text
        assert hf_tokenizer.decode(ids, skip_special_tokens=True) == text
    # Pieces of the shared vocabulary that only the source model knows: no raw "▁" is printed.
    source_only = [
        i
        for piece, i in ours.vocab.items()
        if piece.startswith("▁") and ours.target.piece_to_id(piece) == ours.target.unk_id()
    ][:20]
    assert source_only
    for ids in ([source_only[0]], source_only[:5], [*source_only[5:9], ours.eos_id]):
        expected = hf_tokenizer.decode(ids, skip_special_tokens=True)
        assert "▁" not in expected
        assert served.decode(ids) == ours.decode(ids) == expected


def hf_generate(model, ids: list[int], beam: int, limit: int):
    return model.generate(
        input_ids=torch.tensor([ids]),
        attention_mask=torch.ones((1, len(ids)), dtype=torch.long),
        num_beams=beam,
        max_new_tokens=limit,
        output_scores=True,
        output_logits=True,
        return_dict_in_generate=True,
        **GENERATE_LIKE_OURS,
    )


@pytest.mark.parametrize("beam", [1, 4])
def test_greedy_and_beam_equal_generate_token_for_token(
    hf_model, imported_bundle, hf_tokenizer, inputs, beam
):
    """One sentence at a time, each with our length limit as max_new_tokens."""
    translator = Translator(load_bundle(imported_bundle), ONE_THREAD)
    sources = [hf_tokenizer(text).input_ids for text in inputs]
    found = translator.translate_ids(sources, SearchOptions(beam_size=beam), batch_size=16)
    eos, positions = hf_model.config.eos_token_id, hf_model.config.max_position_embeddings
    lengths, ended_by_themselves = set(), 0
    with torch.no_grad():
        for source, (ours,) in zip(sources, found, strict=True):
            limit = length_limit(len(source), 256, positions)
            out = hf_generate(hf_model, source, beam, limit)
            produced = out.sequences[0, 1:].tolist()  # drop the decoder start (<pad>)
            assert produced[-1] == eos  # by itself, or forced at the limit
            ended_by_themselves += len(produced) < limit
            assert ours.tokens == produced[:-1]
            lengths.add(len(produced))
            raw = torch.stack(out.logits)  # [steps, beams, V]
            # At the limit, forced_eos_token_id processed the last step's scores: </s> gets 0.
            free = len(raw) - (len(raw) >= limit)  # steps no logits processor touched
            if beam == 1:
                assert torch.equal(torch.stack(out.scores)[:free], raw[:free])
                log_probs = torch.log_softmax(raw[:, 0], dim=-1)
                chosen = log_probs[torch.arange(free), produced[:free]]
                expected = float(chosen.sum())  # + 0 for a forced </s>
                # Within 1e-4 a token (the per-step distributions: test_decoder_log_probs_...).
                assert ours.score == pytest.approx(expected / len(produced), abs=1e-4)
                assert ours.log_prob == pytest.approx(expected, abs=1e-4 * len(produced))
            else:
                expected_scores = torch.log_softmax(raw, dim=-1)[:free]
                assert torch.equal(torch.stack(out.scores)[:free], expected_scores)
                assert ours.score == pytest.approx(float(out.sequences_scores[0]), abs=1e-4)
    assert len(lengths) >= 8, lengths  # outputs of varied lengths
    assert 10 <= ended_by_themselves <= len(inputs) - 10  # many end by themselves, many not


def test_decoder_log_probs_match_marian(hf_model, imported_bundle, hf_tokenizer, inputs):
    """Teacher-forced along generate's greedy output: every step's log-probs within 1e-4."""
    engine = Engine(load_bundle(imported_bundle), ONE_THREAD)
    start = hf_model.config.decoder_start_token_id
    worst = 0.0
    with torch.no_grad():
        for text in inputs[:20]:
            source = hf_tokenizer(text).input_ids
            limit = length_limit(len(source), 256, hf_model.config.max_position_embeddings)
            target = hf_generate(hf_model, source, 1, limit).sequences[0].tolist()  # start first
            logits = hf_model(
                input_ids=torch.tensor([source]), decoder_input_ids=torch.tensor([target])
            ).logits[0]
            expected = torch.log_softmax(logits, dim=-1).numpy()  # [T, V]
            state = engine.start(np.array([source]), np.ones((1, len(source)), dtype=bool))
            for step, token in enumerate(target):
                got = full_log_probs(engine, state, np.array([token]))[0][0]
                worst = max(worst, float(np.abs(got - expected[step]).max()))
            assert target[0] == start
    print(f"largest log-prob difference: {worst:.1e}")
    assert worst <= 1e-4


def test_an_imported_model_exports_back_unchanged(marian_dir, imported, tmp_path):
    from safetensors.torch import load_file

    export_marian(imported, tmp_path / "hf")
    assert json.loads((tmp_path / "hf" / "vocab.json").read_text()) == json.loads(
        (marian_dir / "vocab.json").read_text()
    )
    before = load_file(str(marian_dir / "model.safetensors"))
    after = load_file(str(tmp_path / "hf" / "model.safetensors"))
    assert set(after) <= set(before)
    for name, tensor in after.items():
        assert torch.equal(tensor, before[name]), name
    for name in ("source.spm", "target.spm"):
        assert (tmp_path / "hf" / name).read_bytes() == (marian_dir / name).read_bytes()


def _refusal_dir(marian_dir: Path, folder: Path, **changes) -> Path:
    folder.mkdir()
    for name in ("source.spm", "target.spm", "vocab.json", "tokenizer_config.json"):
        shutil.copyfile(marian_dir / name, folder / name)
    config = json.loads((marian_dir / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"normalize_before": True}, "normalize_before"),
        ({"share_encoder_decoder_embeddings": False}, "share_encoder_decoder_embeddings"),
        ({"decoder_ffn_dim": 256}, "encoder_ffn_dim=128 differs"),
        ({"decoder_attention_heads": 8}, "encoder_attention_heads=4 differs"),
        ({"decoder_vocab_size": 12}, "decoder_vocab_size"),
        ({"activation_function": "tanh"}, "activation_function='tanh'"),
        ({"model_type": "bart"}, "model_type"),
        ({"eos_token_id": 5}, "eos_token_id=5"),
    ],
)
def test_unsupported_marian_configs_are_refused(marian_dir, tmp_path, changes, message):
    folder = _refusal_dir(marian_dir, tmp_path / "hf", **changes)
    with pytest.raises(InteropError, match=message):
        import_hf(folder, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_untied_embeddings_are_refused(marian_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    folder = _refusal_dir(marian_dir, tmp_path / "hf")
    weights = load_file(str(marian_dir / "model.safetensors"))
    weights["lm_head.weight"] = weights["model.shared.weight"] + 1.0
    save_file(weights, str(folder / "model.safetensors"))
    with pytest.raises(InteropError, match="untied embeddings"):
        import_hf(folder, tmp_path / "out")


# ----------------------------------------------------------------------------- export


@pytest.fixture(scope="module")
def our_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small random model of ours with its joint SentencePiece model."""
    folder = tmp_path_factory.mktemp("ours")
    corpus = folder / "corpus.txt"
    corpus.write_text(
        "\n".join(sentences(SOURCE_WORDS, 300, 4) + sentences(TARGET_WORDS, 300, 5)) + "\n"
    )
    tokenizer_model = train_sentencepiece([corpus], folder / "spm", 320)
    vocab_size = spm.SentencePieceProcessor(model_file=str(tokenizer_model)).get_piece_size()
    config = ModelConfig(
        vocab_size=vocab_size,
        d_model=64,
        n_heads=4,
        ffn_dim=128,
        encoder_layers=2,
        decoder_layers=2,
        activation="swish",
        max_positions=128,
        dropout=0.0,
    )
    torch.manual_seed(1)
    model = Transformer(config).eval()
    with torch.no_grad():
        model.embed_tokens.weight.mul_(4.0)  # spread the logits out, as above
        model.final_logits_bias.copy_(torch.randn(vocab_size))
        model.final_logits_bias[config.eos_id] = 3.0
    save_model_dir(model, tokenizer_model, folder / "model")
    return folder / "model"


@pytest.fixture(scope="module")
def exported(our_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from nmt_cli import main

    out = tmp_path_factory.mktemp("exported") / "hf"
    assert main(["export-marian", "--checkpoint", str(our_checkpoint), "--out", str(out)]) == 0
    return out


def test_exported_marian_gives_our_logits(our_checkpoint, exported, tmp_path):
    from transformers import MarianMTModel, MarianTokenizer

    ours, tokenizer = load_model_dir(our_checkpoint)
    to_marian = torch.tensor(our_ids_to_marian(ours.config))
    hf = MarianMTModel.from_pretrained(exported).eval()
    hf_tokenizer = MarianTokenizer.from_pretrained(exported)
    texts = sentences(SOURCE_WORDS, 6, seed=9, longest=25)
    sources = [tokenizer.encode(t) for t in texts]
    assert [to_marian[torch.tensor(s)].tolist() for s in sources] == [
        hf_tokenizer(t).input_ids for t in texts
    ]
    width = max(len(s) for s in sources)
    ids = torch.full((len(sources), width), ours.config.pad_id)
    for row, source in enumerate(sources):
        ids[row, : len(source)] = torch.tensor(source)
    mask = ids != ours.config.pad_id
    generator = torch.Generator().manual_seed(2)
    target = torch.randint(3, ours.config.vocab_size, (len(sources), 9), generator=generator)
    target[:, 0] = ours.config.decoder_start_id
    with torch.no_grad():
        expected = ours(ids, mask, target)
        got = hf(
            input_ids=to_marian[ids],
            attention_mask=mask.long(),
            decoder_input_ids=to_marian[target],
        ).logits[..., to_marian]  # back in our ids
    assert (got - expected).abs().max() <= 1e-4

    # And back: importing the export gives the same model (in Marian's ids).
    from nmt_cli import main

    assert main(["import-marian", "--hf-dir", str(exported), "--out", str(tmp_path / "back")]) == 0
    back, _ = load_model_dir(tmp_path / "back")
    assert back.config.pad_id == ours.config.vocab_size - 1
    with torch.no_grad():
        again = back(to_marian[ids], mask, to_marian[target])[..., to_marian]
    assert (again - expected).abs().max() <= 1e-5


def test_ctranslate2_converts_and_translates_the_export(our_checkpoint, exported, tmp_path):
    """The stock converter accepts the directory, and CTranslate2 decodes like our reference
    (this model's <pad> row is zero, as Marian's own models have it)."""
    ctranslate2 = pytest.importorskip("ctranslate2", reason="needs the bench extra")
    from export.decoding import beam_search, greedy_search

    converter = Path(sys.executable).with_name("ct2-transformers-converter")
    subprocess.run(
        [converter, "--model", exported, "--output_dir", tmp_path / "ct2"],
        check=True,
        capture_output=True,
        cwd=ROOT,
    )
    ours, tokenizer = load_model_dir(our_checkpoint)
    vocab = json.loads((exported / "vocab.json").read_text())
    piece_of = {i: p for p, i in vocab.items()}
    to_marian = our_ids_to_marian(ours.config)
    from_piece = {piece_of[to_marian[i]]: i for i in range(ours.config.vocab_size)}
    translator = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu", intra_threads=1)
    for text in sentences(SOURCE_WORDS, 12, seed=13, longest=20):
        source = tokenizer.encode(text)
        limit = length_limit(len(source), 256, ours.config.max_positions)
        ids = torch.tensor([source])
        for beam in (1, 4):
            if beam == 1:
                expected = greedy_search(ours, ids, ids != ours.config.pad_id)[0].tokens
            else:
                expected = beam_search(ours, ids, ids != ours.config.pad_id, beam)[0][0].tokens
            result = translator.translate_batch(
                [[piece_of[to_marian[i]] for i in source]],
                beam_size=beam,
                max_decoding_length=limit,
                min_decoding_length=0,
                length_penalty=1.0,
            )
            assert [from_piece[p] for p in result[0].hypotheses[0]] == expected


# ----------------------------------------------------------------------------- fr-en


@pytest.mark.slow
def test_trained_fr_en_translates_alike_in_transformers_and_ctranslate2(
    committed_model, multi30k, tmp_path
):
    """Every line of test_2016_flickr, beam 4: >= 99% equal to ours (differences printed)."""
    pytest.importorskip("ctranslate2", reason="needs the bench extra")
    from bench.compare import run_parity

    # One thread an engine: exact results do not depend on it, and on a busy machine threads
    # that spin-wait for each other would turn minutes into an hour.
    result = run_parity(committed_model, multi30k / "test_2016_flickr.fr", tmp_path / "work", 1)
    for name, report in result["engines"].items():
        for d in report["differences"][:20]:
            print(f"{name} line {d['line']}:\n  ours: {d['ours']}\n  them: {d[name]}")
        print(f"{name}: {report['equal']}/{report['total']} equal")
    for name, report in result["engines"].items():
        assert report["share"] >= 0.99, (
            f"{name}: {report['equal']}/{report['total']} lines equal to ours; if this is "
            "CTranslate2, check the <pad> embedding norm (nmt export-marian warns): CTranslate2 "
            "starts decoding from a zero vector, we and transformers from <pad>'s embedding"
        )
