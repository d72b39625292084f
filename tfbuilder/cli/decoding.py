"""The verbs that decode with a checkpoint: ``translate`` (lines, streamed as they come), ``generate``
(continue a prompt) and ``attention`` (heatmaps of the attention weights)."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator
from typing import IO, TYPE_CHECKING, BinaryIO

from tfbuilder.cli.arguments import (
    add_alpha,
    add_checkpoint,
    add_checkpoints,
    add_device,
    add_precision,
    add_rules,
    add_sampling,
    beam,
    count,
    directory_arg,
    new_file,
    positive_int,
    readable_file,
)
from tfbuilder.cli.loading import load, load_all
from tfbuilder.data.tokenizers import Tokenizer, unknown
from tfbuilder.devices import model_device
from tfbuilder.errors import TfbuilderError
from tfbuilder.inference.decoding import Rules
from tfbuilder.runs.checkpoints import Loaded
from tfbuilder.streams import NotText, batches

if TYPE_CHECKING:  # torch and the decoders are imported in the commands (start-up time)
    from torch import nn

    from tfbuilder.cli.arguments import Subparsers
    from tfbuilder.inference.translate import Search


def add_translate(sub: Subparsers) -> None:
    t = sub.add_parser(
        "translate",
        help="translate lines with a checkpoint "
        "(stdin to stdout by default; typed or piped lines are answered as they come)",
    )
    add_checkpoints(t, "translate")
    add_checkpoint(t)
    t.add_argument("--beam", type=beam, default=4, help="beam size (1: greedy; default 4, the paper's)")
    add_alpha(t)
    t.add_argument(
        "--nbest",
        type=beam,
        default=1,
        metavar="N",
        help="write the N best candidates of each line as 'LINE ||| TEXT ||| SCORE' "
        "(line numbers from 0; at most the beam, or N samples)",
    )
    t.add_argument(
        "--sample", action="store_true", help="draw translations at random from the model instead of searching"
    )
    add_sampling(t, what="--sample")
    add_rules(t)
    t.add_argument(
        "--batch-size",
        type=positive_int,
        metavar="N",
        help="at most N sentences per batch (default: no limit but --max-tokens)",
    )
    t.add_argument(
        "--max-tokens",
        type=positive_int,
        default=6000,
        metavar="N",
        help="at most N source tokens per batch, all beams together (default 6000)",
    )
    add_precision(t)
    t.add_argument("--input", "-i", metavar="FILE", help="read lines from FILE instead of standard input")
    t.add_argument("--output", "-o", metavar="FILE", help="write to FILE (must not exist) instead of standard output")
    add_device(t)
    t.set_defaults(run=cmd_translate)


def add_generate(sub: Subparsers) -> None:
    g = sub.add_parser("generate", help="continue a prompt with a decoder-only checkpoint")
    g.add_argument("checkpoint", metavar="RUN_OR_CKPT", help="a run directory or a checkpoint file")
    add_checkpoint(g)
    g.add_argument(
        "--prompt",
        required=True,
        action="append",
        metavar="TEXT",
        help="the text to continue; repeated, the prompts are continued together, left-padded to one batch, "
        "one line each",
    )
    g.add_argument(
        "--no-echo", dest="echo", action="store_false", help="print only the new text (default: the prompt, then it)"
    )
    g.add_argument(
        "--max-new",
        type=count,
        default=100,
        metavar="N",
        help="at most N new tokens (default 100; fewer when </s> comes)",
    )
    g.add_argument(
        "--beam",
        type=beam,
        default=1,
        help="beam size (default 1: sample, or greedy at --temperature 0; above 1 beam search, which ignores the "
        "sampling options)",
    )
    add_alpha(g)
    add_sampling(g, what="generation")
    add_rules(g)
    add_device(g)
    g.set_defaults(run=cmd_generate)


def add_attention(sub: Subparsers) -> None:
    at = sub.add_parser("attention", help="PNG heatmaps of a checkpoint's attention weights, per layer and head")
    at.add_argument("checkpoint", metavar="RUN_OR_CKPT", help="a run directory or a checkpoint file")
    add_checkpoint(at)
    at.add_argument("--src", required=True, metavar="TEXT", help="the source sentence (the text, for one-stack models)")
    at.add_argument("--tgt", metavar="TEXT", help="the target sentence (default: the model's greedy translation)")
    at.add_argument("--layers", type=int, nargs="+", metavar="N", help="only these layers (0-based; default all)")
    at.add_argument(
        "--out", default="attention-maps", metavar="DIR", help="directory for the PNGs (default attention-maps)"
    )
    add_device(at)
    at.set_defaults(run=cmd_attention)


def cmd_translate(args: argparse.Namespace) -> int:
    from tfbuilder.inference.translate import decoding_model, ensemble_of  # deferred: start-up time

    # Arguments first: a bad path or option is reported before a checkpoint is loaded.
    if args.input is not None and args.input != "-":
        readable_file(args.input, "--input")
    if args.output is not None:
        new_file(args.output, "--output")
    search = _search(args)
    loaded, *others = load_all(args)
    if loaded.recipe.model.kind != "encoder_decoder":
        raise TfbuilderError(
            f"translate needs an encoder_decoder checkpoint; this one is '{loaded.recipe.model.kind}' (try generate)"
        )
    try:
        model = ensemble_of(loaded, others) if others else loaded.model
    except ValueError as exc:
        raise TfbuilderError(str(exc)) from None
    with contextlib.ExitStack() as stack:  # closes what it opened, never the standard streams
        source, name = _open_source(args, stack)
        sink = _open_sink(args, stack)
        try:
            _translate_stream(args, loaded, decoding_model(model, args.precision), search, source, sink, name)
        except NotText as exc:
            _drop_if_empty(args.output, sink)
            raise TfbuilderError(f"{name} {exc}") from None
        except BaseException:
            _drop_if_empty(args.output, sink)
            raise
    return 0


def _drop_if_empty(output: str | None, sink: IO[str]) -> None:
    """Remove the ``--output`` file this run made when nothing was written into it (a translation that
    failed before its first line leaves no empty file behind; one that wrote lines keeps them)."""
    if output is None or sink is sys.stdout:
        return
    with contextlib.suppress(OSError):
        if sink.tell() == 0:
            os.unlink(output)


def _search(args: argparse.Namespace) -> Search:
    """The search (or sampling) that ``translate``'s options ask for; their conflicts are usage errors."""
    from tfbuilder.inference.translate import Search  # deferred: start-up time

    try:
        return Search(
            beam=args.beam,
            alpha=args.alpha,
            nbest=args.nbest,
            sample=args.sample,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            unk_penalty=args.unk_penalty,
            no_repeat_ngram=args.no_repeat_ngram,
        )
    except ValueError as exc:
        raise TfbuilderError(str(exc)) from None


def _open_source(args: argparse.Namespace, stack: contextlib.ExitStack) -> tuple[BinaryIO, str]:
    """The lines to translate (``--input``, else standard input) and their name in messages."""
    if args.input and args.input != "-":
        return stack.enter_context(open(args.input, "rb")), args.input
    return sys.stdin.buffer, "standard input"


def _open_sink(args: argparse.Namespace, stack: contextlib.ExitStack) -> IO[str]:
    """Where translations go: a new ``--output`` file (never one that exists), else standard output."""
    if not args.output:
        return sys.stdout
    try:
        return stack.enter_context(open(args.output, "x", encoding="utf-8"))
    except FileExistsError:
        raise TfbuilderError(f"{args.output} exists: not overwriting it") from None
    except OSError as exc:
        raise TfbuilderError(f"--output {args.output}: {exc.strerror or exc}") from None


def _translate_stream(
    args: argparse.Namespace,
    loaded: Loaded,
    model: nn.Module,
    search: Search,
    source: BinaryIO,
    sink: IO[str],
    name: str,
) -> None:
    """Translate ``source`` batch by batch, writing each batch's answers as soon as they are found."""
    import torch

    from tfbuilder.inference.translate import source_limit, translate_batch  # deferred: start-up time

    generator = torch.Generator(device=model_device(model)).manual_seed(args.seed) if args.sample else None
    number = 0
    limit = source_limit(loaded)

    def cut(i: int, tokens: int) -> None:
        print(
            f"translate: line {number + i}: {tokens:,} tokens; translating its first {limit:,} (the most the "
            "model reads)",
            file=sys.stderr,
        )

    for lines in _read(batches(source, most=args.batch_size or 512), name):
        _warn_unknown(loaded.vocab.src, lines, first=number)
        found = translate_batch(
            model,
            loaded.vocab,
            lines,
            search=search,
            max_tokens=args.max_tokens,
            batch_size=args.batch_size,
            generator=generator,
            max_source=limit,
            cut=cut,
        )
        for candidates in found:
            if args.nbest == 1:
                sink.write(candidates[0][0] + "\n")
            else:
                sink.writelines(f"{number} ||| {text} ||| {score:.4f}\n" for text, score in candidates)
            number += 1
        sink.flush()  # each batch's answers now: someone may be waiting for them


def _read(lines: Iterator[list[str]], name: str) -> Iterator[list[str]]:
    """``lines``, with an error reading them (``/proc/self/mem``, a disk failing) said about ``name``."""
    while True:
        try:
            batch = next(lines)
        except StopIteration:
            return
        except OSError as exc:
            raise TfbuilderError(f"cannot read {name}: {exc.strerror or exc}") from None
        yield batch


def _warn_unknown(tokenizer: Tokenizer, lines: list[str], *, first: int) -> None:
    """Say which characters the model cannot read (they become <unk>), line by line, on stderr."""

    for number, line in enumerate(lines, start=first):
        missing = unknown(tokenizer, line)
        if missing:
            shown = " ".join(repr(c) for c in missing[:10]) + (" ..." if len(missing) > 10 else "")
            print(f"translate: line {number}: not in the vocabulary, read as <unk>: {shown}", file=sys.stderr)


def cmd_generate(args: argparse.Namespace) -> int:
    import torch

    from tfbuilder.inference.translate import generate_batch  # deferred: start-up time

    loaded = load(args)
    if loaded.recipe.model.kind != "decoder":
        raise TfbuilderError(f"generate needs a decoder-only checkpoint; this one is '{loaded.recipe.model.kind}'")
    rng = torch.Generator().manual_seed(args.seed)
    rules = Rules(unk_penalty=args.unk_penalty, no_repeat_ngram=args.no_repeat_ngram)
    try:
        texts = generate_batch(
            loaded,
            args.prompt,
            max_new=args.max_new,
            beam=args.beam,
            alpha=args.alpha,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            generator=rng,
            rules=rules,
            echo=args.echo,
        )
    except ValueError as exc:  # a model with nothing to start or end with
        raise TfbuilderError(str(exc)) from None
    for text in texts:
        print(text)
    return 0


def cmd_attention(args: argparse.Namespace) -> int:
    from pathlib import Path

    from tfbuilder.use.attention_maps import write_maps  # deferred: start-up time

    directory_arg(args.out, "--out")
    loaded = load(args)
    for path in write_maps(loaded, args.src, tgt=args.tgt, out_dir=Path(args.out), layers=args.layers):
        print(path)
    return 0
