"""Decoding throughput and quality, measured in one run.

1. Tokens/s generating 128 new tokens with and without the key/value cache (vanilla-small size,
   random weights, batch 1 and 8; the uncached path re-runs the decoder over the whole prefix each step).
2. With --checkpoint (a Multi30k de-en run) and/or --quickstart (a run of recipes/quickstart.yaml):
   greedy and beam search with beams 1, 4 and 8 over the test split (Multi30k: test_2016_flickr),
   with sentences/s, exact match, the mean length-normalised score (alpha 0.6) and sacreBLEU
   (text only). Beam search must never score below greedy.
3. With --before GIT_REF: the same rows decoded by the decoders of that commit too (its
   tfbuilder/inference/decoding.py, loaded beside today's), and the speed ratio, in the same run.

    python benchmarks/decode_throughput.py [--checkpoint RUN] [--quickstart RUN] [--before REF]
        [--limit 1000] [--repeats 3] [--data ../shared/data/multi30k] [--device cuda]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import tfbuilder  # noqa: E402
from tfbuilder.inference import decoding  # noqa: E402
from tfbuilder.data import text  # noqa: E402
from tfbuilder.data.prepare import prepare  # noqa: E402

NEW = 128
ALPHA = 0.6


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


def timed(fn, device: torch.device, repeats: int = 3) -> tuple[float, object]:
    """The median seconds of ``repeats`` calls after a warm-up, and the last result."""
    result = fn()
    times = []
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        result = fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def timed_together(fns: list[Callable], device: torch.device, repeats: int = 3) -> list[tuple[float, object]]:
    """For each of ``fns``, the median seconds of ``repeats`` calls and the last result; after one
    warm-up call each, the calls alternate between the functions."""
    results = [fn() for fn in fns]
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for k, fn in enumerate(fns):
            sync(device)
            start = time.perf_counter()
            results[k] = fn()
            sync(device)
            times[k].append(time.perf_counter() - start)
    return [(statistics.median(t), r) for t, r in zip(times, results)]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def decoders_of(ref: str):
    """The ``tfbuilder.inference.decoding`` module of git commit ``ref``, loaded beside today's."""
    source = subprocess.run(["git", "show", f"{ref}:tfbuilder/inference/decoding.py"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    spec = importlib.util.spec_from_loader("tfbuilder._decoding_before", loader=None)
    module = importlib.util.module_from_spec(spec)
    module.__package__ = "tfbuilder"
    sys.modules[spec.name] = module  # dataclasses look their module up
    exec(compile(source, f"{ref}:tfbuilder/inference/decoding.py", "exec"), module.__dict__)
    return module


def searches(module) -> dict[str, Callable]:
    """Each search of a decoding module as ``fn(model, src) -> list of ids``."""
    return {
        "greedy": lambda m, s: module.greedy(m, s),
        "beam 1": lambda m, s: module.beam_search(m, s, beam=1, alpha=ALPHA),
        "beam 4": lambda m, s: module.beam_search(m, s, beam=4, alpha=ALPHA),
        "beam 8": lambda m, s: module.beam_search(m, s, beam=8, alpha=ALPHA),
    }


def batches(model, ids: list[list[int]], device, max_tokens: int = 6000) -> list[tuple[list[int], torch.Tensor]]:
    """Sources sorted by length into batches of at most ``max_tokens`` (the beams' share of it)."""
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    out, current = [], []
    for i in order:
        if current and (len(current) + 1) * (len(ids[i]) + 1) > max_tokens // 4:
            out.append(current)
            current = []
        current.append(i)
    out.append(current)
    return [(rows, decoding.source_batch(model, [ids[i] for i in rows]).to(device)) for rows in out]


@torch.no_grad()
def normalised_score(model, src: torch.Tensor, hyps: list[list[int]]) -> list[float]:
    """Each output's log-probability (with </s>) over the GNMT length penalty, teacher-forced."""
    end, start = model.specials.end, model.specials.start
    scores = []
    for row, hyp in zip(src, hyps):
        tgt = torch.tensor([[start, *hyp]], device=src.device)
        logp = model(row[None], tgt)[0].float().log_softmax(-1)
        total = float(logp[torch.arange(len(hyp) + 1), torch.tensor([*hyp, end])].sum())
        scores.append(total / ((5 + len(hyp) + 1) / 6) ** ALPHA)
    return scores


def quality_table(name: str, loaded, sources: list[str], references: list[str], *, before, repeats: int, device, bleu: bool) -> None:
    import sacrebleu

    model = loaded.model
    ids = loaded.vocab.src.encode_batch(sources)
    work = batches(model, ids, device)
    versions = [("now", decoding)] + ([("before", before)] if before is not None else [])
    print(f"\n## {name}: {len(sources):,} sentences, {repeats} timed repeats (median)")
    print(f"{'search':<7} {'code':<6} {'sent/s':>7} {'vs now':>7} {'exact %':>8} {'mean score':>10} {'BLEU':>6}")
    for search in searches(decoding):
        speed_now = None

        def runner(fn):
            def run():
                out: list[list[int]] = [[] for _ in sources]
                for rows, src in work:
                    for i, hyp in zip(rows, fn(model, src)):
                        out[i] = hyp
                return out

            return run

        # The versions' repeats alternate (now, before, now, ...): a change in the machine's load
        # falls on both alike, so their ratio is fair within one run.
        timings = timed_together([runner(searches(module)[search]) for _, module in versions], device, repeats)
        for (label, module), (seconds, hyps) in zip(versions, timings):
            texts = [loaded.vocab.tgt.decode(h) for h in hyps]
            exact = 100 * sum(t == r for t, r in zip(texts, references)) / len(references)
            score = statistics.mean(s for rows, src in work for s in normalised_score(model, src, [hyps[i] for i in rows]))
            speed = len(sources) / seconds
            speed_now = speed_now or speed
            ratio = f"{speed / speed_now:.2f}x"
            shown = f"{sacrebleu.corpus_bleu(texts, [references]).score:6.2f}" if bleu else f"{'-':>6}"
            print(f"{search:<7} {label:<6} {speed:>7.1f} {ratio:>7} {exact:>8.2f} {score:>10.4f} {shown}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", help="a Multi30k de-en run (or checkpoint) for part 2")
    parser.add_argument("--quickstart", help="a run of recipes/quickstart.yaml for part 2")
    parser.add_argument("--before", metavar="GIT_REF", help="also decode with the decoders of this commit (part 3)")
    parser.add_argument("--limit", type=int, default=1000, help="at most this many test sentences (default 1000)")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats per row; the median is shown (default 3)")
    parser.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "multi30k"))
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda[:N]")
    parser.add_argument("--skip-cache", action="store_true", help="skip part 1")
    args = parser.parse_args()
    device = torch.device(args.device)
    print(f"# python benchmarks/decode_throughput.py {' '.join(sys.argv[1:])}")
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"# torch {torch.__version__}, {where}")
    if not args.skip_cache:
        recipe = tfbuilder.load_recipe(ROOT / "recipes" / "multi30k" / "vanilla-small.yaml")
        torch.manual_seed(0)
        model = tfbuilder.build_model(recipe).to(device).eval()
        print(f"{'batch':>5} {'uncached tok/s':>15} {'cached tok/s':>13} {'speed-up':>9}")
        for batch in (1, 8):
            src = torch.randint(5, recipe.model.vocab_size, (batch, 20), device=device)
            slow, _ = timed(lambda: generate(model, src, cached=False), device)
            fast, _ = timed(lambda: generate(model, src, cached=True), device)
            print(f"{batch:>5} {batch * NEW / slow:>15,.0f} {batch * NEW / fast:>13,.0f} {slow / fast:>8.1f}x")
    before = decoders_of(args.before) if args.before else None
    if args.quickstart:
        loaded = tfbuilder.load_checkpoint(args.quickstart, device=device)
        sources, references = prepare(loaded.recipe.data, vocab=loaded.vocab, model_vocab=loaded.recipe.model.vocab_size).raw["test"]
        quality_table("quick-start (copy task, test split)", loaded, sources[: args.limit], references[: args.limit],
                      before=before, repeats=args.repeats, device=device, bleu=False)
    if args.checkpoint:
        loaded = tfbuilder.load_checkpoint(args.checkpoint, device=device)
        sources = text.read_lines(Path(args.data) / "test_2016_flickr.de.gz")[: args.limit]
        references = text.read_lines(Path(args.data) / "test_2016_flickr.en.gz")[: args.limit]
        quality_table("Multi30k de-en, test_2016_flickr", loaded, sources, references,
                      before=before, repeats=args.repeats, device=device, bleu=True)


if __name__ == "__main__":
    main()
