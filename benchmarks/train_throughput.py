"""Training throughput: tfbuilder against reference PyTorch implementations of the same architectures,
measured in one run, interleaved, on the CPU or a GPU.

A step is forward + label-smoothed loss + backward + Adam on one batch of random ids. Workloads:

- ``vanilla-small``, ``vanilla``: recipes/multi30k/vanilla-small.yaml and recipes/vanilla.yaml against
  ``torch.nn.Transformer`` with the paper's embeddings (CPU default: batch 8 x 64, 8,000-token vocabulary);
- ``paper-base``: recipes/vanilla.yaml at batch 256 x 64 with a 32k vocabulary (GPU default);
- ``gpt2-small``: a GPT-2-small-shaped decoder recipe (12 x 768, learned positions, pre-norm, GELU, tied,
  50,257 tokens) against a minimal GPT written directly in PyTorch, batch 16 x 1024 (GPU default).

Prints target tokens/s (median of the timed steps), the ratio to the first reference, training FLOP/s
(3x the forward matmuls, counted analytically), their share of the matmul peak measured in the same run
(fp32 on the CPU, bf16 on a GPU with ``--precision bf16-mixed``), and peak GPU memory.

    python benchmarks/train_throughput.py                                   # CPU, fp32
    python benchmarks/train_throughput.py --device cuda --precision bf16-mixed --compile
"""

from __future__ import annotations

import argparse
import contextlib
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
from tfbuilder.model.components.position import sinusoids  # noqa: E402
from tfbuilder.train.objectives import objective  # noqa: E402
from tfbuilder.spec.recipe import Recipe  # noqa: E402

GPT2 = {
    "kind": "decoder", "vocab_size": 50257, "d_model": 768, "dropout": 0.1, "placement": "pre",
    "position": {"type": "learned", "max_len": 1024}, "attention": {"type": "multihead", "heads": 12},
    "ffn": {"type": "mlp", "hidden": 3072, "activation": "gelu"}, "norm": {"type": "layernorm", "eps": 1e-5},
    "decoder": {"layers": 12},
}  # fmt: skip


class Reference(nn.Module):
    """nn.Transformer with the paper's embeddings (shared, scaled, sinusoidal) and tied output projection."""

    def __init__(self, spec, vocab: int):
        super().__init__()
        d = spec.d_model
        self.embed = nn.Embedding(vocab, d)
        self.register_buffer("pe", sinusoids(1024, d), persistent=False)
        self.core = nn.Transformer(
            d_model=d, nhead=spec.attention.heads, num_encoder_layers=spec.encoder.layers,
            num_decoder_layers=spec.decoder.layers, dim_feedforward=spec.ffn.hidden, dropout=spec.dropout, batch_first=True,
        )  # fmt: skip
        self.core.encoder.norm = self.core.decoder.norm = None  # post-norm as in the paper
        self.scale = math.sqrt(d)

    def forward(self, src, tgt):
        x = self.embed(src) * self.scale + self.pe[: src.shape[1]]
        y = self.embed(tgt) * self.scale + self.pe[: tgt.shape[1]]
        causal = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1], dtype=x.dtype, device=x.device)
        return self.core(x, y, tgt_mask=causal, tgt_is_causal=True) @ self.embed.weight.T


class MiniGPT(nn.Module):
    """A minimal GPT-2 written directly in PyTorch (pre-norm blocks, fused qkv, SDPA, tied head)."""

    def __init__(self, vocab: int, d: int = 768, heads: int = 12, layers: int = 12, n: int = 1024, dropout: float = 0.1):
        super().__init__()
        self.tok, self.pos, self.heads, self.dropout = nn.Embedding(vocab, d), nn.Embedding(n, d), heads, dropout
        self.blocks = nn.ModuleList(
            nn.ModuleDict({"ln1": nn.LayerNorm(d), "qkv": nn.Linear(d, 3 * d), "proj": nn.Linear(d, d), "ln2": nn.LayerNorm(d),
                           "fc": nn.Linear(d, 4 * d), "out": nn.Linear(4 * d, d)})
            for _ in range(layers)
        )  # fmt: skip
        self.ln = nn.LayerNorm(d)

    def forward(self, ids):
        b, n = ids.shape
        x = F.dropout(self.tok(ids) + self.pos.weight[:n], self.dropout, self.training)
        for blk in self.blocks:
            q, k, v = blk["qkv"](blk["ln1"](x)).view(b, n, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
            x = x + F.dropout(blk["proj"](a.transpose(1, 2).reshape(b, n, -1)), self.dropout, self.training)
            x = x + F.dropout(blk["out"](F.gelu(blk["fc"](blk["ln2"](x)))), self.dropout, self.training)
        return self.ln(x) @ self.tok.weight.T


def seq2seq_flops(spec, vocab: int, b: int, s: int, t: int) -> float:
    """Matmul FLOPs of one encoder-decoder training step (forward x 3)."""
    d, h = spec.d_model, spec.attention.heads
    dk, dv, ff = spec.attention.key_dim or d // h, spec.attention.value_dim or d // h, spec.ffn.hidden
    proj = 2 * d * h * (2 * dk + dv) + 2 * h * dv * d
    enc = spec.encoder.layers * b * s * (proj + 2 * s * h * (dk + dv) + 4 * d * ff)
    cross = 2 * d * h * dk + 2 * h * dv * d
    dec = spec.decoder.layers * (b * t * (proj + 2 * t * h * (dk + dv) + cross + 2 * s * h * (dk + dv) + 4 * d * ff) + 2 * d * h * (dk + dv) * b * s)
    return 3 * (enc + dec + 2 * d * vocab * b * t)


def decoder_flops(d: int, layers: int, vocab: int, b: int, n: int) -> float:
    """Matmul FLOPs of one decoder-only training step (forward x 3; causal attention counted in full)."""
    return 3 * (layers * b * n * (8 * d * d + 4 * n * d + 16 * d * d) + 2 * d * vocab * b * n)


def matmul_peak(device: torch.device, dtype: torch.dtype) -> float:
    """This run's matmul peak in TFLOP/s: the best of 20 square products (8192 on GPUs, 2048 on CPUs)."""
    size = 8192 if device.type == "cuda" else 2048
    a, b = torch.randn(size, size, device=device, dtype=dtype), torch.randn(size, size, device=device, dtype=dtype)
    a @ b
    best = min(_timed(lambda: a @ b, device) for _ in range(20))
    return 2 * size**3 / best / 1e12


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn, device: torch.device) -> float:
    _sync(device)
    start = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - start


def trainer_step(model: nn.Module, loss_fn, args: tuple, *, device, precision: str, compile: bool, fused: bool = True):
    """One optimizer step of ``loss_fn(model, *args)`` under the run's precision, optionally compiled
    (Adam fused, as ``tfbuilder fit`` uses it, unless ``fused`` is False: PyTorch's default)."""
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, fused=fused or None)
    fn = torch.compile(loss_fn, fullgraph=False) if compile else loss_fn
    autocast = (
        (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if precision == "bf16-mixed" else contextlib.nullcontext
    )

    def step():
        with autocast():
            loss = fn(model, *args)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step


def workloads(name: str, args, device) -> tuple[list[tuple[str, object]], float, int]:
    """(implementation name, step) pairs, the step's FLOPs, and its target tokens."""
    torch.manual_seed(0)
    if name == "gpt2-small":
        b, n, vocab = args.batch or 16, args.length or 1024, 50257
        recipe = Recipe.model_validate({"name": "gpt2-small-shape", "model": dict(GPT2, vocab_size=vocab)})
        tokens = torch.randint(5, vocab, (b, n + 1), device=device)
        batch = {"tokens": tokens}
        loss = objective(recipe, epsilon=0.0)
        ours = tfbuilder.build_model(recipe).to(device).train()
        ref = MiniGPT(vocab).to(device).train()

        def ref_loss(model, ids):
            logits = model(ids[:, :-1])
            return F.cross_entropy(logits.float().reshape(-1, vocab), ids[:, 1:].reshape(-1))

        impls = [("minimal GPT", ref, ref_loss, (tokens,)), ("tfbuilder", ours, lambda m, bt: loss(m, bt).loss, (batch,))]
        return _variants(impls, args, device), decoder_flops(768, 12, vocab, b, n), b * n
    path = {"vanilla-small": "recipes/multi30k/vanilla-small.yaml"}.get(name, "recipes/vanilla.yaml")
    big = name == "paper-base"
    b, n, vocab = args.batch or (256 if big else 8), args.length or 64, args.vocab or (32000 if big else 8000)
    recipe = tfbuilder.load_recipe(ROOT / path, [f"data.tokenizer.vocab_size={vocab}"])
    spec, eps = recipe.model, recipe.optim.label_smoothing
    src = torch.randint(5, vocab, (b, n), device=device)
    tgt = torch.randint(5, vocab, (b, n + 1), device=device)
    batch = {"src": src, "tgt_in": tgt[:, :-1], "tgt_out": tgt[:, 1:]}
    loss = objective(recipe, epsilon=eps)
    ours = tfbuilder.build_model(recipe).to(device).train()
    ref = Reference(spec, vocab).to(device).train()

    def ref_loss(model, s, t):
        logits = model(s, t[:, :-1])
        return F.cross_entropy(logits.float().reshape(-1, vocab), t[:, 1:].reshape(-1), label_smoothing=eps)

    impls = [("nn.Transformer", ref, ref_loss, (src, tgt)), ("tfbuilder", ours, lambda m, bt: loss(m, bt).loss, (batch,))]
    out = _variants(impls, args, device)
    if device.type == "cpu":
        # The first reference row uses PyTorch's default Adam (the step people write); this one
        # shows nn.Transformer with the fused Adam tfbuilder uses, so the model's own share is visible.
        default = trainer_step(ref, ref_loss, (src, tgt), device=device, precision=args.precision, compile=False, fused=False)
        out = [("nn.Transformer", default), ("nn.T + fused Adam", out[0][1])] + out[1:]
    return out, seq2seq_flops(spec, vocab, b, n, n), b * n


def _variants(impls, args, device) -> list[tuple[str, object]]:
    out = []
    for label, model, fn, inputs in impls:
        out.append((label, trainer_step(model, fn, inputs, device=device, precision=args.precision, compile=False)))
        if args.compile:
            out.append((f"{label} compiled", trainer_step(model, fn, inputs, device=device, precision=args.precision, compile=True)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda[:N]")
    parser.add_argument("--precision", default="32", choices=["32", "bf16-mixed"])
    parser.add_argument("--compile", action="store_true", help="add torch.compile'd variants of every implementation")
    parser.add_argument("--workloads", nargs="*", help="vanilla-small vanilla paper-base gpt2-small (default: by device)")
    parser.add_argument("--batch", type=int, help="sequences per batch (default: by workload)")
    parser.add_argument("--length", type=int, help="positions per sequence (default: by workload)")
    parser.add_argument("--vocab", type=int, help="vocabulary of the encoder-decoder workloads (default: by workload)")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per round (median)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds (drift in load hits all alike)")
    args = parser.parse_args()
    device = torch.device(args.device)
    names = args.workloads or (["paper-base", "gpt2-small"] if device.type == "cuda" else ["vanilla-small", "vanilla"])
    dtype = torch.bfloat16 if args.precision == "bf16-mixed" and device.type == "cuda" else torch.float32
    print(f"# {' '.join(sys.argv)}")
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    peak = matmul_peak(device, dtype)
    print(f"# torch {torch.__version__}, {where}, precision {args.precision}; {str(dtype)[6:]} matmul peak {peak:.3f} TFLOP/s (best of 20, this run)")
    print(f"{'workload':<14} {'implementation':<26} {'tgt tok/s':>11} {'vs ref':>7} {'TFLOP/s':>8} {'of peak':>8} {'peak mem':>9}")
    for name in names:
        steps, flops, tokens = workloads(name, args, device)
        timings: dict[str, list[float]] = {label: [] for label, _ in steps}
        memory: dict[str, float] = {}
        for _ in range(args.rounds):
            for label, step in steps:
                if device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(device)
                for _ in range(args.warmup):
                    step()
                timings[label].append(statistics.median(_timed(step, device) for _ in range(args.steps)))
                if device.type == "cuda":
                    memory[label] = torch.cuda.max_memory_allocated(device) / 2**30
        base = statistics.median(timings[steps[0][0]])
        for label, ts in timings.items():
            t = statistics.median(ts)
            mem = f"{memory[label]:.1f} GiB" if label in memory else "-"
            print(f"{name:<14} {label:<26} {tokens / t:>11,.0f} {base / t:>6.2f}x {flops / t / 1e12:>8.3f} {flops / t / 1e12 / peak:>7.0%} {mem:>9}")


if __name__ == "__main__":
    main()
