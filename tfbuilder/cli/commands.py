"""The ``tfbuilder`` command: parses arguments, calls the API, prints. No model logic here."""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import math
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from tfbuilder import atomic, plugins, registry
from tfbuilder.atomic import write_new_text
from tfbuilder.data.prepare import prepare, summary_lines
from tfbuilder.data.tokenizers import unknown
from tfbuilder.devices import model_device
from tfbuilder.errors import RecipeError, TfbuilderError, printable
from tfbuilder.inference.decoding import Rules
from tfbuilder.model.builder import build_model, count_parameters
from tfbuilder.model.module_tree import format_tree, kv_cache_per_token, tree
from tfbuilder.runs.averaging import write_average
from tfbuilder.runs.checkpoints import CHOICES, Interrupted, display_path, load_checkpoint, read_checkpoint
from tfbuilder.spec.diffing import differences, format_table
from tfbuilder.spec.recipe import json_schema, load_recipe, recipe_from_dict
from tfbuilder.streams import NotText, batches
from tfbuilder.version import __version__

if TYPE_CHECKING:  # the CLI imports the recipe schema (and torch) only in the commands that need them
    from tfbuilder.spec.recipe import Recipe

EXIT_USAGE = 2


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _count(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 1_000_000:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1,000,000, got {value}")
    return value


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
    return value


def _temperature(text: str) -> float:
    value = _finite(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 (greedy) or more, got {text}")
    return value


MAX_ALPHA = 10.0  # GNMT tunes alpha in [0, 1]; far beyond, ((5 + |y|) / 6) ** alpha only overflows


def _alpha(text: str) -> float:
    value = _finite(text)
    if not 0 <= value <= MAX_ALPHA:
        raise argparse.ArgumentTypeError(f"must be between 0 and {MAX_ALPHA:g}, got {text}")
    return value


def _probability(text: str) -> float:
    value = _finite(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return value


def _seed(text: str) -> int:
    value = int(text)
    if not 0 <= value < 2**63:
        raise argparse.ArgumentTypeError(f"must be in [0, 2^63), got {value}")
    return value


for _f, _name in (
    (_positive_int, "a positive integer"),
    (_count, "an integer"),
    (_finite, "a number"),
    (_temperature, "a number"),
    (_alpha, "a number"),
    (_probability, "a number"),
    (_seed, "an integer"),
):
    _f.__name__ = _name  # argparse says "invalid a positive integer value: 'x'"


def _add_set(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a recipe value, e.g. --set model.encoder.layers=2 (value parsed as YAML)",
    )


def _add_device(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--device",
        metavar="DEVICE",
        help="where the model runs: cpu, cuda, cuda:N or mps (default: a GPU when present, else the CPU)",
    )


def _add_rules(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--unk-penalty",
        type=_finite,
        default=0.0,
        metavar="X",
        help="take X from the log-probability of <unk> at every step (default 0; negative favours it)",
    )
    p.add_argument(
        "--no-repeat-ngram-size",
        type=_count,
        default=0,
        metavar="N",
        dest="no_repeat_ngram",
        help="no N-gram occurs twice in an output (default 0: off)",
    )


def _add_checkpoints(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument(
        "checkpoint",
        metavar="RUN_OR_CKPT",
        nargs="+",
        help=f"a run directory or a checkpoint file; several {what} as an ensemble (the mean of their probabilities; one vocabulary)",
    )


def _add_sampling(p: argparse.ArgumentParser, *, what: str) -> None:
    p.add_argument(
        "--temperature",
        type=_temperature,
        default=1.0,
        help=f"softmax temperature of {what} (default 1; 0 always takes the most likely token)",
    )
    p.add_argument(
        "--top-k",
        type=_positive_int,
        metavar="K",
        help=f"{what} draws from the K most likely tokens only (default: all)",
    )
    p.add_argument(
        "--top-p",
        type=_probability,
        metavar="P",
        help=f"nucleus sampling: {what} draws from the most likely tokens holding this share of probability, in (0, 1] (default 1)",
    )
    p.add_argument(
        "--seed", type=_seed, default=0, help="seed of the random draws (default 0: the same output each run)"
    )


def _add_checkpoint(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--checkpoint",
        dest="which",
        metavar="last|best|averaged|PATH",
        help="which checkpoint of a run directory (default best), or a checkpoint file",
    )


def _load(args: argparse.Namespace, path: str | None = None):
    """The checkpoint a command uses (of ``path``, default ``args.checkpoint``), named on standard
    error (the output says what it scored)."""

    loaded = load_checkpoint(path or args.checkpoint, checkpoint=args.which, device=getattr(args, "device", None))
    print(f"checkpoint: {loaded.describe()}", file=sys.stderr)
    if loaded.recipe.model.head is not None and args.command in ("translate", "generate", "attention"):
        raise TfbuilderError(
            f"{args.command}: {loaded.describe()} has a sequence head (model.head: {loaded.recipe.model.head.type}): it labels texts; use tfbuilder predict"
        )
    return loaded


def _load_all(args: argparse.Namespace) -> list:
    """The checkpoints of a command that takes several (an ensemble), each named on standard error."""

    if len(args.checkpoint) > 1 and args.which is not None and args.which not in CHOICES:
        raise TfbuilderError(
            f"--checkpoint {args.which} names one file, but {len(args.checkpoint)} checkpoints were given"
        )
    return [_load(args, path) for path in args.checkpoint]


def version_line() -> str:
    """``tfbuilder 0.1.0 (torch 2.13.0, lightning 2.6.0, Python 3.11.9)``, without importing torch."""
    from importlib.metadata import PackageNotFoundError, version

    def installed(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"

    return f"tfbuilder {__version__} (torch {installed('torch')}, lightning {installed('lightning')}, Python {sys.version.split()[0]})"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tfbuilder", description="Declarative transformers from YAML recipes.")
    p.add_argument(
        "--version",
        action="version",
        version=version_line(),
        help="the versions of tfbuilder, torch and lightning, and exit",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    v = sub.add_parser("validate", help="check recipes; print OK or every problem (exit 0 or 2)")
    v.add_argument("recipes", nargs="+", metavar="RECIPE", help="recipe files (YAML)")
    _add_set(v)
    v.set_defaults(run=cmd_validate)

    s = sub.add_parser("show", help="the resolved recipe, the module tree and parameter counts")
    s.add_argument("recipe", metavar="RECIPE", help="a recipe file (YAML)")
    s.add_argument("--depth", type=_count, default=4, help="depth of the module tree (default 4)")
    _add_set(s)
    s.set_defaults(run=cmd_show)

    f = sub.add_parser("fit", help="train a recipe (or resume a run) through Lightning")
    f.add_argument(
        "recipe", nargs="?", metavar="RECIPE", help="the recipe to train (not with --resume: a run keeps its recipe)"
    )
    f.add_argument("--resume", metavar="RUN_OR_CKPT", help="continue a run directory or checkpoint")
    f.add_argument(
        "--init-from", metavar="CHECKPOINT", help="start a new run from these weights (fresh optimizer and schedule)"
    )
    f.add_argument("--force", action="store_true", help="resume a run directory that was copied or moved")
    _add_set(f)
    f.set_defaults(run=cmd_fit)

    pr = sub.add_parser("prepare", help="tokenize a recipe's data once into a store on disk (fit does it when needed)")
    pr.add_argument("recipe", metavar="RECIPE", help="a recipe file (YAML)")
    _add_set(pr)
    pr.set_defaults(run=cmd_prepare)

    av = sub.add_parser(
        "average", help="average the weights of a run's last N kept checkpoints (Vaswani et al. sec. 6.1)"
    )
    av.add_argument("run_dir", metavar="RUN_DIR", help="a run directory trained with trainer.keep_last")
    av.add_argument("--last", type=int, default=5, metavar="N", help="how many of the kept checkpoints (default 5)")
    av.add_argument(
        "--out", metavar="FILE", help="where to write (default RUN_DIR/checkpoints/averaged.ckpt; never overwritten)"
    )
    av.set_defaults(run=cmd_average)

    t = sub.add_parser(
        "translate",
        help="translate lines with a checkpoint (stdin to stdout by default; typed or piped lines are answered as they come)",
    )
    _add_checkpoints(t, "translate")
    _add_checkpoint(t)
    t.add_argument("--beam", type=_positive_int, default=4, help="beam size (1: greedy; default 4, the paper's)")
    t.add_argument(
        "--alpha",
        type=_alpha,
        default=0.6,
        help="length penalty exponent of beam search, 0 to 10 (default 0.6, the paper's)",
    )
    t.add_argument(
        "--nbest",
        type=_positive_int,
        default=1,
        metavar="N",
        help="write the N best candidates of each line as 'LINE ||| TEXT ||| SCORE' (line numbers from 0; at most the beam, or N samples)",
    )
    t.add_argument(
        "--sample", action="store_true", help="draw translations at random from the model instead of searching"
    )
    _add_sampling(t, what="--sample")
    _add_rules(t)
    t.add_argument(
        "--batch-size",
        type=_positive_int,
        metavar="N",
        help="at most N sentences per batch (default: no limit but --max-tokens)",
    )
    t.add_argument(
        "--max-tokens",
        type=_positive_int,
        default=6000,
        metavar="N",
        help="at most N source tokens per batch, all beams together (default 6000)",
    )
    t.add_argument("--precision", choices=["32", "bf16"], default="32", help="decode in float32 (default) or bfloat16")
    t.add_argument("--input", "-i", metavar="FILE", help="read lines from FILE instead of standard input")
    t.add_argument("--output", "-o", metavar="FILE", help="write to FILE (must not exist) instead of standard output")
    _add_device(t)
    t.set_defaults(run=cmd_translate)

    g = sub.add_parser("generate", help="continue a prompt with a decoder-only checkpoint")
    g.add_argument("checkpoint", metavar="RUN_OR_CKPT", help="a run directory or a checkpoint file")
    _add_checkpoint(g)
    g.add_argument("--prompt", required=True, metavar="TEXT", help="the text to continue")
    g.add_argument(
        "--max-new",
        type=_count,
        default=100,
        metavar="N",
        help="at most N new tokens (default 100; fewer when </s> comes)",
    )
    _add_sampling(g, what="generation")
    _add_rules(g)
    _add_device(g)
    g.set_defaults(run=cmd_generate)

    pd = sub.add_parser(
        "predict",
        help="label (and probabilities) or number of each text, with a checkpoint that has a sequence head (model.head)",
    )
    pd.add_argument("checkpoint", metavar="RUN_OR_CKPT", help="a run directory or a checkpoint file")
    _add_checkpoint(pd)
    pd.add_argument(
        "--input",
        "-i",
        required=True,
        metavar="FILE",
        help="the texts: .jsonl, .csv or .tsv records (optionally .gz) read through the run's data.columns, any other file one text per line; - reads standard input",
    )
    pd.add_argument(
        "--output", "-o", metavar="FILE", help="write JSON Lines to FILE (must not exist) instead of standard output"
    )
    pd.add_argument(
        "--batch-size", type=_positive_int, default=64, metavar="N", help="texts per forward pass (default 64)"
    )
    _add_device(pd)
    pd.set_defaults(run=cmd_predict)

    e = sub.add_parser(
        "test",
        help="loss, perplexity and (translation) sacreBLEU/chrF of a checkpoint; accuracy and macro-F1 (or MSE and Pearson) of a sequence head",
    )
    _add_checkpoints(e, "are scored")
    _add_checkpoint(e)
    e.add_argument(
        "--split",
        default="test",
        choices=["train", "val", "test"],
        help="which split of the recipe's data (default test)",
    )
    e.add_argument(
        "--beam",
        type=_positive_int,
        default=4,
        help="beam size of the translations scored (1: greedy; default 4, the paper's)",
    )
    e.add_argument(
        "--alpha",
        type=_alpha,
        default=0.6,
        help="length penalty exponent of beam search, 0 to 10 (default 0.6, the paper's)",
    )
    e.add_argument("--precision", choices=["32", "bf16"], default="32", help="decode in float32 (default) or bfloat16")
    _add_rules(e)
    e.add_argument(
        "--output",
        "-o",
        metavar="FILE",
        help="also write the translations to FILE (must not exist), in the split's order: one hypothesis per line, or see --output-format",
    )
    e.add_argument(
        "--output-format",
        choices=["plain", "fairseq"],
        default="plain",
        help="plain: one detokenized hypothesis per line; fairseq: S-i source, T-i reference, H-i score and hypothesis, tab-separated (fairseq-generate's layout)",
    )
    _add_device(e)
    e.set_defaults(run=cmd_test)

    df = sub.add_parser("diff", help="the resolved differences between two recipes, key by key")
    df.add_argument("a", metavar="A.yaml", help="the first recipe")
    df.add_argument("b", metavar="B.yaml", help="the second recipe")
    df.set_defaults(run=cmd_diff)

    c = sub.add_parser("components", help="registered components with their params")
    c.add_argument("family", nargs="?", choices=registry.FAMILIES, help="only this family (default all)")
    c.set_defaults(run=cmd_components)

    w = sub.add_parser("sweep", help="train recipes over seeds into one directory; write a comparison report")
    w.add_argument(
        "recipes",
        nargs="+",
        metavar="RECIPE",
        help="the recipes to compare (the first is the baseline unless --baseline)",
    )
    w.add_argument("--seeds", type=_positive_int, default=1, help="seeds 0..N-1 for every recipe (default 1)")
    w.add_argument("--out", metavar="DIR", help="sweep directory (default <trainer.output>/sweeps/<recipes' folder>)")
    w.add_argument(
        "--beam", type=_positive_int, default=4, help="beam of the validation BLEU after training (default 4)"
    )
    w.add_argument("--no-bleu", action="store_true", help="skip the validation BLEU")
    w.add_argument(
        "--baseline", metavar="NAME", help="recipe name the 'changes' column is relative to (default the first)"
    )
    w.add_argument("--dry-run", action="store_true", help="say what would run, and stop")
    _add_set(w)
    w.set_defaults(run=cmd_sweep)

    cp = sub.add_parser("compare", help="the sweep report from existing runs (run, sweep or output directories)")
    cp.add_argument(
        "dirs",
        nargs="+",
        metavar="RUN_DIR",
        help="run directories, sweep directories or output directories holding runs",
    )
    cp.add_argument(
        "--out", metavar="DIR", help="also write report.md/.csv, runs.csv, curves.png into DIR (new files only)"
    )
    cp.add_argument("--beam", type=_positive_int, default=4, help="read the validation BLEU of this beam (default 4)")
    cp.add_argument(
        "--baseline", metavar="NAME", help="recipe name the 'changes' column is relative to (default the first)"
    )
    cp.set_defaults(run=cmd_compare)

    at = sub.add_parser("attention", help="PNG heatmaps of a checkpoint's attention weights, per layer and head")
    at.add_argument("checkpoint", metavar="RUN_OR_CKPT", help="a run directory or a checkpoint file")
    _add_checkpoint(at)
    at.add_argument("--src", required=True, metavar="TEXT", help="the source sentence (the text, for one-stack models)")
    at.add_argument("--tgt", metavar="TEXT", help="the target sentence (default: the model's greedy translation)")
    at.add_argument("--layers", type=int, nargs="+", metavar="N", help="only these layers (0-based; default all)")
    at.add_argument(
        "--out", default="attention-maps", metavar="DIR", help="directory for the PNGs (default attention-maps)"
    )
    _add_device(at)
    at.set_defaults(run=cmd_attention)

    ih = sub.add_parser(
        "import-hf", help="a Hugging Face model directory (GPT-2, BERT, T5, Llama) as a tfbuilder run directory"
    )
    ih.add_argument(
        "hf_dir",
        metavar="HF_DIR",
        help="a directory save_pretrained wrote: config.json, model.safetensors[, tokenizer.json]",
    )
    ih.add_argument(
        "--out", required=True, metavar="RUN_DIR", help="the run directory to write (must not exist, or be empty)"
    )
    _add_set(ih)
    ih.set_defaults(run=cmd_import_hf)

    ex = sub.add_parser("export", help="a checkpoint as safetensors, a Hugging Face directory, or ONNX")
    ex.add_argument("checkpoint", metavar="CHECKPOINT", help="a checkpoint file or a run directory")
    ex.add_argument(
        "--format",
        required=True,
        choices=["safetensors", "hf", "onnx"],
        help="safetensors: the weights; hf: a Hugging Face model directory (GPT-2, BERT, T5, Llama shapes); onnx: the forward pass",
    )
    ex.add_argument("--out", required=True, metavar="DIR", help="the directory to write (must not exist, or be empty)")
    ex.set_defaults(run=cmd_export)

    j = sub.add_parser("schema", help="JSON Schema of recipes (for editors' YAML language servers)")
    j.add_argument("--output", "-o", metavar="FILE", help="write to FILE instead of standard output")
    j.set_defaults(run=cmd_schema)
    for command in sub.choices.values():  # every command: before a recipe or a checkpoint is read
        command.add_argument(
            "--plugins",
            action="append",
            default=[],
            metavar="FILE_OR_MODULE",
            help="import a Python file or module that registers components first (repeatable; recorded in checkpoints)",
        )
    return p


def _check(path: str, overrides: Sequence[str]):
    """Load a recipe and build its model on the meta device (no memory, no time): all problems at once."""
    import torch

    recipe = load_recipe(path, overrides)
    with torch.device("meta"):
        model = build_model(recipe)
    return recipe, model


def _preflight(path: str, overrides: Sequence[str]):
    """Load a recipe and run the pre-flight (the model builds, steps, fits this machine; see preflight.py)."""
    from tfbuilder.train.preflight import check  # deferred: start-up time

    recipe = load_recipe(path, overrides)
    check(recipe)
    return recipe


def cmd_validate(args: argparse.Namespace) -> int:
    failed = False
    for path in args.recipes:
        try:
            _preflight(path, args.overrides)
        except RecipeError as exc:
            failed = True
            print("\n".join(str(p) for p in exc.problems), file=sys.stderr)
            continue
        print(f"{printable(path)}: OK")
    return EXIT_USAGE if failed else 0


def cmd_show(args: argparse.Namespace) -> int:
    recipe, model = _check(args.recipe, args.overrides)
    print(f"# resolved recipe: {args.recipe}")
    print(yaml.safe_dump(recipe.to_dict(), sort_keys=False, default_flow_style=False).rstrip())
    print()
    print("# modules (distinct parameters; tied weights counted once)")
    print(format_tree(tree(model, max_depth=args.depth)))
    print()
    print(f"total parameters: {count_parameters(model):,}")
    cached = kv_cache_per_token(model)
    if cached is not None:
        print(
            f"KV cache per generated token (every decoder layer): {cached:,} numbers, {cached * 2 / 1024:,.1f} KiB in bfloat16"
        )
    layers = _layer_lines(recipe)
    if layers:
        print()
        print("# layers (pattern and overrides)")
        print("\n".join(layers))
    if recipe.optim.optimizer == "muon":
        from tfbuilder.train.optimizers import describe_split  # deferred: start-up time

        print()
        print("# optimizers (optim.optimizer: muon)")
        print("\n".join(describe_split(model)))
    return 0


def _layer_lines(recipe: Recipe) -> list[str]:
    """Each stack with a pattern or overrides: runs of alike layers, and what each kind changes."""
    lines = []
    for part in ("encoder", "decoder"):
        stack = recipe.model.stack(part)
        if stack is None or not (stack.pattern or stack.overrides):
            continue
        labels = recipe.model.layer_kinds(part)
        runs, start = [], 0
        for i in range(1, len(labels) + 1):
            if i == len(labels) or labels[i] != labels[start]:
                span = str(start) if i - 1 == start else f"{start}-{i - 1}"
                runs.append(f"{span} {labels[start]}")
                start = i
        lines.append(f"{part}: " + ", ".join(runs))
        named = [(f"kind {name}", changes) for name, changes in stack.kinds.items()]
        named += [(f"layer {index}", changes) for index, changes in stack.overrides.items()]
        for label, changes in named:
            changed = [
                f"{family}.{key}={value}"
                for family in ("attention", "ffn", "norm")
                for key, value in (getattr(changes, family) or {}).items()
            ]
            lines.append(f"  {label}: " + (", ".join(changed) or "(the stack's components)"))
    return lines


def cmd_fit(args: argparse.Namespace) -> int:
    if (args.recipe is None) == (args.resume is None):
        print("fit: give a RECIPE, or --resume RUN_DIR_OR_CHECKPOINT", file=sys.stderr)
        return EXIT_USAGE
    if args.init_from and args.resume:
        print("fit: --init-from starts a new run from a RECIPE; --resume continues a run: give one", file=sys.stderr)
        return EXIT_USAGE
    if args.force and not args.resume:
        print("fit: --force applies to --resume", file=sys.stderr)
        return EXIT_USAGE
    if args.resume:
        recipe = recipe_from_dict(read_checkpoint(args.resume)["tfbuilder"]["recipe"], args.overrides)
    else:
        recipe = load_recipe(args.recipe, args.overrides)  # fit runs the pre-flight itself
    from tfbuilder.train.fit import fit  # deferred: start-up time

    summary = fit(recipe, resume=args.resume, init_from=args.init_from, force=args.force)
    if summary is not None and _is_rank_zero():
        print("\n".join(summary.lines()))
    return 0


def cmd_prepare(args: argparse.Namespace) -> int:
    recipe = load_recipe(args.recipe, args.overrides)
    if recipe.data is None:
        print("prepare: the recipe has no data section", file=sys.stderr)
        return EXIT_USAGE
    prepared = prepare(recipe.data, model_vocab=recipe.model.vocab_size, say=print)
    print("\n".join(summary_lines(prepared)))
    return 0


def cmd_average(args: argparse.Namespace) -> int:
    out, paths = write_average(args.run_dir, last=args.last, out=args.out)
    print("averaged " + ", ".join(p.name for p in paths))
    print(f"wrote {out}")
    return 0


def cmd_translate(args: argparse.Namespace) -> int:
    import torch

    from tfbuilder.inference.translate import (
        Search,
        decoding_model,
        ensemble_of,
        translate_batch,
    )  # deferred: start-up time

    # Arguments first: a bad path or option is reported before a checkpoint is loaded.
    if args.input is not None and args.input != "-":
        _readable_file(args.input, "--input")
    if args.output is not None:
        _new_file(args.output, "--output")
    try:
        search = Search(
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
    loaded, *others = _load_all(args)
    if loaded.recipe.model.kind != "encoder_decoder":
        raise TfbuilderError(
            f"translate needs an encoder_decoder checkpoint; this one is '{loaded.recipe.model.kind}' (try generate)"
        )
    try:
        model = ensemble_of(loaded, others) if others else loaded.model
    except ValueError as exc:
        raise TfbuilderError(str(exc)) from None
    from_file = args.input and args.input != "-"
    source = open(args.input, "rb") if from_file else sys.stdin.buffer
    name = args.input if from_file else "standard input"
    try:
        sink = open(args.output, "x", encoding="utf-8") if args.output else sys.stdout
    except FileExistsError:
        raise TfbuilderError(f"{args.output} exists: not overwriting it") from None
    except OSError as exc:
        raise TfbuilderError(f"--output {args.output}: {exc.strerror or exc}") from None
    model = decoding_model(model, args.precision)
    generator = torch.Generator(device=model_device(model)).manual_seed(args.seed) if args.sample else None
    number = 0
    with contextlib.ExitStack() as stack:  # close what we opened, never the standard streams
        for stream in (source, sink):
            if stream not in (sys.stdin.buffer, sys.stdout):
                stack.enter_context(stream)
        try:
            for lines in batches(source, most=args.batch_size or 512):
                _warn_unknown(loaded.vocab.src, lines, first=number)
                found = translate_batch(
                    model,
                    loaded.vocab,
                    lines,
                    search=search,
                    max_tokens=args.max_tokens,
                    batch_size=args.batch_size,
                    generator=generator,
                )
                for candidates in found:
                    if args.nbest == 1:
                        sink.write(candidates[0][0] + "\n")
                    else:
                        sink.writelines(f"{number} ||| {text} ||| {score:.4f}\n" for text, score in candidates)
                    number += 1
                sink.flush()  # each batch's answers now: someone may be waiting for them
        except NotText as exc:
            raise TfbuilderError(f"{name} {exc}") from None
    return 0


def _warn_unknown(tokenizer, lines: list[str], *, first: int) -> None:
    """Say which characters the model cannot read (they become <unk>), line by line, on stderr."""

    for number, line in enumerate(lines, start=first):
        missing = unknown(tokenizer, line)
        if missing:
            shown = " ".join(repr(c) for c in missing[:10]) + (" ..." if len(missing) > 10 else "")
            print(f"translate: line {number}: not in the vocabulary, read as <unk>: {shown}", file=sys.stderr)


def _readable_file(path: str, flag: str) -> None:
    """``path`` names an existing file that is not a directory (a FIFO is fine: it streams)."""
    if not os.path.exists(path):
        raise TfbuilderError(f"{flag} {path}: no such file")
    if os.path.isdir(path):
        raise TfbuilderError(f"{flag} {path} is a directory, not a file")
    if not os.access(path, os.R_OK):
        raise TfbuilderError(f"{flag} {path}: not readable")


def _new_file(path: str, flag: str) -> None:
    """``path`` can be created: it does not exist and its directory does (nothing is overwritten)."""
    if os.path.lexists(path):
        what = "a directory" if os.path.isdir(path) else "an existing file"
        raise TfbuilderError(f"{flag} {path} is {what}: not overwriting it; name a new file")
    parent = os.path.dirname(path) or "."
    if not os.path.isdir(parent):
        raise TfbuilderError(f"{flag} {path}: directory {parent} does not exist")


def _directory_arg(path: str, flag: str) -> None:
    """``path`` is a directory or can become one: neither it nor a folder above it is a file, and the
    nearest existing folder can be written."""
    if "\0" in path:
        raise TfbuilderError(f"{flag} {path!r}: a path cannot hold a NUL byte")
    if os.path.lexists(path) and not os.path.isdir(path):
        raise TfbuilderError(f"{flag} {path} is a file, not a directory")
    here = os.path.abspath(path)
    while not os.path.lexists(here):
        here = os.path.dirname(here)
    if not os.path.isdir(here):
        raise TfbuilderError(f"{flag} {path}: {here} is a file, not a directory")
    if not os.access(here, os.W_OK | os.X_OK):
        raise TfbuilderError(f"{flag} {path}: {here} is not writable")


def cmd_generate(args: argparse.Namespace) -> int:
    import torch

    from tfbuilder.inference.translate import generate  # deferred: start-up time

    loaded = _load(args)
    if loaded.recipe.model.kind != "decoder":
        raise TfbuilderError(f"generate needs a decoder-only checkpoint; this one is '{loaded.recipe.model.kind}'")
    rng = torch.Generator().manual_seed(args.seed)
    rules = Rules(unk_penalty=args.unk_penalty, no_repeat_ngram=args.no_repeat_ngram)
    try:
        text = generate(
            loaded,
            args.prompt,
            max_new=args.max_new,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            generator=rng,
            rules=rules,
        )
    except ValueError as exc:  # a model with nothing to start or end with
        raise TfbuilderError(str(exc)) from None
    print(text)
    return 0


def cmd_test(args: argparse.Namespace) -> int:
    from tfbuilder.inference.translate import Search  # deferred: start-up time
    from tfbuilder.use.evaluation import evaluate_outputs, write_outputs  # deferred: start-up time

    if args.output is not None:
        _new_file(args.output, "--output")
    loaded, *others = _load_all(args)
    if loaded.recipe.model.head is not None:
        return _test_head(args, loaded, others)
    try:
        search = Search(
            beam=args.beam, alpha=args.alpha, unk_penalty=args.unk_penalty, no_repeat_ngram=args.no_repeat_ngram
        )
        scores, outputs = evaluate_outputs(loaded, args.split, search=search, precision=args.precision, ensemble=others)
    except ValueError as exc:
        raise TfbuilderError(str(exc)) from None
    rows = [("checkpoint", loaded.describe())] + [("ensembled with", o.describe()) for o in others]
    rows += [("split", f"{scores.split} ({scores.examples:,} examples)")]
    rows += [("loss", f"{scores.loss:.4f}"), ("perplexity", f"{scores.perplexity:.2f}")]
    rows += [("token accuracy", f"{scores.accuracy:.2%} (teacher forcing)")]
    search = f"beam {scores.beam}" + (", bf16" if args.precision == "bf16" else "")
    if scores.exact_match is not None:
        rows += [(f"exact match ({search})", f"{scores.exact_match:.2%} of outputs equal their reference")]
    if scores.bleu is not None:
        level = "character-level " if scores.bleu_tokenize == "char" else ""
        rows += [(f"{level}sacreBLEU ({search})", f"{scores.bleu:.2f}"), ("chrF", f"{scores.chrf:.2f}")]
        rows += [("signature", scores.bleu_signature)]
    elif scores.exact_match is not None:
        rows += [
            (
                "sacreBLEU",
                "not computed: a synthetic task's outputs are not language (exact match and accuracy are the scores)",
            )
        ]
    if scores.seconds_decoding is not None:
        rows += [("decoding time", f"{scores.seconds_decoding:.1f} s")]
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


HEAD_SCORES = {
    "acc": ("accuracy", "{:.2%}"),
    "f1": ("macro-F1", "{:.4f}"),
    "mse": ("MSE", "{:.4f}"),
    "pearson": ("Pearson r", "{:.4f}"),
}


def _test_head(args: argparse.Namespace, loaded, others: list) -> int:
    """``tfbuilder test`` of a checkpoint with a sequence head: loss and its scores on a split."""
    from tfbuilder.use.predict import score  # deferred: start-up time

    if others:
        raise TfbuilderError("test: ensembles are for translation; give one checkpoint with a sequence head")
    if args.output is not None:
        raise TfbuilderError(
            "test --output writes translations; a sequence head's predictions come from tfbuilder predict"
        )
    result = score(loaded, args.split)
    head = loaded.recipe.model.head
    loss = "cross-entropy per text" if head.type == "classify" else "squared error per text"
    rows = [
        ("checkpoint", loaded.describe()),
        ("split", f"{result.split} ({result.examples:,} examples)"),
        ("loss", f"{result.loss:.4f} ({loss})"),
    ]
    rows += [(HEAD_SCORES[k][0], HEAD_SCORES[k][1].format(v)) for k, v in result.scores.items()]
    width = max(len(k) for k, _ in rows)
    print("\n".join(f"{k.ljust(width)}  {v}" for k, v in rows))
    return 0


def cmd_predict(args: argparse.Namespace) -> int:
    from tfbuilder.use.predict import lines, predict, read_inputs  # deferred: start-up time

    if args.input != "-":
        _readable_file(args.input, "--input")
    if args.output is not None:
        _new_file(args.output, "--output")
    loaded = _load(args)
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


def _save_scores_new(loaded, scores) -> Path:
    """Write the scores JSON (:func:`tfbuilder.use.evaluation.save_scores`: an earlier file is never
    replaced), and say so when the usual name was taken."""
    from tfbuilder.use.evaluation import save_scores, scores_path  # deferred: start-up time

    try:
        written = save_scores(loaded, scores)
    except FileExistsError as exc:
        raise TfbuilderError(str(exc)) from None
    path = scores_path(
        loaded, scores.split, scores.beam, scores.precision or "32", ensemble=len(scores.ensemble or ()) or 1
    )
    if written != path:
        print(f"{path} exists: not overwriting it; wrote {written.name} instead", file=sys.stderr)
    return written


def cmd_diff(args: argparse.Namespace) -> int:
    problems = []
    recipes = []
    for path in (args.a, args.b):
        try:
            recipes.append(load_recipe(path))
        except RecipeError as exc:
            problems += exc.problems
    if problems:
        raise RecipeError(problems)
    rows = differences(*recipes)
    print(format_table(rows, args.a, args.b) if rows else "no differences")
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    from tfbuilder.use import reports, sweeps  # deferred: start-up time

    problems = []
    for path in dict.fromkeys(args.recipes):  # every recipe's problems, before anything runs
        try:
            _preflight(path, args.overrides)
        except RecipeError as exc:
            problems += exc.problems
    if problems:
        raise RecipeError(problems)
    if args.out:
        _directory_arg(args.out, "--out")
    command = "tfbuilder " + shlex.join(args.argv)
    sweep = sweeps.plan(
        args.recipes,
        seeds=args.seeds,
        overrides=args.overrides,
        out=args.out,
        bleu_beam=None if args.no_bleu else args.beam,
        command=command,
    )
    sweeps.check_own(sweep.dir)  # never writes its reports over files it did not make
    todo = [r for r in sweep.runs if r.status != "finished"]
    counts = {s: sum(r.status == s for r in sweep.runs) for s in ("finished", "resume", "evaluate", "new")}
    print(
        f"sweep {sweep.dir}: {len(sweep.runs)} runs ({len(sweep.names)} recipes x {args.seeds} seeds); "
        f"{counts['finished']} finished, {counts['resume']} to resume, {counts['evaluate']} to score, {counts['new']} to train",
        file=sys.stderr,
    )
    if args.dry_run:
        for run in sweep.runs:
            print(f"{run.status:>9}  {run.dir}")
        return 0
    sweeps.write_plan(sweep)
    from tfbuilder.train.trainer import quiet_lightning  # deferred: start-up time

    with quiet_lightning():
        failed = _run_with_progress(todo, sweep)
    finished, _ = reports.find_runs([sweep.dir])
    rows = reports.group(reports.read_runs(finished, beam=args.beam, warn=_warn), baseline=args.baseline)
    note = f"Made by `{command}`." if command else ""
    if failed:
        note += "\n\nNot in the table (diverged): " + "; ".join(failed)
    paths = reports.write(rows, sweep.dir, title=f"sweep {sweep.dir.name}", note=note.strip(), beam=args.beam)
    print(reports.markdown(rows, beam=args.beam))
    print("\n" + "\n".join(f"wrote {p}" for p in paths.values()), file=sys.stderr)
    for line in failed:
        print(f"diverged: {line}", file=sys.stderr)
    return 1 if failed else 0


def _run_with_progress(todo: list, sweep, console=None) -> list[str]:
    """Each run in turn under a rich progress display (plain lines when the output is not a terminal).
    A run that diverges does not stop the others; returns what diverged."""
    import time

    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from tfbuilder.train.callbacks import NonFiniteLoss  # deferred: start-up time
    from tfbuilder.use.sweeps import execute  # deferred: start-up time

    console = console or Console(stderr=True)
    failed: list[str] = []
    columns = (
        TextColumn("{task.description:<36}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console, disable=not console.is_terminal) as progress:
        overall = progress.add_task("runs", total=len(todo))
        for index, run in enumerate(todo, 1):
            label = f"{run.recipe.name} seed {run.seed}"
            current = progress.add_task(f"{label} ({run.status})", total=run.recipe.trainer.max_steps)
            progress.refresh()  # show the run now, not at the next tick
            if not console.is_terminal:
                print(f"[{index}/{len(todo)}] {label}: {run.status} -> {run.dir}", file=sys.stderr, flush=True)
            start = time.perf_counter()
            try:
                execute(
                    run,
                    bleu_beam=sweep.bleu_beam,
                    on_step=lambda step, total, task=current: progress.update(task, completed=step, total=total),
                )
            except NonFiniteLoss as exc:
                failed.append(f"{label} ({exc})")
            progress.refresh()  # the run's last state (a short run can end between ticks)
            progress.remove_task(current)
            progress.advance(overall)
            if console.is_terminal:
                progress.console.print(f"done {label} in {time.perf_counter() - start:.0f} s")
    return failed


def cmd_compare(args: argparse.Namespace) -> int:
    from pathlib import Path

    from tfbuilder.use import reports  # deferred: start-up time

    if args.out:
        _directory_arg(args.out, "--out")
    finished, unfinished = reports.find_runs(args.dirs)
    for run in unfinished:
        print(f"skipping {run}: not finished (no summary.json)", file=sys.stderr)
    rows = reports.group(reports.read_runs(finished, beam=args.beam, warn=_warn), baseline=args.baseline)
    print(reports.markdown(rows, beam=args.beam))
    if args.out:
        out = Path(args.out)
        taken = [n for n in ("report.md", "report.csv", "runs.csv", "curves.png") if (out / n).exists()]
        if taken:
            raise TfbuilderError(f"{out} already has {', '.join(taken)}: not overwriting; choose another --out")
        paths = reports.write(rows, out, title="comparison of " + ", ".join(args.dirs), beam=args.beam)
        print("\n" + "\n".join(f"wrote {p}" for p in paths.values()), file=sys.stderr)
    return 0


def _warn(line: str) -> None:
    print(f"warning: {printable(line)}", file=sys.stderr)


def cmd_attention(args: argparse.Namespace) -> int:
    from pathlib import Path

    from tfbuilder.use.attention_maps import write_maps  # deferred: start-up time

    _directory_arg(args.out, "--out")
    loaded = _load(args)
    for path in write_maps(loaded, args.src, tgt=args.tgt, out_dir=Path(args.out), layers=args.layers):
        print(path)
    return 0


def _is_rank_zero() -> bool:
    from lightning.fabric.utilities.rank_zero import rank_zero_only

    return rank_zero_only.rank == 0


def _describe_field(name: str, field) -> str:
    default = "required" if field.is_required() else f"default {field.get_default(call_default_factory=True)!r}"
    return f"      {name}: {default} - {field.description}"


def cmd_components(args: argparse.Namespace) -> int:
    families = [args.family] if args.family else list(registry.FAMILIES)
    for family in families:
        print(f"{family}:")
        for entry in registry.entries(family):
            print(f"  {entry.name}  ({entry.cls.__name__}, {entry.source})")
            if entry.doc:
                print(f"    {entry.doc}")
            for name, field in entry.params.model_fields.items():
                if name != "type":
                    print(_describe_field(name, field))
    return 0


def cmd_import_hf(args: argparse.Namespace) -> int:
    from tfbuilder.interop.hf import import_hf  # deferred: start-up time

    ckpt = import_hf(args.hf_dir, args.out, overrides=args.overrides)
    print(
        f"wrote {ckpt.parent.parent} (recipe.yaml, tfbuilder-vocab.json, tokenizer.json, {ckpt.relative_to(ckpt.parent.parent)})"
    )
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from tfbuilder.interop.hf import export  # deferred: start-up time

    for path in export(args.checkpoint, format=args.format, out=args.out):
        print(f"wrote {path}")
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    text = json.dumps(json_schema(), indent=2) + "\n"
    if args.output:
        _new_file(args.output, "--output")
        if write_new_text(args.output, text, what="schema") is None:  # never replaces a file
            raise TfbuilderError(f"--output {args.output} is an existing file: not overwriting it; name a new file")
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(argv)
    args.argv = argv  # the command as typed (a sweep's report quotes it)
    try:
        if args.plugins:
            plugins.load(args.plugins)
        code = args.run(args)
        sys.stdout.flush()  # a full or closed standard output is an error here, not at exit
        return code
    except RecipeError as exc:
        print("\n".join(str(p) for p in exc.problems), file=sys.stderr)
        return EXIT_USAGE
    except TfbuilderError as exc:
        if isinstance(exc, Interrupted):  # not an error: what was kept, and how to go on
            again = f"Start again with: tfbuilder {shlex.join(argv)}"  # the command as typed
            print(printable(str(exc).replace(Interrupted.AGAIN, again)), file=sys.stderr)
            return exc.exit_code
        print(f"error: {printable(str(exc))}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except OSError as exc:
        if not _stdout_failed(exc):
            raise
        print(f"error: cannot write to standard output: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE


def _stdout_failed(exc: OSError) -> bool:
    """Whether ``exc`` is standard output failing (a full disk, /dev/full, a closed descriptor); if
    so, standard output becomes /dev/null so that the exit does not fail again."""
    if exc.filename is not None or exc.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EFBIG, errno.EBADF):
        return False
    try:
        os.write(sys.stdout.fileno(), b"\n")  # only on this error path: is it standard output that fails?
        return False
    except (OSError, ValueError):
        pass
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, sys.stdout.fileno())
    os.close(null)
    return True


if __name__ == "__main__":
    sys.exit(main())
