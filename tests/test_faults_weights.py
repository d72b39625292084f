"""Weights and tokenizers from elsewhere are hostile input: a Hugging Face tokenizer.json (given as
data.tokenizer or found in an import-hf folder), an import-hf folder's weights, and checkpoints whose
weights are missing, misshapen, non-finite or expanded. Each ends in exit 2 naming the file and the key
or parameter, no traceback, within 10 s of CPU time and 1 GiB of memory, nothing the user had lost."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from conftest import ROOT
from hostile import assert_refused, run_cli, run_limited, run_limited_many
from test_faults_checkpoints import _data, _save
from test_pretrained import EN, DE, ORDER, hf_tokenizer_file, lm_overrides

DECODER_LM = ROOT / "recipes" / "architectures" / "gpt2-small.yaml"
WORDS = len(set(" ".join(EN + DE).split()))


# --- a tokenizer.json given as data.tokenizer ------------------------------------------------------


def _tokenizer(tmp_path: Path, change=None) -> Path:
    """A word-level tokenizer.json (specials at 0-4), its JSON changed by ``change``."""
    path = hf_tokenizer_file(tmp_path / "tokenizer.json", ORDER)
    data = json.loads(path.read_text())
    if change is not None:
        change(data)
    path.write_text(json.dumps(data))
    return path


def _prepare_args(tmp_path: Path, tok_file: Path) -> list[str]:
    overrides = lm_overrides(tmp_path, {"type": "pretrained", "path": str(tok_file)}, "model.pad_id=4", f"model.vocab_size={WORDS + 5}")
    return ["prepare", str(DECODER_LM), *[arg for o in overrides for arg in ("--set", o)]]


def _replace(content: str) -> dict:
    return {"type": "Replace", "pattern": {"String": "a"}, "content": content}


def _expanding(data: dict) -> None:
    data["normalizer"] = _replace("a" * 50_000)


def _nested(data: dict) -> None:
    data["normalizer"] = {"type": "Sequence", "normalizers": [_replace("a" * 10)] * 8}  # 10**8 times longer


def _deep(data: dict) -> None:
    node: dict = _replace("b")
    for _ in range(6):
        node = {"type": "Sequence", "normalizers": [node]}
    data["normalizer"] = node


def _huge_added_id(data: dict) -> None:
    data["added_tokens"][4]["id"] = 10**9


def _huge_vocab_id(data: dict) -> None:
    data["model"]["vocab"]["dog"] = 10**9


def _id_past_the_count(data: dict) -> None:
    """One past the last id the file's tokens may have (its vocabulary and added tokens, counted)."""
    data["added_tokens"][4]["id"] = len(data["model"]["vocab"]) + len(data["added_tokens"])


def test_a_plain_tokenizer_json_prepares(tmp_path, capsys):
    """The control: the file the hostile cases change is accepted, and encodes within the bounds."""
    assert run_cli(_prepare_args(tmp_path, _tokenizer(tmp_path)), capsys).rc == 0


UNBOUNDED = {
    "replace-50000": (_expanding, "normalizer.content: Replace writes 50,000 characters"),
    "nested-sequence": (_nested, "normalizer: its Replace and Prepend steps make a text up to"),
    "deep-sequence": (_deep, "normalizer.normalizers[0].normalizers[0].normalizers[0].normalizers[0]: Sequences nested more than 4 deep"),
    "added-token-id": (_huge_added_id, "added_tokens[4].id: id 1000000000 is out of range"),
    "vocab-id": (_huge_vocab_id, "model.vocab['dog']: id 1000000000 is out of range"),
    "id-past-the-count": (_id_past_the_count, f"added_tokens[4].id: id {WORDS + 10} is out of range: the file holds {WORDS + 10} tokens"),
}


def test_a_tokenizer_json_asking_for_unbounded_memory_is_refused_before_it_is_read(tmp_path):
    """Each case in turn, in one process limited to 1 GiB (torch imported once)."""
    files, commands = {}, []
    for name, (change, _) in UNBOUNDED.items():
        (tmp_path / name).mkdir()
        files[name] = _tokenizer(tmp_path / name, change)
        commands.append(_prepare_args(tmp_path / name, files[name]))
    outcomes = run_limited_many(commands, cwd=tmp_path)
    for (name, (_, expected)), outcome in zip(UNBOUNDED.items(), outcomes, strict=True):
        assert_refused(outcome, str(files[name]), expected)


def test_a_split_regex_that_backtracks_without_end_is_a_data_error(tmp_path, capsys):
    """The tokenizers library panics (a BaseException, not an Exception) at Oniguruma's retry limit."""

    def catastrophic(data: dict) -> None:
        data["pre_tokenizer"] = {"type": "Split", "pattern": {"Regex": "(a|aa)+$"}, "behavior": "Isolated", "invert": False}

    tok_file = _tokenizer(tmp_path, catastrophic)
    args = _prepare_args(tmp_path, tok_file)  # writes text/*.en
    for split in ("train", "val", "test"):
        (tmp_path / "text" / f"{split}.en").write_text("a" * 40 + "!\n" + "the dog\n" * 8)
    outcome = run_cli(args, capsys)
    assert_refused(outcome, str(tok_file), "cannot encode the text", "retry-limit-in-match")


def test_the_panic_is_caught_where_tokenizers_are_read():
    """A panic inside Tokenizer.from_str (as encoding would raise it) becomes a DataError naming the file."""
    from tfbuilder.data.pretrained import DataError, tokenizer_failures

    class PanicException(BaseException):  # what pyo3_runtime names it
        pass

    with pytest.raises(DataError, match="x.json: not a Hugging Face tokenizer.json: the tokenizers library failed"):
        with tokenizer_failures("x.json", "not a Hugging Face tokenizer.json", errors=True):
            raise PanicException("called `Result::unwrap()`")
    with pytest.raises(KeyboardInterrupt):  # anything else passes through
        with tokenizer_failures("x.json", "reading"):
            raise KeyboardInterrupt


def test_real_tokenizers_stay_within_the_bounds():
    """Llama's and BERT's normalizers (Prepend, Replace of one character; lower-casing) pass."""
    from tfbuilder.data.pretrained import check_hf_json

    llama = {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "\u2581"}, {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]}
    for normalizer in (llama, {"type": "BertNormalizer", "lowercase": True}):
        check_hf_json(json.dumps({"normalizer": normalizer, "model": {"vocab": {"a": 0, "b": 1}}, "added_tokens": [{"id": 1}]}), "t.json")


# --- import-hf ---------------------------------------------------------------------------------------


def _hf_dir(tmp_path: Path) -> Path:
    """A tiny GPT-2 folder, as save_pretrained writes it (written by tfbuilder's export)."""
    from tfbuilder.data.prepare import Vocab
    from tfbuilder.data.tokenizers import HFTokenizer
    from tfbuilder.interop.hf import export
    from tfbuilder.interop.hf.convert import checkpoint_dict
    from tfbuilder.model.builder import build_model
    from tfbuilder.spec.recipe import load_recipe

    recipe = load_recipe(ROOT / "recipes" / "architectures" / "gpt2-small.yaml", ["model.decoder.layers=1", "model.d_model=16",
        "model.attention.heads=2", "model.ffn.hidden=32", "model.vocab_size=40", "model.position.max_len=16"])
    tok = HFTokenizer.ids(40)
    ckpt = tmp_path / "x.ckpt"
    torch.save(checkpoint_dict(build_model(recipe), recipe, Vocab(tok, tok), source="test"), ckpt)
    export(ckpt, format="hf", out=tmp_path / "hf")
    return tmp_path / "hf"


def _change_weights(hf_dir: Path, change) -> Path:
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(hf_dir / "model.safetensors"))
    change(tensors)
    save_file(tensors, str(hf_dir / "model.safetensors"))
    return hf_dir / "model.safetensors"


def test_a_plain_hf_folder_imports(tmp_path, capsys):
    assert run_cli(["import-hf", str(_hf_dir(tmp_path)), "--out", str(tmp_path / "run")], capsys).rc == 0


def test_a_config_wider_than_its_weights_is_refused_before_the_model_is_built(tmp_path):
    hf_dir = _hf_dir(tmp_path)
    config = json.loads((hf_dir / "config.json").read_text())
    config.update(n_embd=4096, n_inner=4096)
    (hf_dir / "config.json").write_text(json.dumps(config))
    outcome = run_limited(["import-hf", str(hf_dir), "--out", str(tmp_path / "run")], cwd=tmp_path)
    assert_refused(outcome, "model.safetensors: transformer.wte.weight: expected shape (40, 4096)", "got (40, 16)", seconds=60)
    assert not (tmp_path / "run").exists()


def test_a_weight_of_another_shape_is_refused_naming_it(tmp_path, capsys):
    hf_dir = _hf_dir(tmp_path)
    _change_weights(hf_dir, lambda t: t.update({"transformer.h.0.mlp.c_fc.weight": torch.zeros(16, 31)}))
    outcome = run_cli(["import-hf", str(hf_dir), "--out", str(tmp_path / "run")], capsys)
    assert_refused(outcome, "transformer.h.0.mlp.c_fc.weight: expected shape (16, 32)", "decoder.layers.0.ffn.inner.ff_in.weight", "got (16, 31)")


@pytest.mark.parametrize(
    "bad, expected",
    [(float("nan"), "holds NaN or infinite values"), (float("inf"), "holds NaN or infinite values"),
     (torch.int64, "holds int64 values, not floating point weights"), (torch.bool, "holds bool values")],
    ids=["nan", "inf", "int64", "bool"],
)
def test_non_finite_or_integer_weights_are_refused(tmp_path, capsys, bad, expected):
    hf_dir = _hf_dir(tmp_path)
    name = "transformer.h.0.attn.c_attn.weight"

    def spoil(tensors: dict) -> None:
        if isinstance(bad, float):
            tensors[name][0, 0] = bad
        else:
            tensors[name] = tensors[name].to(bad)

    weights = _change_weights(hf_dir, spoil)
    outcome = run_cli(["import-hf", str(hf_dir), "--out", str(tmp_path / "run")], capsys)
    assert_refused(outcome, f"{weights}: {name} {expected}")
    assert not (tmp_path / "run").exists()


def test_a_tokenizer_that_is_a_fifo_is_refused(tmp_path, capsys):
    hf_dir = _hf_dir(tmp_path)
    (hf_dir / "tokenizer.json").unlink()
    os.mkfifo(hf_dir / "tokenizer.json")
    outcome = run_cli(["import-hf", str(hf_dir), "--out", str(tmp_path / "run")], capsys)
    assert_refused(outcome, f"{hf_dir / 'tokenizer.json'} is not a regular file")
    assert not (tmp_path / "run").exists()


def test_a_hostile_tokenizer_in_an_hf_folder_is_refused(tmp_path):
    hf_dir = _hf_dir(tmp_path)
    tok_file = hf_dir / "tokenizer.json"
    data = json.loads(tok_file.read_text())
    _expanding(data)
    tok_file.write_text(json.dumps(data))
    outcome = run_limited(["import-hf", str(hf_dir), "--out", str(tmp_path / "run")], cwd=tmp_path)
    assert_refused(outcome, f"{tok_file}: normalizer.content: Replace writes 50,000 characters", seconds=60)


# --- checkpoints -------------------------------------------------------------------------------------


def _first_matrix(data: dict) -> str:
    return next(k for k, v in data["state_dict"].items() if v.dim() == 2)


def test_a_checkpoint_missing_a_weight_names_it(tmp_path, capsys):
    data = _data()
    del data["state_dict"]["model.decoder.layers.0.ffn.norm.bias"]
    path = _save(tmp_path, data)
    outcome = run_cli(["test", str(path)], capsys)
    assert_refused(outcome, str(path), "decoder.layers.0.ffn.norm.bias: missing from the checkpoint")


def test_a_checkpoint_weight_of_another_shape_names_it_and_both_shapes(tmp_path, capsys):
    data = _data()
    name = _first_matrix(data)
    rows, cols = data["state_dict"][name].shape
    data["state_dict"][name] = torch.zeros(rows, cols + 1)
    path = _save(tmp_path, data)
    outcome = run_cli(["test", str(path)], capsys)
    assert_refused(outcome, str(path), f"{name.removeprefix('model.')}: checkpoint ({rows}, {cols + 1}), recipe ({rows}, {cols})")


def test_a_checkpoint_missing_many_weights_names_them(tmp_path, capsys):
    """Fewer stored weights than the recipe asks for: refused before the model is built, naming them."""
    data = _data()
    for name in [k for k in data["state_dict"] if ".decoder.layers.0." in k]:
        del data["state_dict"][name]
    outcome = run_cli(["test", str(_save(tmp_path, data))], capsys)
    assert_refused(outcome, "holds weights for", "decoder.layers.0.", "missing from the checkpoint")


def _init_from_args(tmp_path: Path, source: Path) -> list[str]:
    from test_faults_checkpoints import SMALL

    from conftest import QUICKSTART

    sets = [*SMALL, "data.test_size=4", "data.val_size=4", "trainer.max_steps=1", f"trainer.output={tmp_path / 'runs'}"]
    return ["fit", str(QUICKSTART), "--init-from", str(source), *[a for s in sets for a in ("--set", s)]]


def test_init_from_a_checkpoint_with_nan_weights_is_refused_naming_it(tmp_path, capsys):
    data = _data()
    name = _first_matrix(data)
    data["state_dict"][name][0, 0] = float("nan")
    path = _save(tmp_path, data)
    outcome = run_cli(_init_from_args(tmp_path, path), capsys)
    assert_refused(outcome, str(path), f"the weights of {name.removeprefix('model.')} are not finite real numbers")
    assert not list((tmp_path / "runs").rglob("*.ckpt"))


def test_init_from_a_checkpoint_of_another_shape_names_the_parameter(tmp_path, capsys):
    data = _data()
    name = _first_matrix(data)
    rows, cols = data["state_dict"][name].shape
    data["state_dict"][name] = torch.zeros(rows + 1, cols)
    path = _save(tmp_path, data)
    outcome = run_cli(_init_from_args(tmp_path, path), capsys)
    assert_refused(outcome, str(path), f"{name.removeprefix('model.')}: checkpoint ({rows + 1}, {cols}), recipe ({rows}, {cols})")


def _step_checkpoints(tmp_path: Path, change) -> Path:
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    for step in (1, 2):
        data = _data()
        data["global_step"] = step
        change(data, step)
        torch.save(data, run / "checkpoints" / f"step-{step}.ckpt")
    return run


def test_average_of_expanded_tensors(tmp_path, capsys):
    """A tensor stored expanded (stride 0, float64: .double() is the tensor itself) averages like any other."""
    name = "model.decoder.layers.0.ffn.norm.weight"

    def expand(data: dict, step: int) -> None:
        width = data["state_dict"][name].shape[0]
        data["state_dict"][name] = torch.full((1,), float(step), dtype=torch.float64).expand(width)
        matrix = _first_matrix(data)
        rows, cols = data["state_dict"][matrix].shape
        data["state_dict"][matrix] = torch.full((cols,), float(step), dtype=torch.float64).expand(rows, cols)

    run = _step_checkpoints(tmp_path, expand)
    assert run_cli(["average", str(run), "--last", "2"], capsys).rc == 0
    averaged = torch.load(run / "checkpoints" / "averaged.ckpt", weights_only=True)["state_dict"]
    assert torch.equal(averaged[name], torch.full_like(averaged[name], 1.5))
    assert bool((averaged[_first_matrix({"state_dict": averaged})] == 1.5).all())
    # the checkpoints averaged are as they were
    assert torch.load(run / "checkpoints" / "step-1.ckpt", weights_only=True)["state_dict"][name][0] == 1.0


def test_average_of_checkpoints_of_other_shapes_names_the_parameter(tmp_path, capsys):
    def change(data: dict, step: int) -> None:
        if step == 2:
            name = _first_matrix(data)
            rows, cols = data["state_dict"][name].shape
            data["state_dict"][name] = torch.zeros(rows, cols + 1)

    run = _step_checkpoints(tmp_path, change)
    outcome = run_cli(["average", str(run), "--last", "2"], capsys)
    name = _first_matrix(_data())
    assert_refused(outcome, "hold different parameters", f"{name}: step-2.ckpt")
    assert not (run / "checkpoints" / "averaged.ckpt").exists()


def _with_stored_tokenizer(change) -> dict:
    """The tiny checkpoint, its vocabulary a word-level tokenizer.json (15 tokens, as its model's) changed by ``change``."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tokens = ["<pad>", "<s>", "</s>", "<unk>", "<mask>", *"abcdefghij"]
    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(tokens)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    raw = json.loads(tok.to_str())
    change(raw)
    data = _data()
    data["tfbuilder"]["vocab"] = json.dumps({"shared": json.dumps({"type": "hf", "tokenizer": json.dumps(raw)})})
    return data


def test_a_stored_tokenizer_beyond_the_bounds_is_a_damaged_checkpoint(tmp_path, capsys):
    path = _save(tmp_path, _with_stored_tokenizer(_expanding))
    outcome = run_cli(["test", str(path)], capsys)
    assert_refused(outcome, f"{path}: damaged checkpoint: not a tfbuilder vocabulary: the stored tokenizer: normalizer.content: Replace writes 50,000 characters")


def test_a_stored_tokenizer_that_panics_names_the_checkpoint(tmp_path, capsys):
    def catastrophic(data: dict) -> None:
        data["pre_tokenizer"] = {"type": "Split", "pattern": {"Regex": "(a|aa)+$"}, "behavior": "Isolated", "invert": False}

    path = _save(tmp_path, _with_stored_tokenizer(catastrophic))
    source = tmp_path / "in.txt"
    source.write_text("a" * 40 + "!\n")
    outcome = run_cli(["translate", str(path), "--input", str(source), "--output", str(tmp_path / "out.txt")], capsys)
    assert_refused(outcome, f"the tokenizer stored in {path}: cannot encode the text", "retry-limit-in-match")
    assert not (tmp_path / "out.txt").exists()  # made new, nothing written into it: removed


def test_init_from_a_checkpoint_with_a_stored_tokenizer_beyond_the_bounds_names_it(tmp_path, capsys):
    path = _save(tmp_path, _with_stored_tokenizer(_expanding))
    outcome = run_cli(_init_from_args(tmp_path, path), capsys)
    assert_refused(outcome, f"{path}: damaged checkpoint: not a tfbuilder vocabulary: the stored tokenizer: normalizer.content")
