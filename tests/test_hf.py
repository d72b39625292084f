"""The GPT-2, BERT, T5 and Llama recipes are Hugging Face's models exactly: weights copied through
`tfbuilder import-hf` give the same logits (float32, 1e-4), and exports round-trip."""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")  # in the test extra; importorskip only names the need

from tfbuilder.model.builder import count_parameters  # noqa: E402
from tfbuilder.cli.commands import main  # noqa: E402
from tfbuilder.interop.hf import export, import_hf  # noqa: E402
from tfbuilder.spec.recipe import load_recipe  # noqa: E402
from tfbuilder.runs.checkpoints import load_checkpoint  # noqa: E402
from conftest import ROOT  # noqa: E402

# Under pytest-xdist (`--dist loadgroup`) one worker runs this module, so its module-scoped fixtures are made once.
pytestmark = pytest.mark.xdist_group("hf")

V = 96  # vocabulary of the small reference models
TOL = 1e-4


def small_reference(family: str, layers: int = 2):
    """A small random-weight reference model of ``family`` (built from a config object: no downloads),
    ``layers`` a stack (T5's decoder one more: its later layers reuse the first one's position bias)."""
    torch.manual_seed(0)
    T = transformers
    if family == "gpt2":
        cfg = T.GPT2Config(n_embd=48, n_layer=layers, n_head=4, vocab_size=V, n_positions=32, bos_token_id=V - 1, eos_token_id=V - 1)
        return T.GPT2LMHeadModel(cfg)
    if family == "bert":
        cfg = T.BertConfig(hidden_size=48, num_hidden_layers=layers, num_attention_heads=4, intermediate_size=80, vocab_size=V, max_position_embeddings=32)
        return T.BertForMaskedLM(cfg)
    if family == "t5":
        cfg = T.T5Config(d_model=48, d_kv=16, d_ff=80, num_layers=layers, num_decoder_layers=layers + 1, num_heads=4, vocab_size=V, relative_attention_num_buckets=8, relative_attention_max_distance=20)
        return T.T5ForConditionalGeneration(cfg)
    cfg = T.LlamaConfig(hidden_size=64, intermediate_size=88, num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2, vocab_size=V, bos_token_id=1, eos_token_id=2)
    return T.LlamaForCausalLM(cfg)


def batch(family: str) -> dict[str, torch.Tensor]:
    """Ids that include 0 (a real token in GPT-2 and Llama, padding in BERT and T5), padded where the
    architecture pads."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, V, (3, 13), generator=g)
    if family in ("gpt2", "llama"):
        ids[0, 2] = ids[1, 0] = ids[2, -1] = 0
        return {"input_ids": ids}
    ids[1, 9:] = 0  # right padding
    ids[2, 5:] = 0
    out = {"input_ids": ids, "attention_mask": (ids != 0).long()}
    if family == "bert":
        types = torch.zeros_like(ids)
        types[:, 6:] = 1
        out["token_type_ids"] = types
    else:
        tgt = torch.randint(1, V, (3, 7), generator=g)
        tgt[:, 0] = 0  # T5's decoder starts with its pad id
        tgt[0, 4] = 0
        out["decoder_input_ids"] = tgt
    return out


def theirs(ref, family: str, inputs: dict) -> torch.Tensor:
    with torch.no_grad():
        return ref.eval()(**inputs).logits


def ours(model, family: str, inputs: dict) -> torch.Tensor:
    with torch.no_grad():
        if family == "t5":
            return model(inputs["input_ids"], inputs["decoder_input_ids"])
        if family == "bert":
            return model(inputs["input_ids"], token_types=inputs["token_type_ids"])
        return model(inputs["input_ids"])


def compare(family: str, got: torch.Tensor, want: torch.Tensor, inputs: dict) -> None:
    if family == "bert":  # padded query positions are undefined in both; compare the real tokens
        real = inputs["attention_mask"].bool()
        got, want = got[real], want[real]
    assert got.shape == want.shape
    diff = (got - want).abs().max().item()
    assert diff < TOL, f"{family}: max |logit difference| {diff:.2e}"


FAMILIES = ["gpt2", "bert", "t5", "llama"]


def save_references(tmp_path_factory, layers: int) -> dict:
    """Each family's reference model, saved as save_pretrained writes it."""
    out = {}
    for family in FAMILIES:
        ref = small_reference(family, layers)
        path = tmp_path_factory.mktemp(f"{family}-{layers}")
        ref.save_pretrained(path)
        out[family] = (ref, path)
    return out


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    return save_references(tmp_path_factory, layers=2)


@pytest.fixture(scope="module")
def saved_shallow(tmp_path_factory):
    """One layer a stack (T5's decoder two): exporting to ONNX takes time by the layer."""
    return save_references(tmp_path_factory, layers=1)


@pytest.mark.parametrize("family", FAMILIES)
def test_import_gives_the_reference_logits(family, saved, tmp_path):
    ref, path = saved[family]
    ckpt = import_hf(path, tmp_path / "run")
    loaded = load_checkpoint(ckpt)
    inputs = batch(family)
    want = theirs(ref, family, inputs)
    compare(family, ours(loaded.model, family, inputs), want, inputs)
    # and the test can fail: without the recipe's exactness keys the logits differ
    assert count_parameters(loaded.model) == sum(p.numel() for p in ref.parameters())


@pytest.mark.parametrize("family", FAMILIES)
def test_hf_export_round_trips(family, saved, tmp_path):
    ref, path = saved[family]
    ckpt = import_hf(path, tmp_path / "run")
    export(ckpt, format="hf", out=tmp_path / "hf")
    back = type(ref).from_pretrained(tmp_path / "hf")
    inputs = batch(family)
    compare(family, theirs(back, family, inputs), theirs(ref, family, inputs), inputs)
    again = load_checkpoint(import_hf(tmp_path / "hf", tmp_path / "run2"))
    first = load_checkpoint(ckpt)
    for (k, a), (_, b) in zip(first.model.state_dict().items(), again.model.state_dict().items()):
        assert torch.equal(a, b), k
    assert again.recipe.model == first.recipe.model


@pytest.mark.parametrize(
    "family",
    [
        "gpt2",
        "llama",
        "bert",  # padding masks are tensors (no data-dependent shortcut), so every family exports
        "t5",
    ],
)
def test_onnx_export_matches_pytorch(family, saved_shallow, tmp_path):
    """Over 30 s for T5 on 2 cores: torch.onnx's exporter traces the whole encoder-decoder, and
    onnxruntime runs it. Only an export of the real graph shows that the file a user deploys gives
    the model's logits; no smaller stand-in exercises the exporter on each family's layers."""
    onnxruntime = pytest.importorskip("onnxruntime")
    ref, path = saved_shallow[family]
    ckpt = import_hf(path, tmp_path / "run")
    (onnx_file, recipe_file) = export(ckpt, format="onnx", out=tmp_path / "onnx")
    loaded = load_checkpoint(ckpt)
    inputs = batch(family)
    inputs.pop("token_type_ids", None)  # the ONNX graph takes ids only: every token is of type 0
    feed = {"tokens": inputs["input_ids"]} if family != "t5" else {"src": inputs["input_ids"], "tgt": inputs["decoder_input_ids"]}
    session = onnxruntime.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])
    got = torch.from_numpy(session.run(["logits"], {k: v.numpy() for k, v in feed.items()})[0])
    with torch.no_grad():
        want = loaded.model(*feed.values())
    assert (got - want).abs().max().item() < TOL
    # and against the reference itself
    compare(family, got, theirs(ref, family, inputs), inputs)


def test_safetensors_export_holds_the_weights_and_recipe(saved, tmp_path):
    from safetensors.torch import load_model

    from tfbuilder.model.builder import build_model

    ckpt = import_hf(saved["llama"][1], tmp_path / "run")
    export(ckpt, format="safetensors", out=tmp_path / "st")
    recipe = load_recipe(tmp_path / "st" / "recipe.yaml")
    model = build_model(recipe).eval()
    load_model(model, tmp_path / "st" / "model.safetensors")
    inputs = batch("llama")
    compare("llama", ours(model, "llama", inputs), theirs(saved["llama"][0], "llama", inputs), inputs)


def test_cli_import_then_show_generate_translate(saved, tmp_path, capsys):
    gpt2, t5 = tmp_path / "gpt2", tmp_path / "t5"
    assert main(["import-hf", str(saved["gpt2"][1]), "--out", str(gpt2)]) == 0
    assert main(["import-hf", str(saved["t5"][1]), "--out", str(t5)]) == 0
    capsys.readouterr()
    assert main(["show", str(gpt2 / "recipe.yaml")]) == 0
    shown = capsys.readouterr().out
    assert "pad_id: null" in shown and f"total parameters: {sum(p.numel() for p in saved['gpt2'][0].parameters()):,}" in shown
    # no tokenizer.json in the directory: text is ids written out
    assert main(["generate", str(gpt2), "--prompt", "5 0 17", "--max-new", "4", "--temperature", "0"]) == 0
    words = capsys.readouterr().out.split()  # the prompt, then the new tokens
    assert words[:3] == ["5", "0", "17"] and len(words) == 7 and all(w.isdigit() and int(w) < V for w in words)
    source = tmp_path / "src.txt"
    source.write_text("3 4 5\n9 9\n")
    target = tmp_path / "out.txt"
    assert main(["translate", str(t5), "--beam", "2", "--input", str(source), "--output", str(target)]) == 0
    assert len(target.read_text().splitlines()) == 2


def test_import_keeps_the_tokenizer(saved, tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    hf_dir = tmp_path / "hf"
    saved["bert"][0].save_pretrained(hf_dir)
    vocab = {f"w{i}": i for i in range(V)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w1"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(hf_dir / "tokenizer.json"))
    loaded = load_checkpoint(import_hf(hf_dir, tmp_path / "run"))
    assert loaded.vocab.tgt.encode("w7 w8 w95") == [7, 8, 95]
    assert (tmp_path / "run" / "tokenizer.json").is_file()


def _hf_dir(saved, tmp_path, family: str, **changes) -> str:
    hf_dir = tmp_path / "hf"
    saved[family][0].save_pretrained(hf_dir)
    cfg = json.loads((hf_dir / "config.json").read_text())
    cfg.update(changes)
    (hf_dir / "config.json").write_text(json.dumps(cfg))
    return str(hf_dir)


@pytest.mark.parametrize(
    "family, changes, field",
    [
        ("bert", {"position_embedding_type": "relative_key"}, "position_embedding_type"),
        ("gpt2", {"scale_attn_by_inverse_layer_idx": True}, "scale_attn_by_inverse_layer_idx"),
        ("t5", {"feed_forward_proj": "gated-gelu"}, "feed_forward_proj"),
        ("llama", {"rope_scaling": {"type": "linear", "factor": 2.0}}, "rope_scaling"),
        ("llama", {"architectures": ["MambaForCausalLM"]}, "architectures"),
    ],
)
def test_unsupported_config_exits_2_naming_the_field(saved, tmp_path, capsys, family, changes, field):
    hf_dir = _hf_dir(saved, tmp_path, family, **changes)
    assert main(["import-hf", hf_dir, "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert f"config.json: {field}:" in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()  # nothing written


def test_import_and_export_never_overwrite(saved, tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert main(["import-hf", str(saved["gpt2"][1]), "--out", str(out)]) == 2
    assert "not overwriting" in capsys.readouterr().err and (out / "keep.txt").read_text() == "mine"


def test_export_hf_refuses_a_recipe_outside_the_families(tmp_path, capsys):
    import torch as _torch

    from tfbuilder.model.builder import build_model
    from tfbuilder.data.prepare import Vocab
    from tfbuilder.data.tokenizers import HFTokenizer
    from tfbuilder.interop.hf.convert import checkpoint_dict

    recipe = load_recipe(ROOT / "recipes" / "architectures" / "gpt2-small.yaml", ["model.decoder.layers=1", "model.d_model=32",
        "model.attention.heads=4", "model.ffn.hidden=64", "model.vocab_size=50", "model.position.max_len=16", "model.placement=post"])
    tok = HFTokenizer.ids(50)
    ckpt = tmp_path / "x.ckpt"
    _torch.save(checkpoint_dict(build_model(recipe), recipe, Vocab(tok, tok), source="test"), ckpt)
    assert main(["export", str(ckpt), "--format", "hf", "--out", str(tmp_path / "hf")]) == 2
    assert "model.placement" in capsys.readouterr().err
    assert not (tmp_path / "hf").exists()


def test_imported_run_with_data_is_tested(saved, tmp_path, capsys):
    """`--set data=...` adds what a config does not say, so that `tfbuilder test` scores the import."""
    data = tmp_path / "text"
    data.mkdir()
    g = torch.Generator().manual_seed(0)
    for split in ("train", "val", "test"):
        lines = [" ".join(str(int(i)) for i in torch.randint(0, V, (8,), generator=g)) for _ in range(6)]
        (data / f"{split}.en").write_text("\n".join(lines) + "\n")
    run = tmp_path / "run"
    spec = f"{{type: monolingual, path: {data}, lang: en, tokenizer: {{vocab_size: {V}}}, batch_size: 4}}"
    assert main(["import-hf", str(saved["gpt2"][1]), "--out", str(run), "--set", f"data={spec}"]) == 0
    capsys.readouterr()
    assert main(["test", str(run)]) == 0
    out = capsys.readouterr().out
    assert "perplexity" in out and "6 examples" in out
    assert main(["import-hf", str(saved["gpt2"][1]), "--out", str(tmp_path / "r2"), "--set", "model.d_model=8"]) == 2


ARCH_FAMILY = {"gpt2-small": "gpt2", "bert-base": "bert", "t5-small": "t5", "llama-small": "llama"}
REFERENCE_CLASS = {"gpt2": "GPT2LMHeadModel", "bert": "BertForMaskedLM", "t5": "T5ForConditionalGeneration", "llama": "LlamaForCausalLM"}


@pytest.mark.parametrize("name", sorted(ARCH_FAMILY))
def test_architecture_recipe_exports_to_its_reference(name, tmp_path):
    """A model trained from a recipes/architectures/ file (shrunk) loads in transformers with equal logits."""
    from tfbuilder.model.builder import build_model
    from tfbuilder.data.prepare import Vocab
    from tfbuilder.data.tokenizers import HFTokenizer
    from tfbuilder.interop.hf.convert import checkpoint_dict

    family = ARCH_FAMILY[name]
    overrides = ["model.d_model=32", "model.attention.heads=4", "model.ffn.hidden=48", f"model.vocab_size={V}"]
    overrides += {"gpt2": ["model.decoder.layers=2", "model.position.max_len=16"],
                  "bert": ["model.encoder.layers=2", "model.position.max_len=16"],
                  "t5": ["model.encoder.layers=2", "model.decoder.layers=1", "model.attention.key_dim=8", "model.attention.value_dim=8"],
                  "llama": ["model.decoder.layers=2", "model.attention.kv_heads=2"]}[family]
    recipe = load_recipe(ROOT / "recipes" / "architectures" / f"{name}.yaml", overrides)
    torch.manual_seed(0)
    model = build_model(recipe).eval()
    with torch.no_grad():  # give every parameter (norms, biases, relative bias) a non-trivial value
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    tok = HFTokenizer.ids(V)
    torch.save(checkpoint_dict(model, recipe, Vocab(tok, tok), source="test"), tmp_path / "x.ckpt")
    export(tmp_path / "x.ckpt", format="hf", out=tmp_path / "hf")
    ref = getattr(transformers, REFERENCE_CLASS[family]).from_pretrained(tmp_path / "hf")
    inputs = batch(family)
    compare(family, ours(model, family, inputs), theirs(ref, family, inputs), inputs)
