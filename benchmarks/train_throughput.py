"""Training throughput: tfbuilder vs torch.nn.Transformer of the same architecture, measured in one run.

Each step is forward + label-smoothed loss + backward + Adam on one batch of random ids (no padding),
for recipes/multi30k/vanilla-small.yaml and recipes/vanilla.yaml at batch 8 x 64 with an 8,000-token
vocabulary. Prints target tokens/s (median of the timed steps), the ratio to nn.Transformer, and the
share of the GEMM peak (measured in the same run) the step reaches (training FLOPs counted analytically, 3x the forward matmuls).

    python benchmarks/train_throughput.py [--steps 20] [--warmup 3] [--peak-gflops N]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import tfbuilder  # noqa: E402
from tfbuilder import objectives  # noqa: E402
from tfbuilder.components.position import sinusoids  # noqa: E402

VOCAB, BATCH, LENGTH = 8000, 8, 64


class Reference(nn.Module):
    """nn.Transformer with the paper's embeddings (shared, scaled, sinusoidal) and tied output projection."""

    def __init__(self, spec):
        super().__init__()
        d = spec.d_model
        self.embed = nn.Embedding(VOCAB, d)
        self.register_buffer("pe", sinusoids(1024, d), persistent=False)
        self.core = nn.Transformer(
            d_model=d,
            nhead=spec.attention.heads,
            num_encoder_layers=spec.encoder.layers,
            num_decoder_layers=spec.decoder.layers,
            dim_feedforward=spec.ffn.hidden,
            dropout=spec.dropout,
            batch_first=True,
        )
        self.core.encoder.norm = self.core.decoder.norm = None  # post-norm as in the paper
        self.scale = math.sqrt(d)

    def forward(self, src, tgt):
        x = self.embed(src) * self.scale + self.pe[: src.shape[1]]
        y = self.embed(tgt) * self.scale + self.pe[: tgt.shape[1]]
        causal = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1], dtype=x.dtype)
        return self.core(x, y, tgt_mask=causal, tgt_is_causal=True) @ self.embed.weight.T


def training_flops(spec, n_src: int, n_tgt: int) -> float:
    """Matmul FLOPs of one training step (forward x 3) for the encoder-decoder."""
    d, h = spec.d_model, spec.attention.heads
    dk, dv, ff = spec.attention.key_dim or d // h, spec.attention.value_dim or d // h, spec.ffn.hidden
    s, t = n_src / BATCH, n_tgt / BATCH  # positions per sequence
    proj = 2 * d * h * (2 * dk + dv) + 2 * h * dv * d  # q, k, v, out per token
    enc = spec.encoder.layers * n_src * (proj + 2 * s * h * (dk + dv) + 4 * d * ff)
    cross = 2 * d * h * dk + 2 * h * dv * d  # q and out on decoder tokens
    cross_kv = 2 * d * h * (dk + dv) * n_src
    dec = spec.decoder.layers * (n_tgt * (proj + 2 * t * h * (dk + dv) + cross + 2 * s * h * (dk + dv) + 4 * d * ff) + cross_kv)
    return 3 * (enc + dec + 2 * d * VOCAB * n_tgt)


def time_steps(step, steps: int, warmup: int) -> float:
    for _ in range(warmup):
        step()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench(path: Path, steps: int, warmup: int, peak: float) -> list[tuple]:
    recipe = tfbuilder.load_recipe(path, [f"data.tokenizer.vocab_size={VOCAB}"])
    spec, eps = recipe.model, recipe.optim.label_smoothing
    torch.manual_seed(0)
    src = torch.randint(5, VOCAB, (BATCH, LENGTH))
    tgt = torch.randint(5, VOCAB, (BATCH, LENGTH + 1))
    ours = tfbuilder.build_model(recipe).train()
    ref = Reference(spec).train()
    # tfbuilder's step uses what `tfbuilder fit` uses (fused Adam); nn.Transformer is shown with
    # PyTorch's default Adam and with the fused one, so that the model's own share is visible.
    opt_ours = torch.optim.Adam(ours.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, fused=True)
    opt_ref = torch.optim.Adam(ref.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
    ref_fused = Reference(spec).train()
    ref_fused.load_state_dict(ref.state_dict())
    opt_ref_fused = torch.optim.Adam(ref_fused.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, fused=True)

    def step_ours():
        result = objectives.seq2seq(ours, {"src": src, "tgt_in": tgt[:, :-1], "tgt_out": tgt[:, 1:]}, eps)
        opt_ours.zero_grad(set_to_none=True)
        result.loss.backward()
        opt_ours.step()

    def reference_step(model, optimizer):
        def step():
            logits = model(src, tgt[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, VOCAB), tgt[:, 1:].reshape(-1), label_smoothing=eps)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()

        return step

    n_tgt = BATCH * LENGTH
    flops = training_flops(spec, BATCH * LENGTH, n_tgt)
    rows = []
    # Interleave the two, twice, so that drift in machine load hits both alike.
    steps_by_name = {
        "nn.Transformer": reference_step(ref, opt_ref),
        "nn.T+fused Adam": reference_step(ref_fused, opt_ref_fused),
        "tfbuilder": step_ours,
    }
    timings: dict[str, list[float]] = {name: [] for name in steps_by_name}
    for _ in range(2):
        for name, step in steps_by_name.items():
            timings[name].append(time_steps(step, steps, warmup))
    base = statistics.median(timings["nn.Transformer"])
    for name, ts in timings.items():
        t = statistics.median(ts)
        rows.append((recipe.name, name, n_tgt / t, base / t, flops / t / 1e9, flops / t / 1e9 / peak))
    return rows


def gemm_peak(size: int = 2048, reps: int = 20) -> float:
    """This run's fp32 GEMM peak (GFLOP/s): the best of ``reps`` square matmuls."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--peak-gflops", type=float, default=None, help="GEMM peak to compare with (default: measured now)")
    parser.add_argument("--recipes", nargs="*", default=["recipes/multi30k/vanilla-small.yaml", "recipes/vanilla.yaml"])
    args = parser.parse_args()
    print(f"# {' '.join(sys.argv)}")
    print(f"# torch {torch.__version__}, {torch.get_num_threads()} threads, batch {BATCH}x{LENGTH}, vocab {VOCAB}")
    peak = args.peak_gflops or gemm_peak()
    print(f"# GEMM peak {peak:.0f} GFLOP/s ({'given' if args.peak_gflops else 'measured now: best 2048^3 fp32 matmul of 20'})")
    print(f"{'recipe':<24} {'implementation':<16} {'tgt tok/s':>10} {'vs nn.T':>8} {'GFLOP/s':>8} {'of peak':>8}")
    for path in args.recipes:
        for name, impl, rate, ratio, gflops, share in bench(ROOT / path, args.steps, args.warmup, peak):
            print(f"{name:<24} {impl:<16} {rate:>10,.0f} {ratio:>7.2f}x {gflops:>8.1f} {share:>7.0%}")


if __name__ == "__main__":
    main()
