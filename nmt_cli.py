"""`nmt`: the one command-line entry point.

Subcommands import their side lazily: `train` and the torch paths need the `export` extra
(torch); the serving side never imports it. Benchmarks are not subcommands: bench/ is outside
the product (not installed), run from a checkout as `python -m bench.compare` and the like.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
from pathlib import Path


def _add_train(subparsers: argparse._SubParsersAction) -> None:
    from export.train_config import TrainConfig  # a plain dataclass: no torch import

    parser = subparsers.add_parser(
        "train",
        help="train a model (resumable: run the same command again to continue)",
        description="Train the Transformer. Killed runs continue from --run-dir/state.pt.",
    )
    parser.add_argument("--run-dir", type=Path, required=True, help="checkpoints and progress")
    parser.add_argument("--out", type=Path, help="where to write the final model directory")
    parser.add_argument("--device", help="cpu or cuda (default: cuda when present)")
    parser.add_argument(
        "--tokenizer",
        type=Path,
        help="a SentencePiece model to use instead of training one (models that share it can "
        "decode as an ensemble)",
    )
    parser.add_argument(
        "--time-budget-minutes",
        type=float,
        default=0.0,
        help="no epoch starts that would end past this many minutes of this process "
        "(judged by the last epoch's length); 0 = no limit",
    )
    for field in dataclasses.fields(TrainConfig):
        flag = "--" + field.name.replace("_", "-")
        if isinstance(field.default, bool):  # --pre-norm / --no-pre-norm (bool("False") is True)
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=field.default)
            continue
        parser.add_argument(
            flag,
            type=type(field.default),
            default=field.default,
            help=f"(default: {field.default!r})",
        )


def _cmd_train(args: argparse.Namespace) -> int:
    from export.train import run_training
    from export.train_config import TrainConfig

    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig)}
    summary = run_training(
        TrainConfig(**values),
        args.run_dir,
        args.out,
        args.device,
        tokenizer=args.tokenizer,
        time_budget_minutes=args.time_budget_minutes,
    )
    print(json.dumps(summary))
    return 0


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def _read_stdin_lines() -> list[str]:
    return sys.stdin.read().splitlines()


def _translate_lines(args: argparse.Namespace, sentences: list[str]) -> list[str]:
    """On the ONNX engine with --model-dir (the product), else on the torch checkpoint."""
    if args.model_dir and args.device:
        raise SystemExit("--device is the torch path's: the ONNX engine runs on the CPU")
    if args.model_dir:
        from nmt_contract import UnknownLanguage
        from service.runtime.bundle import load_bundle
        from service.runtime.search import SearchOptions
        from service.runtime.sessions import EngineOptions
        from service.runtime.translator import Translator

        translator = Translator(
            load_bundle(args.model_dir),
            EngineOptions(int8=args.int8, intra_op_threads=args.threads, shortlist=args.shortlist),
        )
        options = SearchOptions(
            beam_size=args.beam_size,
            length_penalty=args.length_penalty,
            max_length=args.max_length,
            max_repeats=args.max_repeats,
        )
        try:
            found = translator.translate(
                sentences, options, args.batch_size, args.source_lang, args.target_lang
            )
        except UnknownLanguage as error:
            raise SystemExit(f"nmt {args.command}: {error}") from None
        return [t.text for t in found]
    if args.int8 or args.shortlist or args.source_lang or args.target_lang:
        raise SystemExit(
            "--int8, --shortlist, --source-lang and --target-lang need --model-dir (a bundle)"
        )
    from export.checkpoint import load_model_dir
    from export.ensemble import load_ensemble
    from export.translate import translate_texts

    device = args.device or ("cuda" if _cuda_available() else "cpu")
    if len(args.checkpoint) == 1:
        model, tokenizer = load_model_dir(args.checkpoint[0], device)
    else:
        model, tokenizer = load_ensemble(args.checkpoint, device)
    return translate_texts(
        model, tokenizer, sentences, args.beam_size, args.batch_size, args.max_length,
        args.length_penalty,
    )  # fmt: skip


def _add_decoding_options(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--model-dir", type=Path, help="exported bundle (ONNX Runtime engine)")
    source.add_argument(
        "--checkpoint",
        type=Path,
        nargs="+",
        default=[Path("models/fr-en")],
        help="torch model directory, used without --model-dir (default: models/fr-en); "
        "several that share a tokenizer decode as an ensemble (the mean of their probabilities)",
    )
    parser.add_argument(
        "--device", help="the torch path's device: cpu or cuda (default: cuda when present)"
    )
    parser.add_argument("--beam-size", type=int, default=1, help="1 = greedy")
    parser.add_argument("--length-penalty", type=float, default=1.0)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument(
        "--max-repeats",
        type=int,
        default=0,
        help="stop a translation before it repeats an n-gram more than this many times in a "
        "row (ONNX engine only; 0 = off, as in the torch reference; the server's default is "
        "NMT_MAX_REPEATS)",
    )
    parser.add_argument("--int8", action="store_true", help="int8 graphs (with --model-dir)")
    parser.add_argument(
        "--shortlist",
        action="store_true",
        help="score only the candidate words of the bundle's vocabulary shortlist (with "
        "--model-dir; up to 1.3x faster, mostly in beam search; results change a little)",
    )
    parser.add_argument("--threads", type=int, default=0, help="ONNX Runtime threads (0 = all)")
    parser.add_argument(
        "--source-lang", help="a multilingual bundle's source language (default: its first pair)"
    )
    parser.add_argument(
        "--target-lang", help="a multilingual bundle's target language (default: its first pair)"
    )


def _cmd_export(args: argparse.Namespace) -> int:
    from export.onnx_export import export_bundle

    manifest = export_bundle(
        args.checkpoint,
        args.out,
        int8=args.int8,
        description=args.description,
    )
    print(json.dumps({"out": str(args.out), "files": sorted(manifest["files"])}))
    return 0


def _cmd_translate(args: argparse.Namespace) -> int:
    for line in _translate_lines(args, _read_stdin_lines()):
        print(line)
    return 0


def _cmd_eval(args: argparse.Namespace) -> int:
    from export.data import read_lines
    from export.scoring import corpus_scores

    references = read_lines(args.ref)
    if args.hyp:
        hypotheses = read_lines(args.hyp)
    elif args.src:
        hypotheses = _translate_lines(args, read_lines(args.src))
    else:
        raise SystemExit("nmt eval: give --src (to translate) or --hyp (translations to score)")
    result = corpus_scores(hypotheses, references)
    result.update(
        {
            "ref": str(args.ref),
            "beam_size": args.beam_size,
            "engine": "onnxruntime" if args.model_dir else "torch",
            "int8": args.int8,
            "shortlist": args.shortlist,
        }
    )
    print(json.dumps(result))
    return 0


def _cmd_calibrate(args: argparse.Namespace) -> int:
    """The bundle's confidence.json (service/serving/confidence.py): its translations of
    held-out sentences, as the server makes them, labelled against their references, and a
    logistic regression fitted per search (export/calibration.py); with --jackknife, over
    one feature more: a lexicon learned from jackknifed labels (export/jackknife.py)."""
    import numpy as np

    from export import calibration as fit
    from export.data import read_lines
    from export.jackknife import pooled, tokenizer_checksum
    from export.train_config import multi30k_dir
    from nmt_contract import CONFIDENCE_FILE
    from service.runtime.bundle import load_bundle
    from service.runtime.sessions import EngineOptions
    from service.runtime.translator import Translator
    from service.serving.confidence import (
        LEXICON,
        SEARCH_FEATURES,
        CalibrationFile,
        Lexicon,
        scored_sentences,
    )
    from service.serving.settings import Settings

    base = multi30k_dir()
    source_path = args.source or base / "val.fr"
    reference_path = args.reference or base / "val.en"
    sources, references = read_lines(source_path), read_lines(reference_path)
    if len(sources) != len(references):
        raise SystemExit(f"nmt calibrate: {len(sources)} sources, {len(references)} references")
    bundle = load_bundle(args.model_dir)
    translator = Translator(bundle, EngineOptions(int8=args.int8, intra_op_threads=args.threads))
    served = Settings.model_construct()  # the server's defaults (no environment read)
    searches, metrics, words, wrong, lexicon_rows = {}, {}, [], [], 0
    for search, beam_size in (("greedy", 1), ("beam", args.beam_size)):
        scored = scored_sentences(
            translator,
            sources,
            served.default_search(beam_size),
            args.batch_size,
            args.source_lang,
            args.target_lang,
        )
        chrf = np.array(
            [fit.sentence_chrf(s.translation, r) for s, r in zip(scored, references, strict=True)]
        )
        good = chrf >= args.good_chrf
        names = list(SEARCH_FEATURES[search])
        features = [s.features for s in scored]
        lexicon = None
        if args.jackknife:
            jackknives = " ".join(map(str, args.jackknife))
            try:
                labels = pooled(args.jackknife, search)
            except (OSError, ValueError) as error:
                raise SystemExit(f"nmt calibrate: {error}") from None
            if labels.tokenizer != tokenizer_checksum(bundle.tokenizer_files):
                raise SystemExit(
                    f"nmt calibrate: {jackknives}'s models have another tokenizer than "
                    f"{args.model_dir}: their pieces would not mean the same"
                )
            if labels.beam_size != beam_size:
                raise SystemExit(
                    f"nmt calibrate: {jackknives}'s {search} labels were made with beam "
                    f"{labels.beam_size}, not {beam_size}"
                )
            lexicon = fit.fit_lexicon(
                fit.feature_matrix(labels.features, names),
                np.array(labels.chrf),
                labels.source_ids,
                labels.output_ids,
                bundle.vocab_sizes,
            )
            scores = Lexicon(**lexicon)
            features = [
                {**s.features, LEXICON: scores.score(s.source_ids, s.output_ids)} for s in scored
            ]
            names.append(LEXICON)
            lexicon_rows = len(labels.chrf)
        rows = fit.feature_matrix(features, names)
        try:
            fitted = fit.fit_search(rows, chrf, args.good_chrf, names, lexicon)
        except ValueError as error:
            raise SystemExit(f"nmt calibrate: {search} search: {error}") from None
        searches[search] = vars(fitted)
        confidence = fitted.predict(rows)
        metrics[f"{search}_good_share"] = round(float(good.mean()), 4)
        metrics[f"{search}_spearman_raw"] = round(fit.spearman(rows[:, 0], chrf), 4)
        metrics[f"{search}_spearman"] = round(fit.spearman(confidence, chrf), 4)
        metrics[f"{search}_ece"] = round(fit.expected_calibration_error(confidence, good), 4)
        if search == "beam":  # the server's default search: the words' threshold
            for s, reference in zip(scored, references, strict=True):
                words += [w.confidence for w in s.words]
                wrong += fit.word_labels([w.word for w in s.words], reference)
    threshold = fit.word_threshold(np.array(words), np.array(wrong))
    trained_on = (
        f"{len(sources)} sentences of {source_path.name} / {reference_path.name}; "
        f"greedy and beam {args.beam_size}, {'int8' if args.int8 else 'fp32'}"
    )
    if args.jackknife:
        trained_on += f"; lexicons from {lexicon_rows} jackknifed translations per search"
    calibration = CalibrationFile(
        label=f"sentence chrF >= {args.good_chrf:g} against a reference translation",
        searches=searches,
        word_threshold=threshold,
        trained_on=trained_on,
        command=" ".join(["nmt", *sys.argv[1:]]),
        metrics=metrics,
    )
    calibration.check_vocabulary(*bundle.vocab_sizes)
    out = args.out or args.model_dir / CONFIDENCE_FILE
    out.write_text(fit.file_text(calibration.model_dump(mode="json", exclude_none=True)))
    print(json.dumps({"out": str(out), "word_threshold": threshold, **metrics}))
    return 0


def _cmd_jackknife(args: argparse.Namespace) -> int:
    """Jackknifed quality labels for `nmt calibrate --jackknife` (export/jackknife.py)."""
    from export import jackknife
    from export.train_config import multi30k_dir

    if args.jackknife_command == "split":
        recipe = args.recipe or jackknife.FR_EN_RECIPE
        try:
            commands = jackknife.split(
                args.data_dir or multi30k_dir(),
                args.out,
                recipe,
                targets=args.targets,
                folds=args.folds,
                cores=args.cores,
            )
        except (OSError, ValueError) as error:
            raise SystemExit(f"nmt jackknife split: {error}") from None
        print(f"# train and export a model outside each fold ({args.cores} cores, a line each):")
        print("\n".join(commands))
        print(f"# then: nmt jackknife label --dir {args.out}")
        return 0
    from service.runtime.bundle import BundleError

    try:
        searches = {"greedy": 1, "beam": args.beam_size}
        if args.search:
            searches = {name: searches[name] for name in args.search}
        written = _label_folds(args.dir, searches, args.fold)
    except (OSError, ValueError, BundleError) as error:  # (a missing or broken fold model)
        raise SystemExit(f"nmt jackknife label: {error}") from None
    print(json.dumps({"written": [str(p) for p in written]}))
    return 0


def _label_folds(
    folder: Path, searches: dict[str, int], only: list[str] | None = None, batch_size: int = 32
) -> list[Path]:
    """Each fold of the jackknife in `folder` (heldout-X; or the folds `only`) translated by
    the model trained outside it (bundle-X), with each search (name -> beam size) as the
    server translates, labelled with its sentence chrF: as many folds at once as there are
    cores, one engine thread each. A labels file already written is kept (an interrupted run
    goes on where it stopped)."""
    from concurrent.futures import ThreadPoolExecutor

    from export.calibration import sentence_chrf
    from export.data import read_lines
    from export.jackknife import folds_of, labels_path, tokenizer_checksum, write_labels
    from service.runtime.bundle import load_bundle
    from service.runtime.sessions import EngineOptions
    from service.runtime.translator import Translator
    from service.serving.confidence import scored_sentences
    from service.serving.settings import Settings

    folds = folds_of(folder)
    unknown = sorted(set(only or []) - set(folds))
    if unknown:
        raise ValueError(f"{folder} has no fold {', '.join(unknown)} (its folds: {folds})")
    folds = [fold for fold in folds if not only or fold in only]
    bundles = {fold: load_bundle(folder / f"bundle-{fold}") for fold in folds}
    tokenizer = tokenizer_checksum(bundles[folds[0]].tokenizer_files)
    for fold, bundle in bundles.items():
        if tokenizer_checksum(bundle.tokenizer_files) != tokenizer:
            raise ValueError(f"{folder}: bundle-{fold}'s tokenizer is not bundle-{folds[0]}'s")
    translators = {
        fold: Translator(bundle, EngineOptions(intra_op_threads=1))
        for fold, bundle in bundles.items()
    }
    served = Settings.model_construct()  # the server's defaults (no environment read)

    def label_fold(search: str, fold: str) -> Path:
        heldout = folder / f"heldout-{fold}"
        references = read_lines(heldout / "reference.en")
        beam_size = searches[search]
        scored = scored_sentences(
            translators[fold],
            read_lines(heldout / "source.fr"),
            served.default_search(beam_size),
            batch_size,
        )
        header = {
            "search": search,
            "beam_size": beam_size,
            "model": f"bundle-{fold}",
            "data": f"heldout-{fold}",
            "tokenizer": tokenizer,
            "vocab_sizes": list(bundles[fold].vocab_sizes),
            "sentences": len(scored),
        }
        rows = (
            {
                "features": s.features,
                "source_ids": s.source_ids,
                "output_ids": s.output_ids,
                "chrf": round(sentence_chrf(s.translation, reference), 4),
            }
            for s, reference in zip(scored, references, strict=True)
        )
        path = labels_path(folder, search, fold)
        write_labels(path, header, rows)
        return path

    written = []
    # ONNX Runtime lets go of the interpreter while it runs: folds run side by side, one
    # engine thread each (each fold's translator in one thread at a time)
    with ThreadPoolExecutor(max(1, min(len(folds), os.cpu_count() or 1))) as pool:
        for search in searches:
            todo = [f for f in folds if not labels_path(folder, search, f).is_file()]
            written += list(pool.map(label_fold, [search] * len(todo), todo))
    return written


def _add_jackknife(subparsers: argparse._SubParsersAction) -> None:
    jackknife = subparsers.add_parser(
        "jackknife",
        help="translations with real errors for the confidence's lexicon: models trained "
        "outside one fold of the training pairs each, translating their fold",
    )
    commands = jackknife.add_subparsers(dest="jackknife_command", required=True)
    split = commands.add_parser(
        "split",
        help="split the training pairs into folds and print how to train a model outside each",
    )
    split.add_argument("--out", type=Path, required=True, help="the jackknife's folder")
    split.add_argument("--data-dir", type=Path, help="train.fr/train.en (default: Multi30k)")
    split.add_argument(
        "--recipe", help="`nmt train` flags of each fold model (default: the fr-en model's shape)"
    )
    split.add_argument(
        "--folds", type=int, default=2, help="how many folds (each model learns from the others)"
    )
    split.add_argument(
        "--cores", type=int, default=2, help="the cores the printed commands spread the folds over"
    )
    split.add_argument(
        "--targets",
        type=Path,
        help="what the fold models learn to write, a line per training source (e.g. a "
        "teacher's translations; default: the references); labels stay scored against the "
        "references",
    )
    label = commands.add_parser(
        "label", help="translate each fold with the model trained outside it, labelled with chrF"
    )
    label.add_argument("--dir", type=Path, required=True, help="the jackknife's folder")
    label.add_argument("--beam-size", type=int, default=4, help="the beam search labelled")
    label.add_argument(
        "--fold", action="append", help="label only this fold (repeatable; default: every fold)"
    )
    label.add_argument(
        "--search",
        action="append",
        choices=("greedy", "beam"),
        help="label only this search (repeatable; default: both)",
    )


def _cmd_shortlist(args: argparse.Namespace) -> int:
    from export.shortlist import shortlist_from_corpus
    from export.train_config import multi30k_dir
    from nmt_contract import SHORTLIST_FILE

    data = args.data or multi30k_dir()
    shortlist = shortlist_from_corpus(
        args.checkpoint, data, args.prefix, per_source=args.per_source, always=args.always
    )
    out = args.out or args.checkpoint / SHORTLIST_FILE
    shortlist.save(out)
    per_source = float((shortlist.candidates >= 0).sum(axis=1).mean())
    print(json.dumps({"out": str(out), "always": len(shortlist.always), "per_source": per_source}))
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from service.http.server import serve
    from service.serving.settings import Settings

    overrides = {
        name: value
        for name, value in (("host", args.host), ("port", args.port), ("model_dir", args.model_dir))
        if value is not None
    }
    try:
        settings = Settings(**overrides)
    except ValidationError as error:
        print(f"nmt serve: invalid settings (NMT_* variables or options): {error}", file=sys.stderr)
        return 2
    return serve(settings)


def _add_serve(subparsers: argparse._SubParsersAction) -> None:
    serve = subparsers.add_parser(
        "serve",
        help="run the HTTP service (every bundle under NMT_MODEL_DIR)",
        description="Serve every bundle under NMT_MODEL_DIR over HTTP. Every setting is an "
        "NMT_* environment variable (docs/service.md); these options override three of them.",
    )
    serve.add_argument("--host", help="listen address (NMT_HOST, default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="listen port (NMT_PORT, default 8000)")
    serve.add_argument("--model-dir", type=Path, help="bundles folder (NMT_MODEL_DIR)")


def _cmd_db(args: argparse.Namespace) -> int:
    """The store's schema (service/store): `upgrade` migrates it to this version's head,
    `current` says where it is. The database is NMT_DATABASE_URL's, as `nmt serve` opens it."""
    from pydantic import ValidationError

    from service.serving.settings import Settings
    from service.store import Database, StoreError, database_url
    from service.store.database import current_revision, head_revision, migrate

    try:
        database = Database(database_url(Settings()))
    except (ValidationError, StoreError) as error:
        print(f"nmt db: {error}", file=sys.stderr)
        return 2
    try:
        current = migrate(database) if args.db_command == "upgrade" else current_revision(database)
    except StoreError as error:
        print(f"nmt db {args.db_command}: {database.shown_url}: {error}", file=sys.stderr)
        return 1
    finally:
        database.close()
    head = head_revision()
    print(json.dumps({"database": database.shown_url, "revision": current, "head": head}))
    return 0 if args.db_command == "upgrade" or current == head else 3


def _add_db(subparsers: argparse._SubParsersAction) -> None:
    db = subparsers.add_parser(
        "db",
        help="the database's schema: upgrade it, or show its revision",
        description="The database of NMT_DATABASE_URL (default: SQLite at NMT_STATE_DIR/nmt.db). "
        "`nmt serve` migrates it at start unless NMT_DATABASE_MIGRATE=false; then run "
        "`nmt db upgrade` before starting new servers.",
    )
    commands = db.add_subparsers(dest="db_command", required=True)
    commands.add_parser("upgrade", help="migrate the schema to this version's newest revision")
    commands.add_parser(
        "current", help="print the schema's revision and this version's (exit 3 if they differ)"
    )


def _cmd_import_hf(args: argparse.Namespace) -> int:
    from export.hf import InteropError, import_hf

    try:
        config = import_hf(
            args.hf_dir, args.out, args.source_lang, args.target_lang, args.description
        )
    except InteropError as error:
        print(f"nmt {args.command}: {error}", file=sys.stderr)
        return 2
    print(json.dumps({"out": str(args.out), "config": dataclasses.asdict(config)}))
    return 0


def _cmd_export_hf(args: argparse.Namespace) -> int:
    from export.checkpoint import CONFIG_FILE
    from export.hf import InteropError
    from export.m2m100 import export_m2m100
    from export.marian import export_marian, is_marian_shaped
    from export.model.config import ModelConfig

    try:
        config = ModelConfig.from_json(args.checkpoint / CONFIG_FILE)
        # Marian's shape is our default; a model in M2M-100's layout (pre-norm) goes there,
        # and export_m2m100 says what keeps any other one out.
        export = export_marian if is_marian_shaped(config) else export_m2m100
        print(json.dumps(export(args.checkpoint, args.out)))
    except (InteropError, OSError, ValueError) as error:
        print(f"nmt {args.command}: {error}", file=sys.stderr)
        return 2
    return 0


def _add_marian(subparsers: argparse._SubParsersAction) -> None:
    import_hf = subparsers.add_parser(
        "import-hf",
        aliases=["import-marian"],
        help="a local Hugging Face directory (Marian/opus-mt, M2M-100, NLLB, mBART-50) -> our "
        "model directory",
        description="The family is read from config.json: MarianMTModel, "
        "M2M100ForConditionalGeneration (M2M100Tokenizer or NllbTokenizer), "
        "MBartForConditionalGeneration (MBart50Tokenizer). `nmt export` then makes the bundle.",
    )
    import_hf.add_argument("--hf-dir", type=Path, required=True, help="HF model directory")
    import_hf.add_argument("--out", type=Path, required=True, help="model directory to write")
    import_hf.add_argument(
        "--source-lang",
        help="the source language (a multilingual model's default one; default: from "
        "tokenizer_config.json)",
    )
    import_hf.add_argument(
        "--target-lang",
        help="the target language (a multilingual model's default one; default: from "
        "tokenizer_config.json)",
    )
    import_hf.add_argument(
        "--description",
        help="what the model was trained on and is for (written to description.txt; default: "
        "its name and what its README.md says)",
    )

    export_hf = subparsers.add_parser(
        "export-hf",
        aliases=["export-marian"],
        help="our model directory -> a Hugging Face directory (Marian, or M2M-100 for a model "
        "trained in its layout)",
    )
    export_hf.add_argument("--checkpoint", type=Path, default=Path("models/fr-en"))
    export_hf.add_argument("--out", type=Path, required=True, help="HF directory to write")


def _add_models(subparsers: argparse._SubParsersAction) -> None:
    models = subparsers.add_parser(
        "models",
        help="list, load and unload a running server's models (through its API)",
        description="Model control of a running `nmt serve`: what /v1/models and "
        "/v1/models/{name}/load|unload|ready answer, as JSON on stdout. Exits 1 when the "
        "server refuses (the reason on stderr).",
    )
    models.add_argument(
        "--url", default="http://127.0.0.1:8000", help="the server (default: %(default)s)"
    )
    models.add_argument(
        "--key", help="admin key for load/unload, API key for list (default: $NMT_KEY)"
    )
    actions = models.add_subparsers(dest="action", required=True)
    actions.add_parser("list", help="every model, its serving version and each version's state")
    load = actions.add_parser("load", help="load a model again from the repository")
    load.add_argument("name")
    load.add_argument("--version", type=int, help="this version only (a rollback: an older one)")
    unload = actions.add_parser("unload", help="stop serving a model")
    unload.add_argument("name")
    ready = actions.add_parser("ready", help="whether a version of the model serves")
    ready.add_argument("name")


def _cmd_models(args: argparse.Namespace) -> int:
    import contextlib
    import os
    import urllib.error
    import urllib.request

    if args.action == "list":
        method, path, body = "GET", "/v1/models", None
    elif args.action == "ready":
        method, path, body = "GET", f"/v1/models/{args.name}/ready", None
    else:
        payload = {"version": args.version} if getattr(args, "version", None) is not None else {}
        method, path, body = "POST", f"/v1/models/{args.name}/{args.action}", payload
    request = urllib.request.Request(
        args.url.rstrip("/") + path,
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    key = args.key or os.environ.get("NMT_KEY")
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=600) as answer:  # a load may take a while
            print(json.dumps(json.loads(answer.read()), indent=2))
            return 0
    except urllib.error.HTTPError as refused:
        text = refused.read().decode(errors="replace")
        with contextlib.suppress(ValueError, AttributeError):  # not JSON: shown as it came
            text = json.dumps(json.loads(text).get("detail", text))
        print(f"nmt models {args.action}: {refused.code} {text}", file=sys.stderr)
        return 1
    except urllib.error.URLError as unreachable:
        print(f"nmt models: cannot reach {args.url}: {unreachable.reason}", file=sys.stderr)
        return 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nmt", description="nmt-serve: neural machine translation"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    subparsers = parser.add_subparsers(dest="command", required=True)
    _add_train(subparsers)

    export = subparsers.add_parser("export", help="export a model directory to an ONNX bundle")
    export.add_argument("--checkpoint", type=Path, default=Path("models/fr-en"))
    export.add_argument("--out", type=Path, required=True, help="bundle directory to write")
    export.add_argument("--int8", action="store_true", help="also write int8 quantized graphs")
    export.add_argument(
        "--description",
        help="what the model was trained on and is for, shown by /v1/models and the web page "
        "(default: the checkpoint's description.txt)",
    )

    shortlist = subparsers.add_parser(
        "shortlist",
        help="build a model's vocabulary shortlist from its parallel training corpus "
        "(written into the model directory; `nmt export` then adds it to the bundle)",
    )
    shortlist.add_argument("--checkpoint", type=Path, default=Path("models/fr-en"))
    shortlist.add_argument(
        "--data", type=Path, help="corpus directory (default: Multi30k, $NMT_DATA_DIR)"
    )
    shortlist.add_argument("--prefix", default="train", help="file prefix: PREFIX.fr, PREFIX.en")
    shortlist.add_argument(
        "--per-source", type=int, default=20, help="candidates kept per source word"
    )
    shortlist.add_argument(
        "--always", type=int, default=200, help="most frequent target words always allowed"
    )
    shortlist.add_argument("--out", type=Path, help="default: CHECKPOINT/shortlist.npz")

    translate = subparsers.add_parser(
        "translate", help="translate stdin, one sentence per line, to stdout in the same order"
    )
    _add_decoding_options(translate)

    evaluate = subparsers.add_parser("eval", help="BLEU and chrF (sacrebleu) as JSON")
    _add_decoding_options(evaluate)
    evaluate.add_argument("--src", type=Path, help="source file to translate")
    evaluate.add_argument("--hyp", type=Path, help="translations to score instead")
    evaluate.add_argument("--ref", type=Path, required=True, help="reference translations")
    calibrate = subparsers.add_parser(
        "calibrate",
        help="fit a bundle's confidence.json on held-out sentences (default: Multi30k val)",
    )
    calibrate.add_argument("--model-dir", type=Path, required=True, help="the bundle")
    calibrate.add_argument("--source", type=Path, help="held-out sources (one per line)")
    calibrate.add_argument("--reference", type=Path, help="their reference translations")
    calibrate.add_argument("--good-chrf", type=float, default=50.0, help="what 'good' means")
    calibrate.add_argument("--beam-size", type=int, default=4, help="the beam search fitted")
    calibrate.add_argument("--batch-size", type=int, default=32)
    calibrate.add_argument("--int8", action="store_true", help="fit on the int8 graphs")
    calibrate.add_argument("--threads", type=int, default=0, help="ONNX Runtime threads")
    calibrate.add_argument("--source-lang", help="a multilingual bundle's source language")
    calibrate.add_argument("--target-lang", help="a multilingual bundle's target language")
    calibrate.add_argument(
        "--jackknife",
        type=Path,
        nargs="+",
        help="learn a lexicon from `nmt jackknife`'s labels there (several: pooled)",
    )
    calibrate.add_argument("--out", type=Path, help="default: <model-dir>/confidence.json")
    _add_jackknife(subparsers)
    _add_serve(subparsers)
    _add_models(subparsers)
    _add_db(subparsers)
    _add_marian(subparsers)
    return parser


COMMANDS = {
    "train": _cmd_train,
    "export": _cmd_export,
    "shortlist": _cmd_shortlist,
    "translate": _cmd_translate,
    "eval": _cmd_eval,
    "calibrate": _cmd_calibrate,
    "jackknife": _cmd_jackknife,
    "serve": _cmd_serve,
    "models": _cmd_models,
    "db": _cmd_db,
    "import-hf": _cmd_import_hf,
    "import-marian": _cmd_import_hf,
    "export-hf": _cmd_export_hf,
    "export-marian": _cmd_export_hf,
}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose or args.command == "train" else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    return COMMANDS[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
