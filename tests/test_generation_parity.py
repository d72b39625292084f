"""Decoder-only generation against Hugging Face transformers' ``generate``: a tiny random GPT-2 and Llama,
imported with ``tfbuilder.interop.hf``, continue a left-padded batch of prompts of different lengths as
transformers does. Greedy search and beam search give the same tokens (and beam scores, 1e-4); sampling
draws from the same distribution at every step (1e-5).

Sampling is compared through its distributions: transformers draws with the global generator from
float32 probabilities, tfbuilder from float64 ones with the generator it is given, so the same seed
need not give the same token. Each step's processed probabilities are compared instead, tfbuilder fed
the tokens transformers drew.

The mapping (docs/decoding.md): ``min_new_tokens=1`` is tfbuilder's default ``Rules(min_len=1)``;
``suppress_tokens=model.specials.never`` its ban of the special ids; ``num_beams``, ``length_penalty``
and ``early_stopping`` are :func:`~tfbuilder.inference.decoding.transformers_beam_search`'s ``beam``,
``length_penalty`` and ``early_stopping``."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")  # in the test extra

from test_hf import small_reference  # noqa: E402

from tfbuilder.cli.commands import main  # noqa: E402
from tfbuilder.inference import decoding  # noqa: E402
from tfbuilder.inference.rules import Rules, distribution  # noqa: E402
from tfbuilder.inference.transformers_beams import TransformersBeams  # noqa: E402
from tfbuilder.interop.hf import import_hf  # noqa: E402
from tfbuilder.interop.hf.convert import load_hf  # noqa: E402

pytestmark = pytest.mark.xdist_group("hf")

ROWS = [[5, 17, 33, 8, 41], [9, 60], [70, 3, 12]]
# An end id the model emits often, so that outputs end at different steps (the default ids are rare).
LIKELY_END = {"gpt2": 21, "llama": 78}
CASES = [pytest.param(f, e, id=f"{f}-{e}-end") for f in ("gpt2", "llama") for e in ("default", "likely")]


@pytest.fixture(scope="module")
def pairs(tmp_path_factory) -> dict:
    """(transformers' model, tfbuilder's import of it) per family and end id."""
    out = {}
    for family in ("gpt2", "llama"):
        for end in ("default", "likely"):
            ref = small_reference(family).eval()
            if end == "likely":
                ref.config.eos_token_id = ref.generation_config.eos_token_id = LIKELY_END[family]
            path = tmp_path_factory.mktemp(f"{family}-{end}")
            ref.save_pretrained(path)
            out[family, end] = ref, load_hf(path)[2]
            out[family, end, "path"] = path
    return out


def hf_generate(ref, model, ids: torch.Tensor, real: torch.Tensor, **options):
    """transformers' generate with tfbuilder's rules: one token at least, the special ids banned."""
    never = list(model.specials.never) or None
    return ref.generate(
        input_ids=ids, attention_mask=real.long(), pad_token_id=0, min_new_tokens=1, suppress_tokens=never,
        return_dict_in_generate=True, **options,
    )  # fmt: skip


def new_ids(sequences: torch.Tensor, width: int, end: int) -> list[list[int]]:
    """Each row's new tokens up to its end id (transformers pads after it)."""
    out = []
    for row in sequences[:, width:].tolist():
        out.append(row[: row.index(end)] if end in row else row)
    return out


@pytest.mark.parametrize("family, end", CASES)
def test_greedy_equals_generate(pairs, family, end):
    ref, model = pairs[family, end]
    ids, real = decoding.prompt_batch(model, ROWS)
    assert real is not None
    ours = decoding.sample(model, ids, max_new=12, temperature=0, attention_mask=real)
    theirs = hf_generate(ref, model, ids, real, max_new_tokens=12, do_sample=False)
    assert ours == new_ids(theirs.sequences, ids.shape[1], model.specials.end)


BEAM_OPTIONS = [
    pytest.param({}, id="defaults"),
    pytest.param({"length_penalty": 0.0, "early_stopping": "never"}, id="canonical"),
    pytest.param({"early_stopping": True}, id="early"),
    pytest.param({"length_penalty": 2.0, "early_stopping": "never"}, id="long"),
]


@pytest.mark.parametrize("options", BEAM_OPTIONS)
@pytest.mark.parametrize("family, end", CASES)
def test_beam_search_equals_generate(pairs, family, end, options):
    ref, model = pairs[family, end]
    ids, real = decoding.prompt_batch(model, ROWS)
    found = decoding.transformers_beam_search(model, ids, beam=3, max_new=10, attention_mask=real, **options)
    theirs = hf_generate(
        ref, model, ids, real, max_new_tokens=10, num_beams=3, do_sample=False, output_scores=True, **options
    )
    assert [hyp for _, hyp in found] == new_ids(theirs.sequences, ids.shape[1], model.specials.end)
    torch.testing.assert_close(torch.tensor([s for s, _ in found]), theirs.sequences_scores, atol=1e-4, rtol=1e-4)


def assert_sampling_distributions(ref, model, max_new: int) -> None:
    """Seeded sampling (temperature, top-k, top-p) over ROWS, left-padded: tfbuilder's distribution at
    every step is transformers', tfbuilder fed the tokens transformers drew."""
    ids, real = decoding.prompt_batch(model, ROWS)
    warpers = {"temperature": 0.7, "top_k": 20, "top_p": 0.9}
    torch.manual_seed(0)
    theirs = hf_generate(ref, model, ids, real, max_new_tokens=max_new, do_sample=True, output_scores=True, **warpers)
    drawn = theirs.sequences[:, ids.shape[1] :]
    ours: list[torch.Tensor] = []

    def forced(logp: torch.Tensor) -> torch.Tensor:  # record tfbuilder's distribution, take transformers' token
        ours.append(distribution(logp, **warpers))
        return drawn[:, len(ours) - 1]

    decoding.continue_prompts(model, ids, forced, max_new=max_new, attention_mask=real)
    live = torch.ones(len(ROWS), dtype=torch.bool)
    for step, probs in enumerate(ours):
        want = theirs.scores[step].double().softmax(-1)
        torch.testing.assert_close(probs[live], want[live], atol=1e-5, rtol=1e-5)
        live &= drawn[:, step] != model.specials.end
    assert len(ours) >= 2


@pytest.mark.parametrize("family, end", CASES)
def test_sampling_draws_from_generates_distributions(pairs, family, end):
    assert_sampling_distributions(*pairs[family, end], max_new=8)


def test_minimum_length_bans_the_end_at_the_first_step(pairs):
    """With an end id the model's first choice, no search returns an empty output by default (as
    transformers with min_new_tokens=1); with min_len 0 the output is empty (as transformers' default)."""
    ref, model = pairs["gpt2", "likely"]
    ids, real = decoding.prompt_batch(model, [[3, 21], [7, 21]])  # GPT-2 repeats the last token: 21 comes first
    first = ref(input_ids=ids).logits[:, -1].argmax(-1)
    assert (first == model.specials.end).all()
    assert all(decoding.sample(model, ids, max_new=5, temperature=0))
    assert all(hyp for _, hyp in decoding.transformers_beam_search(model, ids, beam=3, max_new=5))
    assert all(c[0][1] for c in decoding.continue_beam_search(model, ids, beam=3, max_new=5))
    loose = Rules(min_len=0)
    assert decoding.sample(model, ids, max_new=5, temperature=0, rules=loose) == [[], []]
    theirs = ref.generate(input_ids=ids, max_new_tokens=5, do_sample=False, pad_token_id=0)
    assert new_ids(theirs, ids.shape[1], model.specials.end) == [[], []]


def test_cli_generates_several_prompts_as_one_padded_batch(pairs, tmp_path, capsys):
    """``tfbuilder generate`` with --prompt repeated: one line per prompt, each what it gives alone;
    --beam 3 searches."""
    run = tmp_path / "run"
    import_hf(pairs["llama", "likely", "path"], run)
    greedy = ["--max-new", "6", "--temperature", "0", "--no-echo"]
    assert main(["generate", str(run), "--prompt", "5 17 33 8", "--prompt", "9", *greedy]) == 0
    together = capsys.readouterr().out.splitlines()
    alone = []
    for prompt in ("5 17 33 8", "9"):
        assert main(["generate", str(run), "--prompt", prompt, *greedy]) == 0
        alone += capsys.readouterr().out.splitlines()
    assert together == alone and len(together) == 2
    assert main(["generate", str(run), "--prompt", "5 17 33 8", "--prompt", "9", "--beam", "3", "--no-echo"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2


@pytest.mark.parametrize("early_stopping, closed", [(False, True), ("never", False)])
def test_transformers_beams_stopping_bound(early_stopping, closed):
    """transformers' ``_check_early_stop_heuristic``: the best running score over the current length
    (False), or over max_new when length_penalty > 0 ("never"), against the worst finished one."""
    state = TransformersBeams.start(
        1, beam=2, length_penalty=2.0, early_stopping=early_stopping, max_new=10, end=0, device="cpu"
    )
    state.finished = [[(-0.5, [1]), (-0.6, [2])]]
    state.scores = torch.tensor([[-30.0, -40.0]])
    state._close(5)  # -30 / 5**2 = -1.2 cannot beat -0.6; -30 / 10**2 = -0.3 can
    assert bool(state.closed[0]) is closed
