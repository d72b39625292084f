"""Tokenizers people already have: a Hugging Face tokenizer.json and SentencePiece models, each driving
a short run end to end with its own special ids."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import tfbuilder
from conftest import ROOT
from tfbuilder.cli.commands import main
from tfbuilder.data.collate import Collate
from tfbuilder.data.prepare import prepare
from tfbuilder.runs.checkpoints import load_checkpoint, read_checkpoint
from tfbuilder.train.fit import fit

WORDS = "a the dog cat runs sits on mat in park red big small house tree".split()
EN = [" ".join(WORDS[(i * k) % len(WORDS)] for k in range(1, 2 + i % 5)) for i in range(120)]
DE = [line.replace("the", "der").replace("dog", "hund").replace("cat", "katze") for line in EN]
# A tokenizer whose specials are not tfbuilder's 0-4: unknown first, padding last.
ORDER = ["[UNK]", "[CLS]", "[SEP]", "[MASK]", "[PAD]"]


def write_text(folder: Path, files: dict[str, list[str]]) -> Path:
    folder.mkdir(exist_ok=True)
    for name, lines in files.items():
        (folder / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


def hf_tokenizer_file(path: Path, specials: list[str], *, last: bool = False) -> Path:
    """A word-level tokenizer.json made offline with the tokenizers library (BERT-style names): the
    specials first, or with ``last`` after every word (ids far from tfbuilder's 0-4)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = sorted(set(" ".join(EN + DE).split()))
    tokens = words + specials if last else specials + words
    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(tokens)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(specials)
    tok.save(str(path))
    return path


def lm_overrides(tmp_path: Path, tokenizer: dict, *extra: str) -> list[str]:
    data = write_text(tmp_path / "text", {"train.en": EN, "val.en": EN[:8], "test.en": EN[8:16]})
    return [
        f"data={{type: monolingual, path: {data}, lang: en, batch_size: 8, max_len: 24, tokenizer: {json.dumps(tokenizer)}}}",
        "model.decoder.layers=1", "model.d_model=32", "model.attention.heads=2", "model.ffn.hidden=32",
        "model.position.max_len=32", "model.dropout=0.0", "model.attention.dropout=0.0",
        "trainer.max_steps=2", "trainer.val_every=2", "trainer.progress=false", f"trainer.output={tmp_path / 'runs'}", *extra,
    ]


def test_a_pretrained_tokenizer_json_drives_a_run_with_its_own_special_ids(tmp_path, capsys):
    tok_file = hf_tokenizer_file(tmp_path / "tokenizer.json", ORDER, last=True)
    words = len(set(" ".join(EN + DE).split()))
    unk, cls, sep, mask, pad = range(words, words + 5)
    # BERT's shape, exportable as a Hugging Face model; padding is the tokenizer's [PAD].
    overrides = lm_overrides(tmp_path, {"type": "pretrained", "path": str(tok_file)}, f"model.pad_id={pad}", f"model.vocab_size={words + 5}")
    overrides = [o.replace("model.decoder.layers", "model.encoder.layers") for o in overrides]
    bert = ROOT / "recipes" / "architectures" / "bert-base.yaml"
    recipe = tfbuilder.load_recipe(bert, overrides)
    # The size and the padding id are the file's: a recipe that says otherwise is refused.
    with pytest.raises(tfbuilder.RecipeError, match=rf"model.vocab_size \({words + 6}\) differs from the data's vocabulary \({words + 5}\)"):
        tfbuilder.load_recipe(bert, [*overrides, f"model.vocab_size={words + 6}"])
    with pytest.raises(tfbuilder.RecipeError, match=rf"model.pad_id \(0\) must be {pad}"):
        tfbuilder.load_recipe(bert, [*overrides, "model.pad_id=0"])

    prepared = prepare(recipe.data)
    ids = prepared.vocab.specials
    assert (ids.pad, ids.start, ids.end, ids.unk, ids.mask) == (pad, cls, sep, unk, mask)
    rows = Collate(prepared.splits["train"], ids)([0, 1, 2])["tokens"].tolist()  # [CLS] x [SEP] [PAD]...
    assert all(r[0] == cls for r in rows) and all(sep in r for r in rows) and any(r[-1] == pad for r in rows)

    summary = fit(recipe)
    meta = read_checkpoint(summary.run_dir)["tfbuilder"]
    assert {k: meta["specials"][k] for k in ("pad", "start", "end", "mask")} == {"pad": pad, "start": cls, "end": sep, "mask": mask}
    run = Path(summary.run_dir)
    from tokenizers import Tokenizer

    # The run's tokenizer.json is a real tokenizers file, the same tokenizer.
    assert Tokenizer.from_file(str(run / "tokenizer.json")).encode("the dog").ids == Tokenizer.from_file(str(tok_file)).encode("the dog").ids
    assert main(["test", str(run)]) == 0
    assert "perplexity" in capsys.readouterr().out

    assert main(["export", str(run), "--format", "hf", "--out", str(tmp_path / "hf")]) == 0
    from transformers import AutoTokenizer

    loaded = AutoTokenizer.from_pretrained(str(tmp_path / "hf"))  # a local folder: no network
    assert loaded("the dog", add_special_tokens=False)["input_ids"] == load_checkpoint(run).vocab.tgt.encode("the dog")
    assert (loaded.pad_token_id, loaded.cls_token_id if loaded.bos_token_id is None else loaded.bos_token_id, loaded.mask_token_id) == (pad, cls, mask)


def sentencepiece_file(path: Path, lines: list[str]) -> Path:
    """A tiny SentencePiece model trained offline, with its own ids: <unk> 0, <s> 1, </s> 2, <pad> 3."""
    import sentencepiece as spm

    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_prefix=str(path.with_suffix("")), vocab_size=30, pad_id=3,
        character_coverage=1.0, minloglevel=2, num_threads=1,
    )
    return path


def test_a_sentencepiece_model_drives_a_translation_run(tmp_path, capsys):
    sp = sentencepiece_file(tmp_path / "sp.model", EN + DE)
    data = write_text(tmp_path / "par", {"train.de": DE, "train.en": EN, "val.de": DE[:8], "val.en": EN[:8]})
    overrides = [
        f"data={{type: parallel, path: {data}, src_lang: de, tgt_lang: en, batch_size: 8, tokenizer: {{type: sentencepiece, path: {sp}}}}}",
        "model.pad_id=3", "model.d_model=32", "model.attention.heads=2", "model.ffn.hidden=32", "model.encoder.layers=1", "model.decoder.layers=1",
        "trainer.max_steps=2", "trainer.val_every=2", "trainer.progress=false", f"trainer.output={tmp_path / 'runs'}",
    ]
    summary = fit(tfbuilder.load_recipe(ROOT / "recipes" / "vanilla.yaml", overrides))
    loaded = load_checkpoint(summary.run_dir)
    specials = loaded.model.specials
    assert (specials.pad, specials.start, specials.end, specials.unk) == (3, 1, 2, 0)
    assert (Path(summary.run_dir) / "tokenizer.model").read_bytes() == sp.read_bytes()
    assert loaded.vocab.tgt.decode(loaded.vocab.tgt.encode("the red dog")) == "the red dog"
    sp.rename(tmp_path / "moved.model")  # the run needs the file no more: its checkpoint holds the model
    source = tmp_path / "in.de"
    source.write_text("der hund\n")
    assert main(["translate", summary.run_dir, "--input", str(source), "--beam", "1"]) == 0
    assert main(["test", summary.run_dir, "--split", "val"]) == 0
    assert "BLEU" in capsys.readouterr().out


def test_sentencepiece_trains_on_the_data_with_the_specials_at_0_to_4(tmp_path):
    data = write_text(tmp_path / "text", {"train.en": EN, "val.en": EN[:8]})
    spec = {"type": "monolingual", "path": str(data), "lang": "en", "tokenizer": {"type": "sentencepiece", "vocab_size": 30}}
    recipe = tfbuilder.recipe_from_dict({"name": "sp", "model": {"kind": "decoder", "d_model": 16, "attention": {"type": "multihead", "heads": 2}, "decoder": {"layers": 1}}, "data": spec})
    vocab = prepare(recipe.data).vocab
    assert vocab.tgt.vocab_size == 30 and vocab.specials == tfbuilder.specials.OWN
    assert vocab.tgt.decode(vocab.tgt.encode("the big park")) == "the big park"


def test_a_tokenizer_lacking_what_the_model_needs_is_a_validation_error(tmp_path, capsys):
    tok_file = hf_tokenizer_file(tmp_path / "tokenizer.json", ["[UNK]", "[CLS]", "[SEP]", "[PAD]"])  # no [MASK]
    data = write_text(tmp_path / "text", {"train.en": EN, "val.en": EN[:8]})
    recipe = tmp_path / "mlm.yaml"
    recipe.write_text(
        f"name: mlm\nextends: {ROOT / 'recipes' / 'encoder-mlm.yaml'}\nmodel: {{pad_id: 3}}\n"
        f"data:\n  path: {data}\n  tokenizer: {{type: pretrained, path: {tok_file}}}\n"
        "  format: text\n  hub: null\n  columns: null\n  lang: en\n  splits: {val: val}\n"
    )
    assert main(["validate", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert "mlm.yaml:6:39: data.tokenizer.path: a model of kind 'encoder' cannot train with this tokenizer: no mask token (<mask> or [MASK])" in err
    # Named where it is not the usual name, it is found; a name the tokenizer lacks is an error.
    assert main(["validate", str(recipe), "--set", "data.tokenizer.specials={mask: '[SEP]'}"]) == 0
    capsys.readouterr()
    assert main(["validate", str(recipe), "--set", "data.tokenizer.specials={mask: '[MASK]'}"]) == 2
    assert "data.tokenizer.specials.mask: the tokenizer has no token '[MASK]'" in capsys.readouterr().err
    assert main(["validate", str(recipe), "--set", "data.tokenizer.specials={mask: '[CLS]', pad: '[SEP]'}", "--set", "model.pad_id=2"]) == 2
    assert "its pad and end token are one token (id 2)" in capsys.readouterr().err
    assert main(["validate", str(recipe), "--set", "data.tokenizer.path=" + str(tmp_path / "absent.json")]) == 2
    assert "data.tokenizer.path: no such file" in capsys.readouterr().err


def test_the_store_key_holds_the_tokenizer_files_content(tmp_path):
    from tfbuilder.data import store
    from tfbuilder.data.readers import split_sources

    tok_file = hf_tokenizer_file(tmp_path / "tokenizer.json", ORDER)
    data = write_text(tmp_path / "text", {"train.en": EN, "val.en": EN[:8]})
    section = tfbuilder.recipe_from_dict({
        "name": "k", "model": {"kind": "decoder", "d_model": 16, "pad_id": 4, "attention": {"type": "multihead", "heads": 2}, "decoder": {"layers": 1}},
        "data": {"type": "monolingual", "path": str(data), "lang": "en", "tokenizer": {"type": "pretrained", "path": str(tok_file)}},
    }).data
    before = store.key_of(store.key_material(section, split_sources(section), "train"))
    hf_tokenizer_file(tok_file, list(reversed(ORDER)))  # the same path, another tokenizer
    assert store.key_of(store.key_material(section, split_sources(section), "train")) != before


def test_a_masked_lm_hides_words_behind_the_tokenizers_mask_and_never_hides_its_specials(monkeypatch):
    """With specials after the words (ids 48-52, mask 51), the masked LM shows id 51 and never
    chooses a special, wherever they lie."""
    from test_objectives import captured

    from tfbuilder.model.model import AuxiliaryLosses
    from tfbuilder.specials import SpecialIds

    given = SpecialIds.of(start=49, end=50, pad=52, unk=48, mask=51)
    monkeypatch.setattr(AuxiliaryLosses, "specials", given)  # what every built model reads
    tokens = torch.randint(0, 48, (60, 100))
    tokens[:, 0], tokens[:, -1], tokens[::7, -20:] = 49, 50, 52
    seen = captured(monkeypatch, "encoder", {"tokens": tokens})
    shown, chosen = seen["inputs"][0], seen["target"] != -100
    real = tokens < 48
    assert chosen.sum() > 0 and not (chosen & ~real).any()
    assert (shown[chosen] == 51).float().mean() > 0.7 and torch.equal(shown[~chosen], tokens[~chosen])


def test_packed_documents_are_joined_by_the_tokenizers_end_id():
    from tfbuilder.data.packing import Packed
    from tfbuilder.data.tokens import TokenArray

    packed = Packed(TokenArray.from_rows([[5, 6], [7]]), window=4, stride=4, eos=9)
    assert packed[0].tolist() == [5, 6, 9, 7]
