"""Decoding: the cache changes nothing, beam 1 is greedy, batching changes nothing, a trained model copies."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import tfbuilder
from conftest import ROOT, tiny_model
from tfbuilder import decoding, registry
from tfbuilder.data.tokenizers import BOS, EOS
from tfbuilder.components.attention import MultiHeadAttention
from tfbuilder.registry import BuildContext
from tfbuilder.cli import main
from tfbuilder.data.collate import pad
from tfbuilder.recipe import ModelSection

CACHE_CASES = [
    pytest.param(family, name, kind, id=f"{family}-{name}-{kind}")
    for family in ("attention", "position")
    for name in registry.types(family)
    for kind in ("encoder_decoder", "decoder")
]


def model_with(family: str = "attention", name: str = "multihead", kind: str = "encoder_decoder", seed: int = 0):
    torch.manual_seed(seed)
    spec = tiny_model(kind=kind, **({"encoder": None} if kind == "decoder" else {}))
    spec[family] = {"type": name}
    return tfbuilder.build_model(ModelSection.model_validate(spec)).eval()


@pytest.mark.parametrize("family, name, kind", CACHE_CASES)
def test_cached_decoding_equals_uncached(family, name, kind):
    model = model_with(family, name, kind)
    tgt = torch.randint(5, 53, (3, 9))
    src = torch.randint(5, 53, (3, 7))
    src[1, 4:] = 0  # a padded source
    with torch.no_grad():
        if kind == "encoder_decoder":
            full, stepwise = model(src, tgt), decoding.incremental_logits(model, tgt, src)
        else:
            full, stepwise = model(tgt), decoding.incremental_logits(model, tgt)
    torch.testing.assert_close(stepwise, full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("seed", range(4))
def test_beam_of_one_is_greedy(seed):
    model = model_with(seed=seed)
    src = torch.randint(5, 53, (5, 8))
    src[2, 3:] = 0
    assert decoding.beam_search(model, src, beam=1, max_len_b=6) == decoding.greedy(model, src, max_len_b=6)


def reference_beam_search(model, src_row: list[int], *, beam: int, alpha: float, limit: int) -> list[int]:
    """Beam search written plainly: one input, no cache (the whole prefix re-run each step), every
    candidate scored, stopping once ``beam`` hypotheses have ended or at the length limit."""
    src = torch.tensor([src_row])
    live = [(0.0, [BOS])]
    ended: list[tuple[float, list[int]]] = []
    for step in range(limit):
        tgt = torch.tensor([h for _, h in live])
        logp = model(src.expand(len(live), -1), tgt)[:, -1].log_softmax(-1)
        if step + 1 >= limit:  # only </s> may follow
            logp = torch.full_like(logp, float("-inf")).index_fill(1, torch.tensor([EOS]), 0) + logp
        cands = sorted(
            ((s + float(logp[b, w]), h + [w]) for b, (s, h) in enumerate(live) for w in range(logp.shape[1])),
            key=lambda c: -c[0],
        )[: 2 * beam]
        for score, hyp in cands[:beam]:
            if hyp[-1] == EOS and len(ended) < beam:
                ended.append((score / ((5.0 + step + 1) / 6.0) ** alpha, hyp[1:-1]))
        live = [c for c in cands if c[1][-1] != EOS][:beam]
        if len(ended) >= beam or step + 1 >= limit:
            break
    return max(ended)[1]


@pytest.mark.parametrize(
    "attention", [{}, {"kv_heads": 2}, {"qk_norm": True}], ids=["multihead", "grouped-query", "qk-norm"]
)
@pytest.mark.parametrize("alpha", [0.6, 0.0, 2.0])
def test_beam_search_equals_a_plain_reference(attention, alpha):
    torch.manual_seed(5)
    spec = tiny_model()
    spec["attention"] = {"type": "multihead", "heads": 4, **attention}
    model = tfbuilder.build_model(ModelSection.model_validate(spec)).eval()
    rows = [torch.randint(5, 53, (n,)).tolist() + [EOS] for n in (2, 6, 4, 7, 3, 5)]
    with torch.no_grad():
        got = decoding.beam_search(model, pad(rows), beam=3, alpha=alpha, max_len_a=0, max_len_b=8)
        want = [reference_beam_search(model, r, beam=3, alpha=alpha, limit=8) for r in rows]
    assert got == want


def test_cross_attention_groups_beams_over_one_source():
    """q rows (b*g) against b sources equals the same attention with each source copied g times."""
    torch.manual_seed(0)
    params = MultiHeadAttention.Params(heads=4, kv_heads=2)
    attn = MultiHeadAttention(params, BuildContext(d_model=32, cross=True)).eval()
    x, context = torch.randn(6, 1, 32), torch.randn(2, 5, 32)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)[:, None, None, :]
    grouped = attn(x, context=context, mask=mask)
    copied = attn(x, context=context.repeat_interleave(3, 0), mask=mask.repeat_interleave(3, 0))
    torch.testing.assert_close(grouped, copied)
    with pytest.raises(ValueError, match="do not group"):
        attn(torch.randn(5, 1, 32), context=context, mask=mask)


@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_batched_padded_inputs_decode_as_alone(search):
    model = model_with(seed=3)
    rows = [torch.randint(5, 53, (n,)).tolist() for n in (3, 9, 5, 1)]
    run = (lambda s: decoding.greedy(model, s, max_len_b=7)) if search == "greedy" else (
        lambda s: decoding.beam_search(model, s, beam=3, max_len_b=7)
    )
    together = run(pad(rows, eos=True))
    alone = [run(pad([r], eos=True))[0] for r in rows]
    assert together == alone


def test_outputs_respect_the_length_limit():
    model = model_with(seed=1)
    src = pad([[7, 8, 9]], eos=True)
    for hyp in (decoding.greedy(model, src, max_len_a=0, max_len_b=4)[0], decoding.beam_search(model, src, max_len_a=0, max_len_b=4)[0]):
        assert len(hyp) <= 3  # four tokens at most, the closing </s> included


def test_sampling_controls():
    model = model_with(kind="decoder", seed=2)
    prompt = torch.tensor([[1, 9, 10]])
    greedy_run = decoding.sample(model, prompt, max_new=8, temperature=0)
    assert decoding.sample(model, prompt, max_new=8, top_k=1) == greedy_run
    assert decoding.sample(model, prompt, max_new=8, top_p=1e-6) == greedy_run
    draws = [decoding.sample(model, prompt, max_new=8, generator=torch.Generator().manual_seed(s)) for s in (0, 0, 1)]
    assert draws[0] == draws[1] and len(draws[0][0]) <= 8
    # top-k restricts every draw to the k most likely tokens of its step.
    cache = model.new_cache()
    logits = model(prompt, cache=cache)[:, -1]
    allowed = set(logits.topk(3).indices[0].tolist())
    draws = [decoding.sample(model, prompt, max_new=1, top_k=3, generator=torch.Generator().manual_seed(s))[0] for s in range(30)]
    firsts = {d[0] for d in draws if d}  # an empty draw means </s> came first
    assert firsts <= allowed and len(firsts) > 1


@pytest.fixture(scope="module")
def copy_checkpoint(tmp_path_factory):
    """A copy-task model trained here (pre-norm, about 15 s), shared by the tests below."""
    out = tmp_path_factory.mktemp("copy")
    recipe = tfbuilder.load_recipe(
        ROOT / "recipes" / "quickstart.yaml",
        [
            f"trainer.output={out}",
            "trainer.progress=false",
            "model.placement=pre",
            "data.train_size=4000",
            "data.lengths=[1, 10]",
            "trainer.max_steps=600",
            "trainer.val_every=600",
        ],
    )
    return tfbuilder.fit(recipe).run_dir


@pytest.mark.parametrize("beam, precision", [(1, "32"), (4, "32"), (4, "bf16")])
def test_trained_model_reproduces_held_out_sequences(copy_checkpoint, beam, precision):
    from tfbuilder.data import synthetic
    from tfbuilder.evaluation import translate_lines

    loaded = tfbuilder.load_checkpoint(copy_checkpoint)
    held_out, _ = synthetic.generate("copy", n=200, symbols=10, lengths=(1, 10), seed=999)
    outputs = list(translate_lines(loaded, held_out, beam=beam, precision=precision))
    assert next(loaded.model.parameters()).dtype == torch.float32  # decoding in bf16 used a copy
    exact = sum(o == s for o, s in zip(outputs, held_out)) / len(held_out)
    assert exact >= 0.98, [(s, o) for s, o in zip(held_out, outputs) if s != o][:5]


def test_translate_command_streams_lines_in_order(copy_checkpoint, tmp_path):
    lines = ["abc", "jihgfedcba", "a", "", "cafe"]
    proc = subprocess.run(
        [sys.executable, "-m", "tfbuilder", "translate", copy_checkpoint, "--beam", "2"],
        input="\n".join(lines) + "\n",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == lines
    out = tmp_path / "out.txt"
    src = tmp_path / "in.txt"
    src.write_text("\n".join(lines) + "\n")
    assert main(["translate", copy_checkpoint, "--input", str(src), "--output", str(out)]) == 0
    assert out.read_text().splitlines() == lines
    assert main(["translate", copy_checkpoint, "--input", str(src), "--output", str(out)]) == 2  # never overwritten


def test_test_command_scores_and_saves_json(copy_checkpoint, capsys):
    import json
    from pathlib import Path

    assert main(["test", copy_checkpoint, "--split", "val", "--beam", "2"]) == 0  # a run directory: its best.ckpt
    out = capsys.readouterr().out
    assert "sacreBLEU (beam 2)" in out and "chrF" in out and "perplexity" in out
    saved = json.loads(next(Path(copy_checkpoint).glob("test-val-best-beam2.json")).read_text())
    assert saved["chrf"] > 95  # a copy model: near-perfect output (BLEU is 0 on one-word lines: no 4-grams)
    assert saved["bleu_signature"].startswith("nrefs:1")
    assert saved["perplexity"] < 1.5


@pytest.mark.parametrize("verb", ["translate", "test", "generate"])
def test_bad_checkpoints_exit_2_without_traceback(tmp_path, verb, capsys):
    bad = tmp_path / "bad.ckpt"
    bad.write_bytes(b"definitely not a checkpoint")
    extra = ["--prompt", "x"] if verb == "generate" else []
    for target in (bad, tmp_path / "missing.ckpt", tmp_path):
        assert main([verb, str(target), *extra]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and "Traceback" not in err
