"""Decoding: the cache changes nothing, beam 1 is greedy, batching changes nothing, a trained model copies."""

from __future__ import annotations

import re
import select
import subprocess
import sys

import pytest
import torch

import tfbuilder
from conftest import ROOT, tiny_model
from tfbuilder.inference import decoding
from tfbuilder import registry
from tfbuilder.data.tokenizers import BOS, EOS, MASK, PAD
from tfbuilder.registry import BuildContext
from tfbuilder.cli.commands import main
from tfbuilder.data.collate import pad
from tfbuilder.spec.recipe import ModelSection

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
    """Beam 1 is greedy search (as in Hugging Face's generate), scored like every beam: the output's
    log-probability, </s> included, over the length penalty of its length counting </s>."""
    model = model_with(seed=seed)
    src = pad([torch.randint(5, 53, (n,)).tolist() for n in (8, 3, 6)], eos=True)
    for alpha in (0.0, 0.6):
        got = decoding.beam_search_nbest(model, src, beam=1, alpha=alpha, max_len_b=6)
        for row, path, (score, hyp) in zip(src, decoding.greedy(model, src, max_len_b=6), (found[0] for found in got)):
            with torch.no_grad():
                logp = model(row[None], torch.tensor([[BOS, *path]]))[0].log_softmax(-1)
            total = float(logp[torch.arange(len(path)), torch.tensor(path, dtype=torch.long)].sum() + logp[len(path), EOS])
            assert hyp == path and score == pytest.approx(total / ((5 + len(path) + 1) / 6) ** alpha, abs=1e-4)


def reference_beam_search(model, src_row: list[int], *, beam: int, alpha: float, limit: int, nbest: int | None = None):
    """Beam search written plainly: one input, no cache (the whole prefix re-run each step), every
    candidate scored; every live hypothesis may end (with </s>) at every step; the greedy
    hypothesis is kept in the beam (in the last place when the best ``beam`` leave it out); it runs
    to the length limit, with no early stop. Returns the best hypothesis, or with ``nbest`` the best
    (score, hypothesis) pairs."""
    src = torch.tensor([src_row])
    live = [(0.0, [BOS])]
    greedy: list[int] | None = [BOS]
    ended: list[tuple[float, list[int]]] = []
    for step in range(limit):
        tgt = torch.tensor([h for _, h in live])
        logp = model(src.expand(len(live), -1), tgt)[:, -1].log_softmax(-1)
        logp[:, [PAD, BOS, MASK]] = float("-inf")  # never generated
        if step == 0:  # at least one token (Rules.min_len)
            logp[:, EOS] = float("-inf")
        if step + 1 >= limit:  # only </s> may follow
            logp = torch.full_like(logp, float("-inf")).index_fill(1, torch.tensor([EOS]), 0) + logp
        for b, (s, h) in enumerate(live):
            ended.append(((s + float(logp[b, EOS])) / ((5.0 + step + 1) / 6.0) ** alpha, h[1:]))
        cands = sorted(
            ((s + float(logp[b, w]), h + [w]) for b, (s, h) in enumerate(live) for w in range(logp.shape[1]) if w != EOS),
            key=lambda c: -c[0],
        )
        nxt = [c for c in cands[:beam] if c[0] > float("-inf")]
        if greedy is not None:
            b = [h for _, h in live].index(greedy)
            w = int(logp[b].argmax())
            if w == EOS:
                greedy = None
            else:
                greedy = greedy + [w]
                if greedy not in [h for _, h in nxt]:
                    nxt[-1:] = [(live[b][0] + float(logp[b, w]), greedy)]
        live = nxt
        if step + 1 >= limit or not live:
            break
    ranked = sorted(ended, key=lambda e: -e[0])
    return ranked[0][1] if nbest is None else ranked[:nbest]


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


def test_nbest_equals_the_plain_reference():
    torch.manual_seed(7)
    model = tfbuilder.build_model(ModelSection.model_validate(tiny_model())).eval()
    rows = [torch.randint(5, 53, (n,)).tolist() + [EOS] for n in (2, 6, 4, 7)]
    with torch.no_grad():
        got = decoding.beam_search_nbest(model, pad(rows), beam=4, nbest=3, alpha=0.6, max_len_a=0, max_len_b=8)
        want = [reference_beam_search(model, r, beam=4, alpha=0.6, limit=8, nbest=3) for r in rows]
    assert [[h for _, h in found] for found in got] == [[h for _, h in found] for found in want]
    for found, expected in zip(got, want):
        assert [s for s, _ in found] == pytest.approx([s for s, _ in expected], abs=1e-4)
        assert [s for s, _ in found] == sorted((s for s, _ in found), reverse=True)
    assert [found[0][1] for found in got] == decoding.beam_search(model, pad(rows), beam=4, alpha=0.6, max_len_a=0, max_len_b=8)
    with pytest.raises(ValueError, match="nbest"):
        decoding.beam_search_nbest(model, pad(rows), beam=2, nbest=3)


def test_sampled_translations_carry_their_log_probability():
    torch.manual_seed(3)
    model = tfbuilder.build_model(ModelSection.model_validate(tiny_model())).eval()
    src = pad([torch.randint(5, 53, (n,)).tolist() + [EOS] for n in (3, 6)])
    # Temperature 0 is greedy.
    cold = decoding.sample_translations(model, src, n=1, temperature=0.0, max_len_b=6)
    assert [found[0][1] for found in cold] == decoding.greedy(model, src, max_len_b=6)
    # Each sample's score is the model's log-probability of its tokens and the closing </s>.
    drawn = decoding.sample_translations(model, src, n=5, temperature=1.5, generator=torch.Generator().manual_seed(0), max_len_b=6)
    assert [len(found) for found in drawn] == [5, 5]
    with torch.no_grad():
        for row, found in zip(src, drawn):
            assert [s for s, _ in found] == sorted((s for s, _ in found), reverse=True)
            for score, ids in found:
                tgt = torch.tensor([[BOS, *ids]])
                logp = model(row[None], tgt)[0].log_softmax(-1)
                # An output cut at the length limit ends with a forced </s>: counted too.
                want = sum(float(logp[t, w]) for t, w in enumerate([*ids, EOS]))
                assert score == pytest.approx(want, abs=1e-4), ids
    # The same seed draws the same samples; top-k 1 leaves one choice: the greedy one.
    again = decoding.sample_translations(model, src, n=5, temperature=1.5, generator=torch.Generator().manual_seed(0), max_len_b=6)
    assert again == drawn
    top1 = decoding.sample_translations(model, src, n=2, top_k=1, generator=torch.Generator().manual_seed(1), max_len_b=6)
    assert [[ids for _, ids in found] for found in top1] == [[g, g] for g in decoding.greedy(model, src, max_len_b=6)]


CROSS_CASES = [pytest.param(name, {"heads": 4}, id=name) for name in registry.types("attention")] + [
    pytest.param("multihead", {"heads": 4, "kv_heads": 2}, id="multihead-grouped-query"),
]


@pytest.mark.parametrize("name, params", CROSS_CASES)
def test_cross_attention_groups_beams_over_one_source(name, params):
    """q rows (b*g) against b sources equals the same attention with each source copied g times, for
    every registered attention type (each may cross-attend: decoder.cross_attention takes any)."""
    torch.manual_seed(0)
    entry = registry.get("attention", name)
    attn = registry.build("attention", entry.params.model_validate({"type": name, **params}), BuildContext(d_model=32, cross=True)).eval()
    x, context = torch.randn(6, 1, 32), torch.randn(2, 5, 32)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)[:, None, None, :]
    for key_mask in (mask, None):
        grouped = attn(x, context=context, mask=key_mask)
        copied = attn(x, context=context.repeat_interleave(3, 0), mask=None if key_mask is None else key_mask.repeat_interleave(3, 0))
        torch.testing.assert_close(grouped, copied)
        alone = torch.cat([attn(x[3 * s : 3 * s + 3], context=context[s : s + 1], mask=None if key_mask is None else key_mask[s : s + 1]) for s in range(2)])
        torch.testing.assert_close(grouped, alone)  # each beam reads its own input's source only
    with pytest.raises(ValueError, match="do not group"):
        attn(torch.randn(5, 1, 32), context=context, mask=mask)


@pytest.mark.parametrize("attention", registry.types("attention"))
@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_batched_padded_inputs_decode_as_alone(search, attention):
    model = model_with("attention", attention, seed=3)
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
def copy_checkpoint(quickstart_run, tmp_path_factory):
    """The quick-start copy model, trained once per test run (conftest.py), copied: the tests below
    write scores and outputs into its run directory."""
    import shutil

    return str(shutil.copytree(quickstart_run, tmp_path_factory.mktemp("copy") / "quickstart"))


def test_trained_model_reproduces_held_out_sequences_and_beam_is_never_below_greedy(copy_checkpoint):
    from tfbuilder.data import synthetic
    from tfbuilder.inference.translate import translate_lines

    loaded = tfbuilder.load_checkpoint(copy_checkpoint)
    held_out, _ = synthetic.generate("copy", n=200, symbols=10, lengths=(1, 10), seed=999)
    exact = {}
    for beam, precision in [(1, "32"), (4, "32"), (4, "bf16")]:
        outputs = list(translate_lines(loaded, held_out, beam=beam, precision=precision))
        exact[beam, precision] = sum(o == s for o, s in zip(outputs, held_out)) / len(held_out)
        assert exact[beam, precision] >= 0.98, [(s, o) for s, o in zip(held_out, outputs) if s != o][:5]
    assert next(loaded.model.parameters()).dtype == torch.float32  # decoding in bf16 used a copy
    assert exact[4, "32"] >= exact[1, "32"]


def test_load_checkpoint_picks_what_every_command_picks(copy_checkpoint, caplog):
    import logging
    from pathlib import Path

    from tfbuilder.runs.checkpoints import CheckpointError

    run = Path(copy_checkpoint)
    with caplog.at_level(logging.INFO, logger="tfbuilder"):
        loaded = tfbuilder.load_checkpoint(run)
    assert loaded.path == run / "checkpoints" / "best.ckpt"
    assert f"loaded {loaded.describe()}" in caplog.text and f"best.ckpt (step {loaded.step:,})" in loaded.describe()
    assert tfbuilder.load_checkpoint(run, checkpoint="last").path == run / "checkpoints" / "last.ckpt"
    assert tfbuilder.load_checkpoint(run, checkpoint=str(run / "checkpoints" / "last.ckpt")).path.name == "last.ckpt"
    with pytest.raises(CheckpointError, match="tfbuilder average"):
        tfbuilder.load_checkpoint(run, checkpoint="averaged")


def test_the_python_translation_example_runs(copy_checkpoint, capsys):
    """The example of docs/python-api.md, run on the copy model trained here."""
    page = (ROOT / "docs" / "python-api.md").read_text()
    example = page.split("<!-- example: translation -->")[1].split("```python")[1].split("```")[0]
    exec(compile(example.replace("runs/quickstart/version_0", str(copy_checkpoint)), "python-api.md", "exec"), {})
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == tfbuilder.load_checkpoint(copy_checkpoint).describe()
    assert printed[1:] == ["abcjihg", "hbea", "abcjihg"]


def test_test_command_writes_the_translations(copy_checkpoint, tmp_path, capsys):
    from tfbuilder.data.prepare import prepare

    loaded = tfbuilder.load_checkpoint(copy_checkpoint)
    sources, references = prepare(loaded.recipe.data, vocab=loaded.vocab, model_vocab=loaded.recipe.model.vocab_size).raw["val"]
    plain, fairseq = tmp_path / "hyp.txt", tmp_path / "gen.out"
    assert main(["test", copy_checkpoint, "--split", "val", "--beam", "2", "--output", str(plain)]) == 0
    hypotheses = plain.read_text().splitlines()
    assert len(hypotheses) == len(sources) and sum(h == r for h, r in zip(hypotheses, references)) >= 0.95 * len(sources)
    assert main(["test", copy_checkpoint, "--split", "val", "--beam", "2", "--output", str(fairseq), "--output-format", "fairseq"]) == 0
    lines = fairseq.read_text().splitlines()
    assert len(lines) == 3 * len(sources)
    for i in (0, len(sources) - 1):
        s, t, h = lines[3 * i : 3 * i + 3]
        assert s == f"S-{i}\t{sources[i]}" and t == f"T-{i}\t{references[i]}"
        tag, score, text = h.split("\t")
        assert tag == f"H-{i}" and text == hypotheses[i] and float(score) <= 0
    capsys.readouterr()
    assert main(["test", copy_checkpoint, "--split", "val", "--output", str(plain)]) == 2  # never overwritten
    assert "not overwriting" in capsys.readouterr().err


def test_an_ensemble_translates_and_is_scored(copy_checkpoint, tmp_path, capsys):
    import json
    from pathlib import Path

    src = tmp_path / "in.txt"
    src.write_text("abc\nfedcb\n")
    best, last = copy_checkpoint, str(Path(copy_checkpoint) / "checkpoints" / "last.ckpt")
    assert main(["translate", best, last, "--input", str(src)]) == 0
    assert capsys.readouterr().out.splitlines() == ["abc", "fedcb"]
    assert main(["test", best, last, "--split", "val", "--beam", "2"]) == 0
    out = capsys.readouterr().out
    assert "ensembled with" in out
    saved = json.loads((Path(copy_checkpoint) / "test-val-best-ensemble2-beam2.json").read_text())
    assert saved["exact_match"] >= 0.95 and len(saved["ensemble"]) == 2


def test_translate_command_streams_lines_in_order(copy_checkpoint, tmp_path):
    """From a file to a file (standard input and output: the pipe test below)."""
    lines = ["abc", "jihgfedcba", "a", "", "cafe"]
    out = tmp_path / "out.txt"
    src = tmp_path / "in.txt"
    src.write_text("\n".join(lines) + "\n")
    assert main(["translate", copy_checkpoint, "--input", str(src), "--output", str(out)]) == 0
    assert out.read_text().splitlines() == lines
    assert main(["translate", copy_checkpoint, "--input", str(src), "--output", str(out)]) == 2  # never overwritten


def test_translate_answers_each_line_of_a_slow_pipe_before_the_next(copy_checkpoint):
    """Through a real pipe: lines written at once come back in order (an empty line included); then a
    program that writes one line and waits for its answer gets it (no batching wait). One process
    for both, as `python -m tfbuilder` starting is most of the time."""
    proc = subprocess.Popen(  # unbuffered: a readline takes one line, and select sees what is left
        [sys.executable, "-m", "tfbuilder", "translate", copy_checkpoint, "--beam", "2"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0,
    )
    try:
        burst = ["abc", "jihgfedcba", "a", "", "cafe"]
        proc.stdin.write(("\n".join(burst) + "\n").encode())
        proc.stdin.flush()
        for line in burst:
            ready, _, _ = select.select([proc.stdout], [], [], 120)
            assert ready, f"no answer to {line!r} while the pipe stays open"
            assert proc.stdout.readline().decode().rstrip("\n") == line
        for line in ["abc", "hgf", "a"]:
            proc.stdin.write(line.encode() + b"\n")
            proc.stdin.flush()
            ready, _, _ = select.select([proc.stdout], [], [], 120)
            assert ready, f"no answer to {line!r} while the pipe stays open"
            assert proc.stdout.readline().decode().rstrip("\n") == line
        proc.stdin.close()
        assert proc.wait(timeout=60) == 0, proc.stderr.read().decode()
    finally:
        proc.kill()


def test_the_default_beam_copies_what_greedy_copies(copy_checkpoint, tmp_path, capsys):
    """A search that stopped once `beam` hypotheses had ended gave 'hae hbe hbi' here, while
    greedy copied the lines (on a small vocabulary an early </s> is always among the best few)."""
    lines = ["haeh", "hbea", "hbii", "hgf", "a", "jihgfedcba"]
    src = tmp_path / "in.txt"
    src.write_text("\n".join(lines) + "\n")
    for beam in ([], ["--beam", "2"], ["--beam", "8"], ["--beam", "1"]):
        assert main(["translate", copy_checkpoint, "--input", str(src), *beam]) == 0
        assert capsys.readouterr().out.splitlines() == lines, beam


def test_translate_nbest_and_sampling(copy_checkpoint, tmp_path, capsys):
    src = tmp_path / "in.txt"
    src.write_text("abc\nfedcb\n")
    assert main(["translate", copy_checkpoint, "--beam", "4", "--nbest", "3", "--input", str(src)]) == 0
    rows = [line.split(" ||| ") for line in capsys.readouterr().out.splitlines()]
    assert [r[0] for r in rows] == ["0", "0", "0", "1", "1", "1"]
    assert [rows[0][1], rows[3][1]] == ["abc", "fedcb"]  # the best first
    scores = [float(r[2]) for r in rows]
    assert scores[:3] == sorted(scores[:3], reverse=True) and scores[3:] == sorted(scores[3:], reverse=True)
    assert len({r[1] for r in rows[:3]}) == 3  # three different candidates

    sampled = ["translate", copy_checkpoint, "--sample", "--nbest", "4", "--temperature", "2", "--seed", "5", "--input", str(src)]
    assert main(sampled) == 0
    first = capsys.readouterr().out
    assert main(sampled) == 0
    assert capsys.readouterr().out == first  # the seed fixes the draws
    assert len(first.splitlines()) == 8

    assert main(["translate", copy_checkpoint, "--beam", "2", "--nbest", "3", "--input", str(src)]) == 2
    assert "--nbest 3 needs a beam at least as wide" in capsys.readouterr().err
    assert main(["translate", copy_checkpoint, "--batch-size", "1", "--max-tokens", "8", "--input", str(src)]) == 0
    assert capsys.readouterr().out.splitlines() == ["abc", "fedcb"]

    src.write_text("abc\nazbz\u00fc\n")  # the copy model knows a..j only
    assert main(["translate", copy_checkpoint, "--input", str(src)]) == 0
    err = capsys.readouterr().err
    assert "translate: line 1: not in the vocabulary, read as <unk>: 'z' '\u00fc'" in err and "line 0" not in err


def test_test_command_scores_and_saves_json(copy_checkpoint, capsys):
    import json
    from pathlib import Path

    assert main(["test", copy_checkpoint, "--split", "val", "--beam", "2"]) == 0  # a run directory: its best.ckpt
    out = capsys.readouterr().out
    # A copy task is not language: exact match and token accuracy, no BLEU (0 for any one-word line).
    assert re.search(r"exact match \(beam 2\)\s+(9[5-9]|100)\.\d\d% of outputs", out), out
    assert re.search(r"token accuracy\s+(9[89]|100)\.\d\d%", out), out
    assert "not computed: a synthetic task" in out and "chrF" not in out
    saved = json.loads(next(Path(copy_checkpoint).glob("test-val-best-beam2.json")).read_text())
    assert saved["exact_match"] >= 0.95 and saved["accuracy"] >= 0.98 and saved["bleu"] is None
    assert saved["perplexity"] < 1.5


def test_bleu_fits_the_data():
    from tfbuilder.use.evaluation import bleu_tokenize
    from tfbuilder.spec.sections import DataSection

    assert bleu_tokenize(DataSection.model_validate({"type": "synthetic", "task": "copy", "tokenizer": {"type": "char"}})) is None
    text = {"type": "parallel", "path": "d", "src_lang": "de", "tgt_lang": "en"}
    assert bleu_tokenize(DataSection.model_validate({**text, "tokenizer": {"type": "char", "vocab_size": 60}})) == "char"
    assert bleu_tokenize(DataSection.model_validate({**text, "tokenizer": {"type": "bpe", "vocab_size": 1000}})) == "13a"


@pytest.mark.parametrize("verb", ["translate", "test", "generate"])
def test_bad_checkpoints_exit_2_without_traceback(tmp_path, verb, capsys):
    bad = tmp_path / "bad.ckpt"
    bad.write_bytes(b"definitely not a checkpoint")
    extra = ["--prompt", "x"] if verb == "generate" else []
    for target in (bad, tmp_path / "missing.ckpt", tmp_path):
        assert main([verb, str(target), *extra]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and "Traceback" not in err


def test_generate_past_a_learned_position_table_is_refused_before_it_starts(tmp_path, capsys):
    """A decoder with a learned table of 8 positions: <s> and a 3-symbol prompt take 4, and sampling
    feeds each new token, so --max-new 4 fits and 5 does not; the refusal names the largest that fits."""
    from tfbuilder.data.prepare import Vocab
    from tfbuilder.data.tokenizers import CharTokenizer
    from tfbuilder.interop.hf.convert import checkpoint_dict
    from tfbuilder.spec.recipe import recipe_from_dict

    spec = tiny_model(kind="decoder", encoder=None, vocab_size=15, position={"type": "learned", "max_len": 8})
    recipe = recipe_from_dict({"name": "learned-8", "model": spec})
    tok = CharTokenizer("abcdefghij")
    ckpt = tmp_path / "run" / "checkpoints" / "last.ckpt"
    ckpt.parent.mkdir(parents=True)
    torch.save(checkpoint_dict(tfbuilder.build_model(recipe), recipe, Vocab(tok, tok), source="test"), ckpt)
    run = lambda prompt, new: main(["generate", str(ckpt), "--prompt", prompt, "--max-new", str(new), "--temperature", "0"])  # noqa: E731
    assert run("abc", 4) == 0
    capsys.readouterr()
    assert run("abc", 5) == 2
    err = capsys.readouterr().err
    assert "need 9 positions" in err and "learned position table has 8" in err and "--max-new 4 or less" in err
    assert run("abcdefg", 1) == 2
    assert "shorten the prompt" in capsys.readouterr().err


def test_generate_echoes_the_prompt_unless_told_not_to(tmp_path, capsys):
    from tfbuilder.data.prepare import Vocab
    from tfbuilder.data.tokenizers import CharTokenizer
    from tfbuilder.interop.hf.convert import checkpoint_dict
    from tfbuilder.spec.recipe import recipe_from_dict

    recipe = recipe_from_dict({"name": "echo", "model": tiny_model(kind="decoder", encoder=None, vocab_size=15)})
    tok = CharTokenizer("abcdefghij")
    ckpt = tmp_path / "last.ckpt"
    torch.save(checkpoint_dict(tfbuilder.build_model(recipe), recipe, Vocab(tok, tok), source="test"), ckpt)
    args = ["generate", str(ckpt), "--prompt", "cab", "--max-new", "6", "--temperature", "0"]
    assert main(args) == 0
    echoed = capsys.readouterr().out.rstrip("\n")
    assert main([*args, "--no-echo"]) == 0
    new = capsys.readouterr().out.rstrip("\n")
    assert echoed == "cab" + new and new != echoed
