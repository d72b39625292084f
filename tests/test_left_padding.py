"""Left-padded prompts of a decoder-only model: each row gives the logits it gives alone (1e-5), for
every position type and attention, in one pass and through the key/value cache."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_model

import tfbuilder
from tfbuilder import masks, registry
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
