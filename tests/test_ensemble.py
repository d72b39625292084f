"""An ensemble is the mean of its members' probabilities at every step (fairseq's ensembles):
checked against the members' full forward passes, through the cache, for members of other widths
and depths; members that cannot be ensembled are refused."""

from __future__ import annotations

import pytest
import torch

import tfbuilder
from conftest import tiny_model
from tfbuilder.inference import decoding
from tfbuilder.data.collate import pad
from tfbuilder.inference.ensemble import Ensemble
from tfbuilder.spec.recipe import ModelSection
from tfbuilder.specials import SpecialIds


def member(seed: int, **changes):
    torch.manual_seed(seed)
    return tfbuilder.build_model(ModelSection.model_validate(tiny_model(**changes))).eval()


def test_the_ensemble_is_the_mean_of_its_members_probabilities():
    members = [member(0), member(1, d_model=48, decoder={"layers": 3}), member(2, attention={"type": "multihead", "heads": 2})]
    ensemble = Ensemble(members)
    src = pad([torch.randint(5, 53, (n,)).tolist() for n in (4, 7, 2)], eos=True)
    tgt = torch.randint(5, 53, (3, 6))
    with torch.no_grad():
        want = torch.stack([m(src, tgt).softmax(-1) for m in members]).mean(0).log()
        torch.testing.assert_close(ensemble(src, tgt), want, atol=1e-5, rtol=1e-5)
        # one token at a time through the members' caches, as the decoders feed it
        torch.testing.assert_close(decoding.incremental_logits(ensemble, tgt, src), want, atol=1e-5, rtol=1e-5)
    # Beam search over the ensemble equals the plain search over its averaged distribution.
    assert decoding.beam_search(ensemble, src, beam=3, max_len_b=6) == [
        decoding.beam_search(_Averaged(members), row[None], beam=3, max_len_b=6)[0] for row in src
    ]


class _Averaged(torch.nn.Module):
    """The same mean computed from full forward passes, without any cache (a reference)."""

    def __init__(self, members):
        super().__init__()
        self.members = members
        self.pad_id, self.specials = members[0].pad_id, members[0].specials

    def encode(self, src):
        return src, None

    def new_cache(self):
        return [{"self": {}}]

    def decode(self, tgt, memory, memory_mask, *, cache=None, offset=0):
        past = cache[0]["self"].get("tokens")
        tokens = tgt if past is None else torch.cat([past, tgt], dim=1)
        cache[0]["self"]["tokens"] = tokens
        src = memory.repeat_interleave(tokens.shape[0] // memory.shape[0], dim=0)
        mean = torch.stack([m(src, tokens).softmax(-1) for m in self.members]).mean(0).log()
        return mean[:, -tgt.shape[1] :]


def test_members_that_cannot_be_ensembled_are_refused():
    with pytest.raises(ValueError, match="at least two"):
        Ensemble([member(0)])
    other = member(1)
    other.specials = SpecialIds.of(start=0, end=1, pad=0, unk=2)
    with pytest.raises(ValueError, match="other special ids"):
        Ensemble([member(0), other])
    decoder = member(2, kind="decoder", encoder=None)
    with pytest.raises(ValueError, match="not a translation"):
        Ensemble([member(0), decoder])
