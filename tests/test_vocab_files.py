"""A run's vocabulary files: tokenizer.json is a real Hugging Face tokenizers file; older runs still load."""

from __future__ import annotations

from tokenizers import Tokenizer

from tfbuilder.runs import vocab_files
from tfbuilder.data.prepare import Vocab
from tfbuilder.data.tokenizers import BPETokenizer, CharTokenizer

TEXT = ["the cat sat on the mat", "a dog in the park", "zebras run fast"]


def test_tokenizer_json_loads_in_tokenizers_and_reads_text_as_tfbuilder_does(tmp_path):
    for name, tok in (("char", CharTokenizer.train(TEXT, 20)), ("bpe", BPETokenizer.train(TEXT * 20, 280))):
        folder = tmp_path / name
        folder.mkdir()
        written = vocab_files.write(folder, Vocab(tok, tok))
        assert [p.name for p in written] == ["tfbuilder-vocab.json", "tokenizer.json"]
        theirs = Tokenizer.from_file(str(folder / "tokenizer.json"))
        for line in [*TEXT, "quixotic text \u00e9 with unseen characters"]:
            assert theirs.encode(line, add_special_tokens=False).ids == tok.encode(line), (name, line)
            assert theirs.decode(tok.encode(line)).strip() == tok.decode(tok.encode(line)), (name, line)
        assert theirs.get_vocab_size() == tok.vocab_size
        assert vocab_files.read(folder).to_json() == Vocab(tok, tok).to_json()


def test_a_vocabulary_per_side_writes_the_source_too(tmp_path):
    src, tgt = CharTokenizer.train(TEXT[:2], 15), CharTokenizer.train(TEXT[1:], 15)
    names = [p.name for p in vocab_files.write(tmp_path, Vocab(src, tgt))]
    assert names == ["tfbuilder-vocab.json", "tokenizer.json", "source-tokenizer.json"]
    assert Tokenizer.from_file(str(tmp_path / "source-tokenizer.json")).encode("cat", add_special_tokens=False).ids == src.encode("cat")


def test_runs_written_before_keep_loading(tmp_path):
    tok = CharTokenizer.train(TEXT, 20)
    old = Vocab(tok, tok).to_json()
    (tmp_path / "tokenizer.json").write_text(old)  # tfbuilder's record, where older versions kept it
    assert vocab_files.present(tmp_path) and vocab_files.read(tmp_path).to_json() == old
    (tmp_path / "tokenizer.json").write_text(tok.hf_json())  # a tokenizers file alone records nothing of tfbuilder's
    assert vocab_files.read(tmp_path) is None
