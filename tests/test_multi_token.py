"""Multi-token prediction against DeepSeek-V3's equations (arXiv:2412.19437, eq. 21-25), written out
with slices: depth k sees the tokens k places on and predicts the one after."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import tfbuilder
from conftest import QUICKSTART, tiny_model
from tfbuilder.cli.commands import main
from tfbuilder.train.objectives import causal_lm, head_loss
from tfbuilder.spec.recipe import ModelSection

PAD = 0


def mtp_model(depth: int = 2, weight: float = 0.3, **changes) -> torch.nn.Module:
    spec = tiny_model(kind="decoder", encoder=None, placement="pre", mtp={"depth": depth, "weight": weight}, **changes)
    return tfbuilder.build_model(ModelSection.model_validate(spec)).eval()


def equations(model, tokens: torch.Tensor) -> torch.Tensor:
    """lambda / D * sum_k CE(OutHead(h^k), t_{i+k+1}), h^k_i = TRM_k(M_k [RMSNorm(h^{k-1}_i); RMSNorm(Emb(t_{i+k}))]),
    h^0 the trunk's states: each depth one position shorter than the one before."""
    n = tokens.shape[1] - 1
    hidden = model.features(tokens[:, :n])
    losses = []
    for k, module in enumerate(model.mtp.depths, start=1):
        joined = torch.cat([module.norm_hidden(hidden[:, : n - k]), module.norm_embed(model.embed(tokens[:, k:n]))], dim=-1)
        hidden = module.layer(module.merge(joined))  # eq. 21-22
        logits = model.head(hidden)  # eq. 23: the shared output head
        losses.append(F.cross_entropy(logits.flatten(0, 1), tokens[:, k + 1 : n + 1].flatten(), ignore_index=PAD))
    return model.mtp.weight / len(losses) * sum(losses)  # eq. 24-25


@pytest.mark.parametrize("depth", [1, 3])
def test_the_multi_token_loss_is_deepseek_v3s(depth):
    torch.manual_seed(depth)
    model = mtp_model(depth=depth).train()  # (dropout 0) the modules' loss counts in training only
    tokens = torch.randint(5, 53, (3, 9))
    tokens[1, 6:] = PAD  # a shorter sequence, padded
    with torch.no_grad():
        total = causal_lm(model, {"tokens": tokens}, 0.0).loss
        assert causal_lm(model.eval(), {"tokens": tokens}, 0.0).loss < total
        main = head_loss(model.head, model.features(tokens[:, :-1]), tokens[:, 1:], epsilon=0.0, ignore=PAD).loss
        torch.testing.assert_close(total - main, equations(model, tokens), atol=1e-5, rtol=1e-4)


def test_the_modules_learn_and_decoding_uses_the_main_head_only():
    model = mtp_model().train()
    tokens = torch.randint(5, 53, (2, 8))
    causal_lm(model, {"tokens": tokens}, 0.1).loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.mtp.parameters())
    plain = mtp_model()
    plain.load_state_dict(model.state_dict())
    plain.mtp = None
    with torch.no_grad():
        torch.testing.assert_close(mtp_model().eval().forward(tokens).shape, plain(tokens).shape)
        model.eval()
        torch.testing.assert_close(model(tokens), plain(tokens))


def test_multi_token_prediction_is_for_decoder_only_models(tmp_path, capsys):
    recipe = tmp_path / "mtp.yaml"
    recipe.write_text("name: t\nextends: " + str(QUICKSTART) + "\nmodel:\n  mtp: {depth: 1}\n")
    assert main(["validate", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert f"{recipe}:4:8: model.mtp: multi-token prediction is for decoder-only language models (kind decoder)" in err


def test_packed_documents_stay_apart_in_the_modules():
    """With the document mask, a module's states after a </s> do not depend on the document before it."""
    from tfbuilder import masks
    from tfbuilder.data.packing import segments

    model = mtp_model(depth=2)
    end = model.specials.end
    a = torch.randint(5, 53, (1, 10))
    a[0, 3] = end  # the first document ends at position 3
    b = a.clone()
    b[0, :3] = torch.randint(5, 53, (3,))  # another first document, the same second one
    states = []
    with torch.no_grad():
        for tokens in (a, b):
            inputs = tokens[:, :-1]
            segs = segments(inputs, end)
            hidden = model.features(inputs, segments=segs)
            states.append(model.mtp(hidden, tokens, embed=model.embed, fill=PAD, mask=masks.document_mask(segs)))
    for depth_a, depth_b in zip(*states):
        torch.testing.assert_close(depth_a[:, 4:], depth_b[:, 4:])
        assert not torch.allclose(depth_a[:, :3], depth_b[:, :3])
