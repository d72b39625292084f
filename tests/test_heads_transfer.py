"""Fine-tuning an imported model with a new head: `fit recipes/tasks/bert-classify.yaml --init-from` a
tiny random BERT built with transformers (no downloads) loads the body, initialises the head, says so,
and trains (tfbuilder/train/heads/transfer.py)."""

from __future__ import annotations

import json
import random

import pytest
import torch

transformers = pytest.importorskip("transformers")  # in the test extra; importorskip only names the need

from conftest import ROOT  # noqa: E402
from tfbuilder.cli.commands import main  # noqa: E402
from tfbuilder.interop.hf import import_hf  # noqa: E402
from tfbuilder.spec.recipe import load_recipe  # noqa: E402
from tfbuilder.runs.checkpoints import CheckpointError, load_checkpoint  # noqa: E402
from tfbuilder import torch_state  # noqa: E402
from tfbuilder.train.lifecycle import initial_model as _initial_model  # noqa: E402
from tfbuilder.train.lifecycle import read_origin as _origin  # noqa: E402

WORDS = [f"w{i}" for i in range(91)]  # with [PAD], [UNK], [CLS], [SEP] and [MASK]: the model's 96 ids
POSITIVE, NEGATIVE = WORDS[:30], WORDS[30:]
V = 96


def tiny_bert(folder):
    """A random two-layer BERT with a word-level tokenizer.json, as save_pretrained writes it."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    torch.manual_seed(0)
    cfg = transformers.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48, vocab_size=V, max_position_embeddings=32)
    transformers.BertForMaskedLM(cfg).save_pretrained(folder)
    vocab = {"[PAD]": 0, "[UNK]": 1} | {w: i + 2 for i, w in enumerate(WORDS)} | {"[CLS]": 93, "[SEP]": 94, "[MASK]": 95}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(folder / "tokenizer.json"))


def records(n: int, seed: int) -> str:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        label = rng.choice(["neg", "pos"])
        out.append(json.dumps({"text": " ".join(rng.choices(POSITIVE if label == "pos" else NEGATIVE, k=rng.randint(3, 8))), "label": label}))
    return "\n".join(out) + "\n"


# The shipped recipe at the tiny model's size: what differs is only its width, depth and vocabulary.
SHRINK = [
    "model.d_model=32", "model.attention.heads=4", "model.ffn.hidden=48", "model.encoder.layers=2", "model.position.max_len=32",
    "model.vocab_size=96", "data.tokenizer.vocab_size=96", "data.max_len=24", "data.batch_size=16", "data.workers=0",
    "optim.lr=2e-3", "optim.schedule.warmup=2", "trainer.max_steps=30", "trainer.val_every=30", "trainer.max_epochs=null",
    "trainer.progress=false", "trainer.threads=1", "trainer.accelerator=cpu", "trainer.devices=1",
]


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    root = tmp_path_factory.mktemp("bert")
    tiny_bert(root / "hf")
    import_hf(root / "hf", root / "imported")
    data = root / "data"
    data.mkdir()
    for split, n, seed in (("train", 200, 0), ("val", 40, 1)):
        (data / f"{split}.jsonl").write_text(records(n, seed))
    overrides = SHRINK + [f"data.path={data}", f"data.cache={root / 'cache'}", f"trainer.output={root / 'runs'}"]
    return root, overrides


def test_the_body_loads_and_only_the_head_is_new(imported):
    root, overrides = imported
    recipe = load_recipe(ROOT / "recipes" / "tasks" / "bert-classify.yaml", overrides)
    origin = _origin(recipe, resume=None, init_from=root / "imported", run_dir=None, force=False)
    with torch_state.kept():  # _initial_model seeds as fit does (PL_GLOBAL_SEED); fit gives that back, and so must we
        model = _initial_model(recipe, origin)
    source = load_checkpoint(root / "imported", device="cpu").model.state_dict()
    ours = model.state_dict()
    body = [k for k in ours if not k.startswith("head.")]
    assert body and all(torch.equal(ours[k], source[k]) for k in body)
    assert sorted(k for k in ours if k.startswith("head.")) == ["head.out.bias", "head.out.weight"]
    assert float(ours["head.out.bias"].abs().sum()) == 0.0 and 0 < float(ours["head.out.weight"].std()) < 0.05
    assert origin.invocation["new_head"] is True


def test_the_imported_tokenizer_frames_texts_with_the_models_own_tokens(imported):
    """BERT's config names only its pad id; [CLS] and [SEP] come from its tokenizer, and a fine-tune's
    batches are made with them (not tfbuilder's ids 1 and 2)."""
    from tfbuilder.data.collate import labelled

    root, _ = imported
    vocab = load_checkpoint(root / "imported", device="cpu").vocab
    ids = vocab.specials
    assert (ids.start, ids.end, ids.pad, ids.mask) == (93, 94, 0, 95)
    batch = labelled([vocab.src.encode("w3 w4")], ids=ids)
    assert batch["tokens"].tolist() == [[93, 5, 6, 94]]


def test_a_body_that_differs_is_still_refused_naming_the_weights(imported):
    root, overrides = imported
    recipe = load_recipe(ROOT / "recipes" / "tasks" / "bert-classify.yaml", overrides + ["model.ffn.hidden=40"])
    origin = _origin(recipe, resume=None, init_from=root / "imported", run_dir=None, force=False)
    with torch_state.kept(), pytest.raises(CheckpointError, match=r"encoder\.layers\.0\.ffn\..*checkpoint \(48, 32\), recipe \(40, 32\)"):
        _initial_model(recipe, origin)


def test_fit_init_from_an_imported_bert_fine_tunes_a_new_head(imported, capsys):
    root, overrides = imported
    args = ["fit", str(ROOT / "recipes" / "tasks" / "bert-classify.yaml"), "--init-from", str(root / "imported")]
    assert main(args + [x for o in overrides for x in ("--set", o)]) == 0
    captured = capsys.readouterr()
    assert "a new classify head (2 classes) is initialised (head.out.weight, head.out.bias) in place of its masked-LM head" in captured.err
    run = root / "runs" / "bert-classify" / "version_0"
    assert load_recipe(run / "recipe.yaml").model.head.labels == ["neg", "pos"]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["head_scores"]["val_acc"] >= 0.75  # 30 steps on words that give the class away
    assert summary["history"][0]["new_head"] is True
    assert main(["predict", str(run), "--input", str(root / "data" / "val.jsonl")]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 40


def test_the_recipe_names_its_tokenizer_pretrained_and_fit_without_weights_is_refused(imported, capsys):
    """The recipe's tokenizer is the imported model's own (a WordPiece): `pretrained` without a path,
    which only `--init-from` can give; without it fit refuses before preparing or creating anything."""
    root, overrides = imported
    recipe = load_recipe(ROOT / "recipes" / "tasks" / "bert-classify.yaml", overrides)
    assert recipe.data.tokenizer.type == "pretrained" and recipe.data.tokenizer.path is None
    output = root / "refused"
    args = ["fit", str(ROOT / "recipes" / "tasks" / "bert-classify.yaml")]
    sets = [x for o in [*overrides, f"trainer.output={output}"] for x in ("--set", o)]
    assert main(args + sets) == 2
    err = capsys.readouterr().err
    assert "type pretrained without a path is the tokenizer of the weights" in err and "--init-from" in err
    assert "Traceback" not in err and not output.exists()
