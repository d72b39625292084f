"""The vocabulary files of a run directory (and of an exported model).

    tfbuilder-vocab.json      tfbuilder's own record of every tokenizer of the run (what checkpoints keep)
    tokenizer.json            the target tokenizer as a Hugging Face ``tokenizers`` file
                              (``tokenizers.Tokenizer.from_file`` loads it), where it can be one
    tokenizer.model           the SentencePiece model, for a SentencePiece tokenizer
    source-tokenizer.json     the source side's, when the two sides have their own vocabularies

Runs written before ``tfbuilder-vocab.json`` existed kept tfbuilder's record in ``tokenizer.json``;
:func:`read` still reads them.
"""

from __future__ import annotations

import json
from pathlib import Path

from tfbuilder import atomic
from tfbuilder.data.prepare import Vocab
from tfbuilder.data.pretrained import SentencePieceTokenizer
from tfbuilder.data.tokenizers import HFWritable

VOCAB_FILE = "tfbuilder-vocab.json"
HF_FILE = "tokenizer.json"
SENTENCEPIECE_FILE = "tokenizer.model"
SOURCE_FILE = "source-tokenizer.json"
NAMES = (VOCAB_FILE, HF_FILE, SENTENCEPIECE_FILE, SOURCE_FILE)  # every file a run's vocabulary may be written as


def write(directory: Path, vocab: Vocab) -> list[Path]:
    """Write the vocabulary files of ``vocab`` into ``directory``; returns their paths."""
    written = [directory / VOCAB_FILE]
    atomic.write_text(written[0], vocab.to_json(), what="vocabulary")
    target = vocab.tgt
    if isinstance(target, HFWritable):
        written.append(directory / HF_FILE)
        atomic.write_text(written[-1], target.hf_json(), what="tokenizer")
    elif isinstance(target, SentencePieceTokenizer):
        written.append(directory / SENTENCEPIECE_FILE)
        atomic.write_bytes(written[-1], target.model, what="tokenizer")
    if not vocab.shared and isinstance(vocab.src, HFWritable):
        written.append(directory / SOURCE_FILE)
        atomic.write_text(written[-1], vocab.src.hf_json(), what="tokenizer")
    return written


def read(directory: Path) -> Vocab | None:
    """The vocabulary a run directory records, or None when it records none yet."""
    own = directory / VOCAB_FILE
    if own.exists():
        return Vocab.from_json(own.read_text(encoding="utf-8"))
    legacy = directory / HF_FILE
    if legacy.exists():
        text = legacy.read_text(encoding="utf-8")
        data = json.loads(text) if text.lstrip().startswith("{") else None
        if isinstance(data, dict) and ("shared" in data or "src" in data):  # tfbuilder's record, as older runs kept it
            return Vocab.from_json(text)
    return None


def present(directory: Path) -> bool:
    """Whether ``directory`` already records a vocabulary (this version's file, or an older run's)."""
    return (directory / VOCAB_FILE).exists() or (directory / HF_FILE).exists()
