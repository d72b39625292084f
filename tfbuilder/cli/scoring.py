"""The verbs that score or label with a checkpoint: ``test`` (loss, perplexity, BLEU/chrF of a split;
the scores of a sequence head) and ``predict`` (each text's label or number, as JSON Lines)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from tfbuilder import atomic
from tfbuilder.cli.arguments import (
    add_alpha,
    add_checkpoint,
    add_checkpoints,
    add_device,
    add_precision,
    add_rules,
    beam,
    new_file,
    positive_int,
    readable_file,
)
from tfbuilder.cli.loading import load, load_all
from tfbuilder.errors import TfbuilderError
from tfbuilder.runs.checkpoints import Loaded, display_path
from tfbuilder.train.shown import show

if TYPE_CHECKING:  # the scorers (and torch) are imported in the commands (start-up time)
    from tfbuilder.cli.arguments import Subparsers
    from tfbuilder.inference.translate import Precision
    from tfbuilder.spec.head import HeadSection
    from tfbuilder.use.evaluation import Scores


def add_predict(sub: Subparsers) -> None:
    pd = sub.add_parser(
        "predict",
        help="label (and probabilities) or number of each text, "
        "with a checkpoint that has a sequence head (model.head)",
    )
    pd.add_argument("checkpoint", metavar="RUN_OR_CKPT", help="a run directory or a checkpoint file")
    add_checkpoint(pd)
    pd.add_argument(
        "--input",
        "-i",
        required=True,
        metavar="FILE",
        help="the texts: .jsonl, .csv or .tsv records (optionally .gz) read through the run's data.columns, "
        "any other file one text per line; - reads standard input",
    )
    pd.add_argument(
        "--output", "-o", metavar="FILE", help="write JSON Lines to FILE (must not exist) instead of standard output"
    )
    pd.add_argument(
        "--batch-size", type=positive_int, default=64, metavar="N", help="texts per forward pass (default 64)"
    )
    add_device(pd)
    pd.set_defaults(run=cmd_predict)


def add_test(sub: Subparsers) -> None:
    e = sub.add_parser(
        "test",
        help="loss, perplexity and (translation) sacreBLEU/chrF of a checkpoint; "
        "accuracy and macro-F1 (or MSE and Pearson) of a sequence head",
    )
    add_checkpoints(e, "are scored")
    add_checkpoint(e)
    e.add_argument(
        "--split",
        default="test",
        choices=["train", "val", "test"],
        help="which split of the recipe's data (default test)",
    )
    e.add_argument(
        "--beam",
        type=beam,
        default=4,
        help="beam size of the translations scored (1: greedy; default 4, the paper's)",
    )
    add_alpha(e)
    add_precision(e)
    add_rules(e)
    e.add_argument(
        "--output",
        "-o",
        metavar="FILE",
        help="also write the translations to FILE (must not exist), in the split's order: "
        "one hypothesis per line, or see --output-format",
    )
    e.add_argument(
        "--output-format",
        choices=["plain", "fairseq"],
        default="plain",
        help="plain: one detokenized hypothesis per line; fairseq: S-i source, T-i reference, "
        "H-i score and hypothesis, tab-separated (fairseq-generate's layout)",
    )
    add_device(e)
    e.set_defaults(run=cmd_test)


def cmd_test(args: argparse.Namespace) -> int:
    from tfbuilder.inference.translate import Search  # deferred: start-up time
    from tfbuilder.use.evaluation import evaluate_outputs, write_outputs  # deferred: start-up time

    if args.output is not None:
        new_file(args.output, "--output")
    loaded, *others = load_all(args)
    head = loaded.recipe.model.head
    if head is not None:
        return _test_head(args, loaded, head, others)
    try:
        search = Search(
            beam=args.beam, alpha=args.alpha, unk_penalty=args.unk_penalty, no_repeat_ngram=args.no_repeat_ngram
        )
        scores, outputs = evaluate_outputs(loaded, args.split, search=search, precision=args.precision, ensemble=others)
    except ValueError as exc:
        raise TfbuilderError(str(exc)) from None
    rows = [("checkpoint", loaded.describe())] + [("ensembled with", o.describe()) for o in others]
    rows += _score_rows(scores, bf16=args.precision == "bf16")
    width = max(len(k) for k, _ in rows)
    print("\n".join(f"{k.ljust(width)}  {v}" for k, v in rows))
    out = _save_scores_new(loaded, scores)
    print(f"{'saved'.ljust(width)}  {display_path(out)}")
    if args.output is not None:
        if not outputs:
            raise TfbuilderError(f"--output: a '{loaded.recipe.model.kind}' model translates nothing to write")
        try:
            write_outputs(outputs, args.output, layout=args.output_format)
        except OSError as exc:
            raise TfbuilderError(f"--output {args.output}: {exc.strerror or exc}") from None
        print(f"{'translations'.ljust(width)}  {display_path(args.output)}")
    return 0


def _score_rows(scores: Scores, *, bf16: bool) -> list[tuple[str, str]]:
    """``test``'s table of a split's scores: (name, value) rows, the decoding named beside its scores."""
    rows = [("split", f"{scores.split} ({scores.examples:,} examples)")]
    rows += [("loss", f"{scores.loss:.4f}"), ("perplexity", f"{scores.perplexity:.2f}")]
    rows += [("token accuracy", f"{scores.accuracy:.2%} (teacher forcing)")]
    decoded = f"beam {scores.beam}" + (", bf16" if bf16 else "")
    if scores.exact_match is not None:
        rows += [(f"exact match ({decoded})", f"{scores.exact_match:.2%} of outputs equal their reference")]
    if scores.bleu is not None:
        level = "character-level " if scores.bleu_tokenize == "char" else ""
        rows += [(f"{level}sacreBLEU ({decoded})", f"{scores.bleu:.2f}"), ("chrF", f"{scores.chrf:.2f}")]
        rows += [("signature", f"{scores.bleu_signature}")]  # set with the BLEU
    elif scores.exact_match is not None:
        rows += [
            (
                "sacreBLEU",
                "not computed: a synthetic task's outputs are not language (exact match and accuracy are the scores)",
            )
        ]
    if scores.seconds_decoding is not None:
        rows += [("decoding time", f"{scores.seconds_decoding:.1f} s")]
    return rows


HEAD_SCORES = {"acc": "accuracy", "f1": "macro-F1", "mse": "MSE", "pearson": "Pearson r"}


def _test_head(args: argparse.Namespace, loaded: Loaded, head: HeadSection, others: list[Loaded]) -> int:
    """``tfbuilder test`` of a checkpoint with a sequence head: loss and its scores on a split."""
    from tfbuilder.use.predict import score  # deferred: start-up time

    if others:
        raise TfbuilderError("test: ensembles are for translation; give one checkpoint with a sequence head")
    if args.output is not None:
        raise TfbuilderError(
            "test --output writes translations; a sequence head's predictions come from tfbuilder predict"
        )
    result = score(loaded, args.split)
    loss = "cross-entropy per text" if head.type == "classify" else "squared error per text"
    rows = [
        ("checkpoint", loaded.describe()),
        ("split", f"{result.split} ({result.examples:,} examples)"),
        ("loss", f"{result.loss:.4f} ({loss})"),
    ]
    rows += [(HEAD_SCORES[k], show(f"val_{k}", v)) for k, v in result.scores.items()]
    width = max(len(k) for k, _ in rows)
    print("\n".join(f"{k.ljust(width)}  {v}" for k, v in rows))
    return 0


def cmd_predict(args: argparse.Namespace) -> int:
    from tfbuilder.use.predict import lines, predict, read_inputs  # deferred: start-up time

    if args.input != "-":
        readable_file(args.input, "--input")
    if args.output is not None:
        new_file(args.output, "--output")
    loaded = load(args)
    answers = lines(predict(loaded, read_inputs(loaded, args.input), batch=args.batch_size))
    if args.output is None:
        for line in answers:
            sys.stdout.write(line)
        return 0
    with atomic.text_file(args.output, what="predictions") as out:  # whole, or nothing on an error
        for line in answers:
            out.write(line)
    print(f"predictions: {args.output}", file=sys.stderr)
    return 0


def _save_scores_new(loaded: Loaded, scores: Scores) -> Path:
    """Write the scores JSON (:func:`tfbuilder.use.evaluation.save_scores`: an earlier file is never
    replaced), and say so when the usual name was taken."""
    from tfbuilder.use.evaluation import save_scores, scores_path  # deferred: start-up time

    try:
        written = save_scores(loaded, scores)
    except FileExistsError as exc:
        raise TfbuilderError(str(exc)) from None
    precision: Precision = "bf16" if scores.precision == "bf16" else "32"
    path = scores_path(loaded, scores.split, scores.beam, precision, ensemble=len(scores.ensemble or ()) or 1)
    if written != path:
        print(f"{path} exists: not overwriting it; wrote {written.name} instead", file=sys.stderr)
    return written
