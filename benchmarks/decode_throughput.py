"""Decoding throughput, measured in one run.

1. Tokens/s generating 128 new tokens with and without the key/value cache (vanilla-small size,
   random weights, batch 1 and 8; the uncached path re-runs the decoder over the whole prefix each step).
2. With --checkpoint: greedy and beam-4 translation of the 1,000 Multi30k test_2016_flickr sources,
   in float32 and bfloat16, with the sacreBLEU of each.

    python benchmarks/decode_throughput.py [--checkpoint RUN_DIR_OR_CKPT] [--data ../shared/data/multi30k] [--device cuda]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import tfbuilder  # noqa: E402
from tfbuilder.data import text  # noqa: E402
from tfbuilder.evaluation import translate_lines  # noqa: E402

NEW = 128


@torch.no_grad()
def generate(model, src, *, cached: bool) -> None:
    """NEW greedy steps, never stopping early (the same work for both paths)."""
    memory, memory_mask = model.encode(src)
    tgt = torch.ones(src.shape[0], 1, dtype=torch.long, device=src.device)
    cache = model.new_cache() if cached else None
    for step in range(NEW):
        if cached:
            logits = model.decode(tgt[:, -1:], memory, memory_mask, cache=cache, offset=step)
        else:
            logits = model.decode(tgt, memory, memory_mask)
        tgt = torch.cat([tgt, logits[:, -1].argmax(-1, keepdim=True).clamp(min=5)], dim=1)


def timed(fn, device: torch.device, repeats: int = 3) -> float:
    fn()
    times = []
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", help="a Multi30k de-en run for part 2")
    parser.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "multi30k"))
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda[:N]")
    args = parser.parse_args()
    device = torch.device(args.device)
    print(f"# {' '.join(sys.argv)}")
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"# torch {torch.__version__}, {where}")
    recipe = tfbuilder.load_recipe(ROOT / "recipes" / "multi30k" / "vanilla-small.yaml")
    torch.manual_seed(0)
    model = tfbuilder.build_model(recipe).to(device).eval()
    print(f"{'batch':>5} {'uncached tok/s':>15} {'cached tok/s':>13} {'speed-up':>9}")
    for batch in (1, 8):
        src = torch.randint(5, recipe.model.vocab_size, (batch, 20), device=device)
        slow = timed(lambda: generate(model, src, cached=False), device)
        fast = timed(lambda: generate(model, src, cached=True), device)
        print(f"{batch:>5} {batch * NEW / slow:>15,.0f} {batch * NEW / fast:>13,.0f} {slow / fast:>8.1f}x")
    if args.checkpoint:
        import sacrebleu

        loaded = tfbuilder.load_checkpoint(args.checkpoint, device=device)
        sources = text.read_lines(Path(args.data) / "test_2016_flickr.de.gz")
        references = text.read_lines(Path(args.data) / "test_2016_flickr.en.gz")
        print(f"\n{'search':<8} {'precision':>9} {'sentences':>9} {'seconds':>8} {'sent/s':>7} {'BLEU':>6}")
        for precision in ("32", "bf16"):
            for beam in (1, 4):
                list(translate_lines(loaded, sources[:64], beam=beam, precision=precision))  # warm-up
                sync(device)
                start = time.perf_counter()
                out = list(translate_lines(loaded, sources, beam=beam, precision=precision))
                sync(device)
                seconds = time.perf_counter() - start
                bleu = sacrebleu.corpus_bleu(out, [references]).score
                search = "greedy" if beam == 1 else f"beam {beam}"
                print(f"{search:<8} {precision:>9} {len(out):>9,} {seconds:>8.1f} {len(out) / seconds:>7.0f} {bleu:>6.2f}")


if __name__ == "__main__":
    main()
