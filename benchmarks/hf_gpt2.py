"""GPT-2 small: tfbuilder's recipe vs transformers' GPT2LMHeadModel, forward + backward, in one run.

Both models have the same weights (copied through the Hugging Face mapping of ``tfbuilder import-hf``)
and see the same random ids; a step is forward, mean cross-entropy of the next token, backward.
Dropout is off in both (eval mode) so that the work is the same. Prints the median step time of each,
the ratio, and the logits' max difference as a sanity check. Defaults are short (a 2-layer GPT-2-small
slice, 2 x 64 tokens, 3 timed steps); ``--layers 12`` is the full model.

    python benchmarks/hf_gpt2.py [--layers 2] [--batch 2] [--length 64] [--steps 3] [--warmup 1] [--device cpu]
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tfbuilder.interop.hf.convert import load_hf  # noqa: E402


def one_step(model, ids: torch.Tensor, logits_of) -> float:
    if ids.is_cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    logits = logits_of(model, ids)
    loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
    loss.backward()
    model.zero_grad(set_to_none=True)
    if ids.is_cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - start


def step_times(ref, ours, ids: torch.Tensor, steps: int, warmup: int) -> tuple[float, float]:
    """Median step time of each; the two alternate step by step, so that a busy moment of a shared
    machine falls on both alike."""
    theirs_t, ours_t = [], []
    for i in range(warmup + steps):
        a = one_step(ref, ids, lambda m, x: m(x).logits)
        b = one_step(ours, ids, lambda m, x: m(x))
        if i >= warmup:
            theirs_t.append(a)
            ours_t.append(b)
    return statistics.median(theirs_t), statistics.median(ours_t)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--length", type=int, default=64)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--device", default="cpu")
    args = p.parse_args()
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    ref = GPT2LMHeadModel(GPT2Config(n_layer=args.layers, attn_implementation="sdpa"))
    with tempfile.TemporaryDirectory() as tmp:
        ref.save_pretrained(tmp)
        _, recipe, ours, _ = load_hf(tmp)
    device = torch.device(args.device)
    ref, ours = ref.to(device).eval(), ours.to(device).eval()
    ids = torch.randint(0, recipe.model.vocab_size, (args.batch, args.length), device=device)
    with torch.no_grad():
        diff = (ours(ids) - ref(ids).logits).abs().max().item()
    theirs_s, ours_s = step_times(ref, ours, ids, args.steps, args.warmup)
    tokens = args.batch * args.length
    print(f"GPT-2 small shape, {args.layers} layers, batch {args.batch} x {args.length}, {args.device}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; median of {args.steps} alternating steps after {args.warmup} warm-up")
    print()
    print("| model | forward+backward (ms) | tokens/s | vs transformers |")
    print("|---|---|---|---|")
    print(f"| transformers GPT2LMHeadModel | {theirs_s * 1e3:.1f} | {tokens / theirs_s:,.0f} | 1.00 |")
    print(f"| tfbuilder gpt2-small recipe | {ours_s * 1e3:.1f} | {tokens / ours_s:,.0f} | {theirs_s / ours_s:.2f} |")
    print()
    print(f"max |logit difference|: {diff:.1e}")
    print("command: python benchmarks/hf_gpt2.py " + shlex.join(sys.argv[1:]))


if __name__ == "__main__":
    main()
