"""Generation parity for every decoder family ``import-hf`` takes (tests/test_hf_families.py's tiny
configs, every field the importer reads off its default): on a left-padded batch of prompts of
different lengths, the imported model gives transformers' logits on every real token, and greedy
search and beam search give the tokens (and beam scores) of transformers' ``generate``, and seeded
sampling draws from its distribution at every step.

GPT-2 and Llama, with more beam options, are in tests/test_generation_parity.py."""

from __future__ import annotations

from unittest import mock

import pytest
import torch

transformers = pytest.importorskip("transformers")  # in the test extra

from test_generation_parity import ROWS, assert_sampling_distributions, hf_generate, new_ids  # noqa: E402
from test_hf_families import CONFIGS, FAMILIES, TOL, reference  # noqa: E402

from tfbuilder.inference import decoding  # noqa: E402
from tfbuilder.interop.hf.convert import load_hf  # noqa: E402

pytestmark = pytest.mark.xdist_group("hf")


# Phi-3's LongRoPE switches from its short to its long factors once a sequence passes
# original_max_position_embeddings. Phi-3's own generate then recomputes its whole cache with the long
# factors (Phi3ForCausalLM.prepare_inputs_for_generation); tfbuilder, like transformers' other models,
# keeps the keys already cached (docs/decoding.md). Here the prompts already pass it (5 > 4): every step
# uses the long factors, in both.
GENERATION_CONFIGS = {
    **CONFIGS,
    "phi3": (*CONFIGS["phi3"][:2], {**CONFIGS["phi3"][2], "original_max_position_embeddings": 4}),
}


@pytest.fixture(scope="module")
def pairs(tmp_path_factory) -> dict:
    """(transformers' model, tfbuilder's import of it) per family."""
    out = {}
    with mock.patch.dict(CONFIGS, GENERATION_CONFIGS):
        for family in FAMILIES:
            path = tmp_path_factory.mktemp(f"gen-{family}")
            ref, _ = reference(family, path)
            out[family] = ref.eval(), load_hf(path)[2].eval()
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_left_padded_prompts_give_transformers_logits(pairs, family):
    ref, model = pairs[family]
    ids, real = decoding.prompt_batch(model, ROWS)
    assert real is not None and not real.all()
    with torch.no_grad():
        want = ref(input_ids=ids, attention_mask=real.long()).logits
        got = model(ids, attention_mask=real)
    diff = (got[real] - want[real]).abs().max().item()
    assert diff < TOL, f"{family}: max |logit difference| {diff:.2e} on a left-padded batch"


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_equals_generate(pairs, family):
    ref, model = pairs[family]
    ids, real = decoding.prompt_batch(model, ROWS)
    ours = decoding.sample(model, ids, max_new=8, temperature=0, attention_mask=real)
    theirs = hf_generate(ref, model, ids, real, max_new_tokens=8, do_sample=False)
    assert ours == new_ids(theirs.sequences, ids.shape[1], model.specials.end)


@pytest.mark.parametrize("family", FAMILIES)
def test_beam_search_equals_generate(pairs, family):
    ref, model = pairs[family]
    ids, real = decoding.prompt_batch(model, ROWS)
    found = decoding.transformers_beam_search(model, ids, beam=3, max_new=6, attention_mask=real)
    theirs = hf_generate(ref, model, ids, real, max_new_tokens=6, num_beams=3, do_sample=False, output_scores=True)
    assert [hyp for _, hyp in found] == new_ids(theirs.sequences, ids.shape[1], model.specials.end)
    torch.testing.assert_close(torch.tensor([s for s, _ in found]), theirs.sequences_scores, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("family", FAMILIES)
def test_sampling_draws_from_generates_distributions(pairs, family):
    """Seeded sampling: each step's distribution is transformers' (see test_generation_parity)."""
    assert_sampling_distributions(*pairs[family], max_new=5)
