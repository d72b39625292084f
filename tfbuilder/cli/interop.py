"""The verbs that cross to other formats: ``import-hf`` (a Hugging Face model directory as a run
directory) and ``export`` (a checkpoint as safetensors, a Hugging Face directory or ONNX)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from tfbuilder.cli.arguments import add_set, directory_arg

if TYPE_CHECKING:
    from tfbuilder.cli.arguments import Subparsers


def add_import_hf(sub: Subparsers) -> None:
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
    add_set(ih)
    ih.set_defaults(run=cmd_import_hf)


def add_export(sub: Subparsers) -> None:
    ex = sub.add_parser("export", help="a checkpoint as safetensors, a Hugging Face directory, or ONNX")
    ex.add_argument("checkpoint", metavar="CHECKPOINT", help="a checkpoint file or a run directory")
    ex.add_argument(
        "--format",
        required=True,
        choices=["safetensors", "hf", "onnx"],
        help="safetensors: the weights; hf: a Hugging Face model directory (GPT-2, BERT, T5, Llama shapes); "
        "onnx: the forward pass",
    )
    ex.add_argument("--out", required=True, metavar="DIR", help="the directory to write (must not exist, or be empty)")
    ex.set_defaults(run=cmd_export)


def cmd_import_hf(args: argparse.Namespace) -> int:
    from tfbuilder.interop.hf import import_hf  # deferred: start-up time

    directory_arg(args.out, "--out")  # before the weights are read
    ckpt = import_hf(args.hf_dir, args.out, overrides=args.overrides)
    run_dir = ckpt.parent.parent
    print(f"wrote {run_dir} (recipe.yaml, tfbuilder-vocab.json, tokenizer.json, {ckpt.relative_to(run_dir)})")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from tfbuilder.interop.hf import export  # deferred: start-up time

    directory_arg(args.out, "--out")  # before the checkpoint is read
    for path in export(args.checkpoint, format=args.format, out=args.out):
        print(f"wrote {path}")
    return 0
