"""Left-padded prompts of a decoder-only model: each row gives the logits it gives alone (1e-5), for
every position type and attention, in one pass and through the key/value cache."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_model

import tfbuilder
from tfbuilder import masks, registry
from tfbuilder.inference import decoding
from tfbuilder.spec.recipe import ModelSection

PAD = 0
LENGTHS = (7, 4, 1)


def decoder_with(family: str, name: str, seed: int = 0):
    torch.manual_seed(seed)
    spec = tiny_model(kind="decoder", encoder=None)
    spec[family] = {"type": name}
    return tfbuilder.build_model(ModelSection.model_validate(spec)).eval()


def prompts(lengths=LENGTHS) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Rows of ``lengths`` real tokens (never the pad id), and the same rows left-padded to one batch."""
    g = torch.Generator().manual_seed(3)
    rows = [torch.randint(5, 53, (n,), generator=g) for n in lengths]
    width = max(lengths)
    batch = torch.full((len(rows), width), PAD)
    for i, row in enumerate(rows):
        batch[i, width - len(row) :] = row
    return rows, batch


CASES = [
    pytest.param(family, name, id=f"{family}-{name}")
    for family in ("position", "attention")
    for name in registry.types(family)
]


@pytest.mark.parametrize("family, name", CASES)
def test_padded_batch_gives_each_row_its_own_logits(family, name):
    model = decoder_with(family, name)
    rows, batch = prompts()
    real = masks.left_padding(batch, PAD)
    with torch.no_grad():
        padded = model(batch, attention_mask=real)
        for i, row in enumerate(rows):
            alone = model(row[None])[0]
            torch.testing.assert_close(padded[i, batch.shape[1] - len(row) :], alone, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("family, name", CASES)
def test_padded_batch_through_the_cache(family, name):
    """The prompt in one pass, then three tokens one at a time, the mask growing with them."""
    model = decoder_with(family, name)
    rows, batch = prompts()
    more = torch.randint(5, 53, (len(rows), 3), generator=torch.Generator().manual_seed(4))
    real = masks.left_padding(batch, PAD)
    with torch.no_grad():
        cache = model.new_cache()
        steps = [model(batch, cache=cache, attention_mask=real)[:, -1:]]
        for t in range(more.shape[1]):
            real = torch.cat([real, torch.ones_like(real[:, :1])], dim=1)
            offset = batch.shape[1] + t
            steps.append(model(more[:, t : t + 1], cache=cache, offset=offset, attention_mask=real))
        got = torch.cat(steps, dim=1)
        for i, row in enumerate(rows):
            alone = model(torch.cat([row, more[i]])[None])[0, len(row) - 1 :]
            torch.testing.assert_close(got[i], alone, atol=1e-5, rtol=1e-5)


def test_left_padding_marks_only_leading_pads():
    ids = torch.tensor([[0, 0, 5, 0, 6], [7, 0, 8, 9, 0]])
    assert masks.left_padding(ids, 0).tolist() == [[False, False, True, True, True], [True] * 5]
    assert masks.position_ids(masks.left_padding(ids, 0), 3).tolist() == [[0, 1, 2], [2, 3, 4]]


def test_a_mask_of_the_wrong_width_is_refused():
    model = decoder_with("position", "rotary")
    with pytest.raises(ValueError, match="must cover"):
        model(torch.ones(2, 3, dtype=torch.long), attention_mask=torch.ones(2, 4, dtype=torch.bool))


def continuation_log_prob(model, prompt: list[int], new: list[int], end: int, *, ended: bool) -> float:
    """log P(new (+ </s>) | prompt), computed in one pass without a cache."""
    tail = new + ([end] if ended else [])
    ids = torch.tensor([prompt + tail])
    with torch.no_grad():
        logp = model(ids)[0, len(prompt) - 1 : -1].log_softmax(-1)
    return float(logp.gather(1, torch.tensor(tail)[:, None]).sum())


@pytest.mark.parametrize("name", ["rotary", "learned", "alibi"])
def test_padded_prompts_continue_as_alone(name):
    """Greedy and both beam searches: a left-padded batch gives each row what it gives alone; seeded
    sampling of the batch is reproducible."""
    model = decoder_with("position", name)
    rows = [row.tolist() for row in prompts()[0]]
    ids, real = decoding.prompt_batch(model, rows)
    assert real is not None and (ids[:, 0] == model.pad_id).any()
    searches = {
        "greedy": lambda x, m: decoding.sample(model, x, max_new=6, temperature=0, attention_mask=m),
        "beam": lambda x, m: decoding.continue_beam_search(model, x, beam=3, nbest=2, max_new=6, attention_mask=m),
        "transformers": lambda x, m: decoding.transformers_beam_search(model, x, beam=3, max_new=6, attention_mask=m),
    }
    for search in searches.values():
        together = search(ids, real)
        for i, row in enumerate(rows):
            assert_same(together[i], search(torch.tensor([row]), None)[0])
    seeded = [decoding.sample(model, ids, max_new=6, attention_mask=real, generator=torch.Generator().manual_seed(0))]
    seeded.append(
        decoding.sample(model, ids, max_new=6, attention_mask=real, generator=torch.Generator().manual_seed(0))
    )
    assert seeded[0] == seeded[1] and all(len(new) <= 6 for new in seeded[0])


def assert_same(got, want) -> None:
    """The same ids; the same scores to 1e-5 (a batch sums in another order)."""
    if isinstance(got, tuple):
        assert got[1] == want[1] and got[0] == pytest.approx(want[0], abs=1e-5)
    elif got and isinstance(got[0], tuple):
        for g, w in zip(got, want, strict=True):
            assert_same(g, w)
    else:
        assert got == want


def test_beam_continuations_carry_their_log_probabilities():
    """Each hypothesis's score is its log-probability, recomputed without a cache, over the GNMT penalty:
    the cache follows the beams as they are reordered."""
    model = decoder_with("position", "rotary")
    rows = [row.tolist() for row in prompts()[0]]
    ids, real = decoding.prompt_batch(model, rows)
    end = model.specials.end
    found = decoding.continue_beam_search(model, ids, beam=4, nbest=3, alpha=0.6, max_new=5, attention_mask=real)
    for row, candidates in zip(rows, found, strict=True):
        for score, hyp in candidates:
            ended = len(hyp) < 5
            length = len(hyp) + int(ended)
            want = continuation_log_prob(model, row, hyp, end, ended=ended) / ((5 + length) / 6) ** 0.6
            assert score == pytest.approx(want, abs=1e-4)
    # one new token: </s> is ruled out (minimum length), so every hypothesis is cut at the limit
    cut = decoding.continue_beam_search(model, ids, beam=4, nbest=3, alpha=0.6, max_new=1, attention_mask=real)
    for row, candidates in zip(rows, cut, strict=True):
        assert len(candidates) == 3 and all(len(hyp) == 1 for _, hyp in candidates)
        for score, hyp in candidates:
            want = continuation_log_prob(model, row, hyp, end, ended=False) / ((5 + 1) / 6) ** 0.6
            assert score == pytest.approx(want, abs=1e-4)


def test_decoder_only_beam_search_and_greedy_continue_prompts():
    """beam_search and greedy, the translation searches, continue a decoder-only model's prompts."""
    model = decoder_with("position", "rotary")
    rows = [row.tolist() for row in prompts()[0]]
    ids, real = decoding.prompt_batch(model, rows)
    assert decoding.greedy(model, ids, max_len_b=6) == decoding.sample(
        model, ids, max_new=6, temperature=0, attention_mask=real
    )
    best = decoding.beam_search(model, ids, beam=3, max_len_b=6)
    assert best == [c[0][1] for c in decoding.continue_beam_search(model, ids, beam=3, max_new=6, attention_mask=real)]
    assert all(best)


@pytest.mark.parametrize("name", ["rotary"])
def test_rotary_keys_are_cached_at_each_rows_positions(name):
    """The cache holds a padded row's keys rotated by its own positions, as alone (scores depend on
    distances only, so the logits alone would not tell rotation by columns apart)."""
    model = decoder_with("position", name)
    rows, batch = prompts()
    real = masks.left_padding(batch, PAD)
    with torch.no_grad():
        cache = model.new_cache()
        model(batch, cache=cache, attention_mask=real)
        for i, row in enumerate(rows):
            alone = model.new_cache()
            model(row[None], cache=alone)
            for layer, own in zip(cache, alone, strict=True):
                keys = layer["self"]["k"][i, :, batch.shape[1] - len(row) :]
                torch.testing.assert_close(keys, own["self"]["k"][0], atol=1e-5, rtol=1e-5)
