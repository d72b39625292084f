"""Special ids: one place (the checkpoint's metadata, then ``model.specials``), read by every decoder.
A model imported from Hugging Face decodes with its own start, end and pad ids, as ``transformers``'
own greedy generation does; a model trained here keeps 0-4; damaged ids are refused by path."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")  # in the test extra; importorskip only names the need

from tfbuilder.inference import decoding  # noqa: E402
from tfbuilder.cli.commands import main  # noqa: E402
from tfbuilder.interop.hf import import_hf  # noqa: E402
from tfbuilder.runs.checkpoints import CheckpointError, load_checkpoint  # noqa: E402
from tfbuilder.specials import OWN, SpecialIds  # noqa: E402
from test_hf import V, small_reference  # noqa: E402

STEPS = 6


def hf_greedy(ref, **inputs) -> list[list[int]]:
    """``transformers``' greedy generation (its new tokens, without the closing end id), at least one
    token, as ours (decoding.Rules.min_len)."""
    end = ref.config.eos_token_id
    with torch.no_grad():
        out = ref.eval().generate(**inputs, do_sample=False, num_beams=1, max_new_tokens=STEPS, min_new_tokens=1, use_cache=False, **_banned(ref))
    if not ref.config.is_encoder_decoder:
        out = out[:, inputs["input_ids"].shape[1] :]
    else:
        out = out[:, 1:]  # the decoder start
    rows = []
    for row in out.tolist():
        rows.append(row[: row.index(end)] if end in row else row)
    return rows


def _banned(ref) -> dict:
    """What our decoders never generate, banned in theirs too (transformers bans nothing by default)."""
    cfg = ref.config
    never = {"t5": "pad_token_id", "llama": "bos_token_id"}.get(cfg.model_type)
    start = {"decoder_start_token_id": cfg.pad_token_id} if cfg.model_type == "t5" else {}  # T5 starts from its pad id
    return {"bad_words_ids": [[getattr(cfg, never)]], **start} if never else start


@pytest.mark.parametrize("family", ["t5", "gpt2", "llama"])
def test_an_imported_model_decodes_with_its_own_ids_as_transformers_does(family, tmp_path):
    ref = small_reference(family)
    ref.save_pretrained(tmp_path / "hf")
    loaded = load_checkpoint(import_hf(tmp_path / "hf", tmp_path / "run"))
    cfg = ref.config
    want_ids = {
        "t5": SpecialIds.of(start=0, end=1, pad=0, unk=None),
        "gpt2": SpecialIds.of(start=V - 1, end=V - 1, pad=None, unk=None),
        "llama": SpecialIds.of(start=1, end=2, pad=None, unk=None),
    }[family]
    assert loaded.model.specials == want_ids
    g = torch.Generator().manual_seed(3)
    if family == "t5":
        src = torch.randint(3, V, (4, 5), generator=g)
        src[:, -1] = cfg.eos_token_id
        src[2, 2], src[2, 3:] = cfg.eos_token_id, 0  # padded
        ours = decoding.greedy(loaded.model, src, max_len_a=0, max_len_b=STEPS + 1)
        theirs = hf_greedy(ref, input_ids=src, attention_mask=(src != 0).long())
    else:
        prompt = torch.cat([torch.full((3, 1), cfg.bos_token_id), torch.randint(3, V - 1, (3, 4), generator=g)], dim=1)
        ours = decoding.sample(loaded.model, prompt, max_new=STEPS, temperature=0)
        theirs = hf_greedy(ref, input_ids=prompt, attention_mask=torch.ones_like(prompt))
    assert ours == theirs
    # The test can fail: decoded with tfbuilder's own ids, the outputs differ.
    loaded.model.specials = OWN
    if family == "t5":
        assert decoding.greedy(loaded.model, src, max_len_a=0, max_len_b=STEPS + 1) != theirs


def test_ids_travel_in_the_checkpoint_and_damaged_ones_are_refused(tmp_path, capsys):
    ref = small_reference("t5")
    ref.save_pretrained(tmp_path / "hf")
    ckpt = import_hf(tmp_path / "hf", tmp_path / "run")
    data = torch.load(ckpt, weights_only=True)
    assert data["tfbuilder"]["specials"] == {"start": 0, "end": 1, "pad": 0, "unk": None, "never": [0]}
    for bad in ({"start": V, "end": 1, "pad": 0, "unk": None, "never": []}, {"start": 0}, "0 1", {"start": 0, "end": 1, "pad": 0, "unk": None, "never": [-1]}):
        data["tfbuilder"]["specials"] = bad
        torch.save(data, tmp_path / "bad.ckpt")
        with pytest.raises(CheckpointError, match="damaged checkpoint: specials"):
            load_checkpoint(tmp_path / "bad.ckpt")
        assert main(["translate", str(tmp_path / "bad.ckpt")]) == 2
        err = capsys.readouterr().err
        assert "specials" in err and "Traceback" not in err
    del data["tfbuilder"]["specials"]  # written before ids were recorded: tfbuilder's own
    torch.save(data, tmp_path / "old.ckpt")
    assert load_checkpoint(tmp_path / "old.ckpt").model.specials == OWN


def test_an_encoder_has_nothing_to_generate(tmp_path):
    ref = small_reference("bert")
    ref.save_pretrained(tmp_path / "hf")
    loaded = load_checkpoint(import_hf(tmp_path / "hf", tmp_path / "run"))
    assert loaded.model.specials.start is None and loaded.model.specials.end is None
    with pytest.raises(ValueError, match="no start or end token"):
        decoding.sample(loaded.model, torch.tensor([[5, 6]]), max_new=2)


def test_export_writes_the_models_ids(tmp_path):
    import json

    from tfbuilder.interop.hf import export

    ref = small_reference("t5")
    ref.save_pretrained(tmp_path / "hf")
    export(import_hf(tmp_path / "hf", tmp_path / "run"), format="hf", out=tmp_path / "out")
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert (cfg["decoder_start_token_id"], cfg["eos_token_id"], cfg["pad_token_id"]) == (0, 1, 0)


def test_config_ids_outside_the_vocabulary_are_no_token_and_wrong_types_are_refused(tmp_path, capsys):
    import json

    ref = small_reference("gpt2")
    ref.save_pretrained(tmp_path / "hf")
    cfg_file = tmp_path / "hf" / "config.json"
    cfg = json.loads(cfg_file.read_text())
    cfg.update(bos_token_id=50256, eos_token_id=50256)  # transformers' defaults, beyond a 96-token vocabulary
    cfg_file.write_text(json.dumps(cfg))
    loaded = load_checkpoint(import_hf(tmp_path / "hf", tmp_path / "run"))
    assert loaded.model.specials.start is None and loaded.model.specials.end is None
    cfg["eos_token_id"] = "2"
    cfg_file.write_text(json.dumps(cfg))
    assert main(["import-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "run2")]) == 2
    assert "config.json: eos_token_id: '2' is not a token id" in capsys.readouterr().err
