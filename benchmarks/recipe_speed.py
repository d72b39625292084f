"""Training-step speed of several recipes, measured in one process, interleaved: the ratio of each to
the first is fair even when the machine's load drifts (every round times every recipe once).

A step is what ``tfbuilder fit`` runs: the recipe's objective (packing, z-loss, multi-token prediction
included) on a batch of the recipe's shape (``data.max_tokens`` tokens in blocks of
``data.block_size + 1``, random ids), backward, and the recipe's optimizer (AdamW, or Muon with AdamW).
Prints the median step time, target tokens/s, the ratio of the medians to the first recipe's, and
the median of the per-round ratios (``paired``: on a loaded machine, ``--steps 1`` and many rounds
make it the steadier of the two). With ``--minimal``, the
first row is a minimal nanoGPT-style model of the first recipe's shape (``benchmarks/minimal_lm.py``:
plain PyTorch, rotate-half rotary, ``F.cross_entropy`` over the batch's logits) stepped by the same
optimizer on the same batch, so each recipe's ratio is its speed against hand-written PyTorch.

    python benchmarks/recipe_speed.py recipes/ablations/study/*.yaml --rounds 5 --steps 5
    python benchmarks/recipe_speed.py recipes/ablations/study/base.yaml --minimal --set model.position.pairing=half
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

from minimal_lm import MinimalLM  # noqa: E402

import tfbuilder  # noqa: E402
from tfbuilder.train.objectives import objective  # noqa: E402
from tfbuilder.train.optimizers import build_optimizer  # noqa: E402


def stepper(path: str, overrides: list[str], *, minimal: bool = False):
    """(name, step function, target tokens per step) of a packed decoder-LM recipe, or (``minimal``) of
    the minimal model of its shape."""
    recipe = tfbuilder.load_recipe(path, overrides)
    data = recipe.data
    if recipe.model.kind != "decoder" or not data.packing:
        raise SystemExit(f"{path}: this benchmark times packed decoder-only recipes")
    torch.manual_seed(0)
    model = tfbuilder.build_model(recipe).train()
    rows = data.max_tokens // (data.block_size + 1)
    batch = {"tokens": torch.randint(5, recipe.model.vocab_size, (rows, data.block_size + 1))}
    loss_of = objective(recipe, epsilon=recipe.optim.label_smoothing)
    name, loss = recipe.name, lambda: loss_of(model, batch).loss
    if minimal:
        hidden = next(p.shape[1] for n, p in model.named_parameters() if n.endswith("ff_out.weight"))
        torch.manual_seed(0)
        minimal_model = model = MinimalLM(recipe, hidden=hidden).train()
        name, loss = "minimal", lambda: minimal_model.loss(batch["tokens"])
    optimizer = build_optimizer(model, recipe.optim)

    def step() -> None:
        value = loss()
        optimizer.zero_grad(set_to_none=True)
        value.backward()
        optimizer.step()

    return name, step, rows * data.block_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipes", nargs="+", help="packed decoder-LM recipes; the first is the reference")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per recipe per round (default 5)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument("--minimal", action="store_true", help="first row: a minimal PyTorch model of the first recipe's shape")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override every recipe (repeatable)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"# python benchmarks/recipe_speed.py {' '.join(sys.argv[1:])}")
    print(f"# torch {torch.__version__}, CPU, {args.threads} threads; median of {args.rounds} rounds x {args.steps} steps, interleaved")
    runs = [stepper(args.recipes[0], args.set, minimal=True)] if args.minimal else []
    runs += [stepper(p, args.set) for p in args.recipes]
    times: dict[str, list[float]] = {name: [] for name, _, _ in runs}
    for _, step, _ in runs:  # warm-up
        step()
    for _ in range(args.rounds):
        for name, step, _ in runs:
            for _ in range(args.steps):
                start = time.perf_counter()
                step()
                times[name].append(time.perf_counter() - start)
    reference = statistics.median(times[runs[0][0]])
    first = runs[0][0]
    print(f"{'recipe':<22} {'step ms':>8} {'tokens/s':>9} {'vs first':>8} {'paired':>7}")
    for name, _, tokens in runs:
        median = statistics.median(times[name])
        print(
            f"{name:<22} {1000 * median:>8.1f} {tokens / median:>9,.0f} {reference / median:>7.2f}x "
            f"{paired(times[first], times[name], args.steps):>6.2f}x"
        )


def paired(first: list[float], other: list[float], steps: int) -> float:
    """The median over rounds of the first recipe's median step over this one's in the same round:
    steps timed seconds apart share the machine's load, so this ratio drifts less than the medians'."""
    rounds = range(0, len(first), steps)
    return statistics.median(
        statistics.median(first[r : r + steps]) / statistics.median(other[r : r + steps]) for r in rounds
    )

if __name__ == "__main__":
    main()
