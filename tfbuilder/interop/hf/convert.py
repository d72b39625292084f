"""Read a Hugging Face model directory into a tfbuilder run directory, and write a checkpoint out as
safetensors, as a Hugging Face directory, or as ONNX.

    HF_DIR/config.json, model.safetensors[, tokenizer.json]
        -> RUN_DIR/recipe.yaml, tfbuilder-vocab.json, tokenizer.json, hf-config.json, checkpoints/last.ckpt
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import torch

from tfbuilder import atomic
from tfbuilder.contracts import ComponentParams, default_ffn_hidden, default_head_dim
from tfbuilder.data.prepare import Vocab
from tfbuilder.data.pretrained import PretrainedTokenizer, SentencePieceTokenizer
from tfbuilder.data.tokenizers import BPETokenizer, CharTokenizer, HFTokenizer
from tfbuilder.errors import TfbuilderError
from tfbuilder.inference.interfaces import decodable
from tfbuilder.interop.hf import classify, weights
from tfbuilder.interop.hf.configs import UnsupportedConfig, from_config, to_config
from tfbuilder.interop.hf.families import DECODERS
from tfbuilder.interop.hf.specials import config_ids, special_ids
from tfbuilder.interop.onnx import export_onnx
from tfbuilder.model.builder import build_model
from tfbuilder.model.components.ffn import GEGLU, ReGLU, SwiGLU, glu_hidden
from tfbuilder.model.components.moe import MixtureOfExperts
from tfbuilder.model.model import AuxiliaryLosses
from tfbuilder.model.sizing import check_size, count_parameters
from tfbuilder.runs import vocab_files
from tfbuilder.runs.checkpoints import Loaded, load_checkpoint, write_recipe
from tfbuilder.spec.recipe import ModelSection, recipe_from_dict
from tfbuilder.specials import SpecialIds, filled
from tfbuilder.version import __version__

if TYPE_CHECKING:  # annotations only
    from tfbuilder.data.tokenizers import Tokenizer
    from tfbuilder.spec.recipe import Recipe

MAX_CONFIG_BYTES = 1 << 20  # a config.json is a few kB; refuse to parse anything absurd
MAX_TOKENIZER_BYTES = 256 << 20
FORMATS = ("safetensors", "hf", "onnx")


def _fresh_dir(path: Path) -> Path:
    """``path`` created new, or an existing empty directory: nothing the user had is overwritten."""
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise TfbuilderError(f"{path} exists and is not empty: not overwriting it; choose another --out")
    path.mkdir(parents=True, exist_ok=True)
    return path


def _read_json(path: Path, limit: int) -> Any:
    if not path.is_file():
        raise TfbuilderError(f"{path} not found: is {path.parent} a Hugging Face model directory (save_pretrained)?")
    if path.stat().st_size > limit:
        raise TfbuilderError(f"{path} is larger than {limit:,} bytes: not reading it")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except RecursionError:
        raise TfbuilderError(f"{path}: nested too deeply to be a config") from None
    except ValueError as exc:  # not JSON, not UTF-8, or an integer of thousands of digits
        raise TfbuilderError(f"{path}: not JSON ({str(exc)[:200]})") from None


def _safetensors():
    try:
        import safetensors.torch
    except ImportError:
        raise TfbuilderError("this needs the safetensors package: pip install 'tfbuilder[hf]'") from None
    return safetensors.torch


def tokenizers_json(tokenizer: Tokenizer) -> str | None:
    """The ``tokenizers`` library's JSON of a tokenizer (what a save_pretrained directory holds as
    tokenizer.json); None for one that has no such form (SentencePiece)."""
    if isinstance(tokenizer, (CharTokenizer, BPETokenizer, HFTokenizer, PretrainedTokenizer)):
        return tokenizer.hf_json()
    return None


def tokenizer_config(raw: str, specials: SpecialIds) -> dict:
    """``tokenizer_config.json`` for ``transformers.AutoTokenizer``: a fast tokenizer read from
    tokenizer.json, with the model's special tokens by name."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(raw)
    config: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False}
    for name, i in (
        ("bos_token", specials.start),
        ("eos_token", specials.end),
        ("pad_token", specials.pad),
        ("unk_token", specials.unk),
        ("mask_token", specials.mask),
    ):
        token = tok.id_to_token(i) if i is not None else None
        if token is not None:
            config[name] = token
    return config


def _recipe_name(hf_dir: Path) -> str:
    return re.sub(r"[^\w.\-]", "-", hf_dir.resolve().name) or "imported"


def load_hf(
    hf_dir: str | Path, overrides: list[str] | tuple[str, ...] = ()
) -> tuple[str, Recipe, torch.nn.Module, Vocab]:
    """(family, recipe, model with the directory's weights, vocab) of a Hugging Face model directory.
    ``overrides`` (``--set``) may add what a config does not say (data, optim, trainer), not change the model."""
    _safetensors()  # refuse before reading anything when the package is missing
    hf_dir = Path(hf_dir)
    config = hf_dir / "config.json"
    cfg = _read_json(config, MAX_CONFIG_BYTES)
    if not isinstance(cfg, dict):
        raise UnsupportedConfig(f"{config}: expected a JSON object")
    with _naming(config):
        family, model_section = from_config(cfg)
    for override in overrides:
        if override.split("=", 1)[0].strip().split(".")[0] in ("model", "name", "extends"):
            raise TfbuilderError(
                f"--set {override}: the model comes from config.json and its weights; set data, optim or trainer keys"
            )
    recipe = recipe_from_dict({"name": _recipe_name(hf_dir), "model": model_section}, overrides)
    _check_size(recipe, config)  # before the weights are read or the model is built
    with _naming(config):
        specials = special_ids(cfg, family, recipe.model.vocab_size)
    weights_file = hf_dir / "model.safetensors"
    rules = weights.rules(family, recipe.model)
    with torch.device("meta"):  # the parameters' shapes, nothing allocated
        shapes = {k: tuple(v.shape) for k, v in build_model(recipe).state_dict().items()}
    # Before the weights are read or the model is built: a file that does not fit the config is refused.
    weights.check_shapes(rules, _read_shapes(weights_file), shapes, file=str(weights_file))
    theirs = _read_weights(weights_file)
    model = build_model(recipe)
    if not isinstance(model, AuxiliaryLosses):  # every kind is; the ids are set on it
        raise TypeError(f"{type(model).__name__} carries no special ids")
    state = weights.from_hf(rules, theirs, model.state_dict(), file=str(weights_file))
    model.load_state_dict(state)
    model.specials = specials
    tok = _read_tokenizer(hf_dir / "tokenizer.json", recipe.model.vocab_size, specials)
    return family, recipe, model.eval(), Vocab(tok, tok)


@contextmanager
def _naming(config: Path) -> Iterator[None]:
    """An ``UnsupportedConfig`` raised inside (``config.json: key: ...``) names the file the user gave."""
    try:
        yield
    except UnsupportedConfig as exc:
        raise UnsupportedConfig(str(exc).replace("config.json:", f"{config}:", 1)) from None


def _weights_file(weights_file: Path) -> None:
    if not weights_file.is_file():
        sharded = (weights_file.parent / "model.safetensors.index.json").is_file()
        raise TfbuilderError(
            f"{weights_file} not found" + (" (sharded checkpoints are not supported)" if sharded else "")
        )


def _read_shapes(weights_file: Path) -> dict[str, tuple[int, ...]]:
    """The shapes of ``model.safetensors``' tensors by their Hugging Face names, from its header alone."""
    _safetensors()
    from safetensors import SafetensorError, safe_open

    _weights_file(weights_file)
    try:
        with safe_open(str(weights_file), framework="pt") as f:
            return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    except (SafetensorError, OSError) as exc:
        raise TfbuilderError(f"cannot read {weights_file}: {exc}") from None


def _read_weights(weights_file: Path) -> dict[str, torch.Tensor]:
    """The tensors of ``model.safetensors`` by their Hugging Face names."""
    load_file = _safetensors().load_file
    from safetensors import SafetensorError

    _weights_file(weights_file)
    try:
        return load_file(str(weights_file))
    except (SafetensorError, OSError) as exc:
        raise TfbuilderError(f"cannot read {weights_file}: {exc}") from None


def _read_tokenizer(tok_file: Path, vocab_size: int, specials: SpecialIds) -> HFTokenizer:
    """The directory's ``tokenizer.json``, or plain ids when it has none."""
    if not tok_file.exists():
        return HFTokenizer.ids(vocab_size)
    if not tok_file.is_file():  # a FIFO would block, a device never end
        raise TfbuilderError(f"{tok_file} is not a regular file (a folder, FIFO, socket or device): not reading it")
    if tok_file.stat().st_size > MAX_TOKENIZER_BYTES:
        raise TfbuilderError(f"{tok_file} is larger than {MAX_TOKENIZER_BYTES:,} bytes: not reading it")
    try:
        text = tok_file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TfbuilderError(f"{tok_file}: cannot read it ({str(exc).splitlines()[0][:200]})") from None
    tok = HFTokenizer.from_str(text, where=str(tok_file))
    if tok.vocab_size > vocab_size:
        raise TfbuilderError(f"{tok_file} has {tok.vocab_size} tokens; the model has only {vocab_size}")
    # Batches of a fine-tune are made with the model's ids: config.json's, and the tokenizer's
    # named tokens for the roles the config leaves out (BERT's [CLS] and [SEP]); a model without
    # a pad token (GPT-2, Llama) keeps batching as before.
    own = filled(specials, tok.named_specials())
    tok.specials = own if None not in (own.start, own.end, own.pad) else None
    return tok


def _check_size(recipe: Recipe, config: Path) -> None:
    """The model a config asks for fits this machine: counted on the meta device before anything is allocated."""

    problems = check_size(recipe, count_parameters(recipe), training=False)
    if problems:
        raise UnsupportedConfig(f"{config}: {problems[0].message}")


def import_hf(hf_dir: str | Path, out: str | Path, *, overrides: list[str] | tuple[str, ...] = ()) -> Path:
    """Write a run directory from a Hugging Face model directory; returns its checkpoint's path."""

    hf_dir, out = Path(hf_dir), Path(out)
    family, recipe, model, vocab = load_hf(hf_dir, overrides)
    run_dir = _fresh_dir(out)
    write_recipe(run_dir, recipe.to_dict())
    vocab_files.write(run_dir, vocab)
    atomic.copy(hf_dir / "config.json", run_dir / "hf-config.json", what="config")
    ckpt = run_dir / "checkpoints" / "last.ckpt"
    ckpt.parent.mkdir()
    atomic.save(checkpoint_dict(model, recipe, vocab, source=f"hf:{family}"), ckpt)
    return ckpt


def checkpoint_dict(model: torch.nn.Module, recipe: Recipe, vocab: Vocab, *, source: str) -> dict:
    """A checkpoint that ``runs.load_checkpoint`` reads (the layout training writes, step 0)."""
    return {
        "state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
        "global_step": 0,
        "tfbuilder": {
            "version": __version__,
            "recipe": recipe.to_dict(),
            "vocab": vocab.to_json(),
            "batches_seen": 0,
            "train_tokens": 0,
            "train_seconds": 0.0,
            "elapsed": 0.0,
            "source": source,
            "specials": decodable(model).specials.to_dict(),
        },
    }


def _comparable(model_section: ModelSection) -> dict:
    """A model section's data without what does not change the function (dropout, initialisation)."""

    data = model_section.model_dump(mode="json")
    data.pop("init", None)
    data.pop("dropout", None)
    for value in data.values():
        if isinstance(value, dict):
            value.pop("dropout", None)
    # Widths left to their defaults are the widths they resolve to.
    d, att, ffn = model_section.d_model, data["attention"], data["ffn"]
    if att.get("type") == "multihead":
        att["kv_heads"] = att.get("kv_heads") or att["heads"]
        att["key_dim"] = att.get("key_dim") or default_head_dim(d, att["heads"])
        att["value_dim"] = att.get("value_dim") or default_head_dim(d, att["heads"])
    if ffn.get("type") == "mlp":
        ffn["hidden"] = ffn.get("hidden") or default_ffn_hidden(d)
    elif isinstance(glu := model_section.ffn, (SwiGLU.Params, GEGLU.Params, ReGLU.Params)):
        ffn["hidden"] = glu_hidden(glu, d)
        ffn.pop("match_params", None)
    elif isinstance(moe := model_section.ffn, MixtureOfExperts.Params):
        ffn.pop("aux_weight", None)  # training only, as bias_update (DeepSeek-V3's config holds neither)
        ffn.pop("bias_update", None)
        ffn["normalize"] = moe.normalizes()
        if moe.shared_experts and moe.hidden is not None:  # the shared experts' default width, as resolved
            ffn["shared_hidden"] = moe.shared_hidden or moe.hidden * moe.shared_experts
    return data


def hf_family(model_section: ModelSection) -> str:
    """The Hugging Face family a model section is exactly, or an error naming what differs."""

    decoders = ["gpt2", *DECODERS]
    candidates = {"decoder": decoders, "encoder": ["bert"], "encoder_decoder": ["t5"]}[model_section.kind]
    if model_section.kind == "decoder":
        position: ComponentParams = model_section.position
        candidates.sort(key=lambda f: (f in DECODERS) != (position.type == "rotary"))  # stable: llama first
    ours = _comparable(model_section)
    why = ""
    for family in candidates:
        try:
            theirs = _comparable(ModelSection.model_validate(from_config(to_config(model_section, family))[1]))
        except (UnsupportedConfig, ValueError) as exc:
            why = why or f"{family}: {exc}"
            continue
        diff = [k for k in sorted(set(ours) | set(theirs)) if ours.get(k) != theirs.get(k)]
        if not diff:
            return family
        why = why or f"{family} differs in model." + ", model.".join(diff)
    names = ", ".join(["gpt2", "bert", "t5", *DECODERS])
    raise TfbuilderError(f"this recipe is not one of the Hugging Face families {names} exactly ({why})")


def export(checkpoint: str | Path, *, format: str, out: str | Path) -> list[Path]:
    """Write a checkpoint as ``safetensors`` (+ recipe), ``hf`` (a save_pretrained directory) or
    ``onnx`` (checked with onnxruntime against PyTorch); returns the files written."""

    if format not in FORMATS:
        raise TfbuilderError(f"unknown export format {format!r} (one of: {', '.join(FORMATS)})")
    loaded = load_checkpoint(checkpoint)
    if format == "hf":
        model_section, head = loaded.recipe.model, loaded.recipe.model.head
        family = hf_family(model_section if head is None else classify.body(model_section))  # refuse before writing
        if head is not None:
            classify.check(model_section, head, family)
        return _export_hf(loaded, family, _fresh_dir(Path(out)))
    out = _fresh_dir(Path(out))
    model = loaded.model
    if format == "safetensors":
        save_model = _safetensors().save_model
        atomic.write_by_name(out / "model.safetensors", lambda tmp: save_model(model, str(tmp)), what="weights")
        write_recipe(out, loaded.recipe.to_dict())
        return [out / "model.safetensors", out / "recipe.yaml", *vocab_files.write(out, loaded.vocab)]
    path = export_onnx(model, loaded.recipe, out / "model.onnx")
    write_recipe(out, loaded.recipe.to_dict())
    return [path, out / "recipe.yaml"]


def _export_hf(loaded: Loaded, family: str, out: Path) -> list[Path]:
    """A save_pretrained directory: weights, config.json and the tokenizer's files."""
    save_file = _safetensors().save_file
    model = loaded.model
    specials = decodable(model).specials
    model_section, head = loaded.recipe.model, loaded.recipe.model.head
    body = model_section if head is None else classify.body(model_section)
    rules = weights.rules(family, body)
    if head is not None:
        rules = classify.rules(rules, family)
    tensors = weights.to_hf(rules, model.state_dict(), weights.split_sizes(model, family))
    atomic.write_by_name(
        out / "model.safetensors",
        lambda tmp: save_file(tensors, str(tmp), metadata={"format": "pt"}),
        what="weights",
    )
    config = {**to_config(body, family), **config_ids(specials, family)}
    if head is not None:
        config.update(classify.config(model_section, head, family))
    atomic.write_text(out / "config.json", json.dumps(config, indent=2) + "\n", what="config")
    written = [out / "model.safetensors", out / "config.json"]
    tokenizer = loaded.vocab.tgt
    raw = tokenizers_json(tokenizer)
    if raw is not None:
        atomic.write_text(out / "tokenizer.json", raw, what="tokenizer")
        tok_config = tokenizer_config(raw, specials)
        atomic.write_text(
            out / "tokenizer_config.json", json.dumps(tok_config, indent=2) + "\n", what="tokenizer config"
        )
        written += [out / "tokenizer.json", out / "tokenizer_config.json"]
    elif isinstance(tokenizer, SentencePieceTokenizer):  # its model file, as save_pretrained keeps it
        sp_model = tokenizer.model

        def write_model(f: BinaryIO) -> None:
            f.write(sp_model)

        atomic.write_atomic(out / "tokenizer.model", write_model, what="tokenizer")
        written.append(out / "tokenizer.model")
    return written
