"""The prepared store (tfbuilder/data/store.py, prepare.py): prepared once, keyed by content, reused
without reading text, safe under concurrent preparers, and exactly the tokens the tokenizer gives."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tfbuilder
from conftest import ONE_LAYER
from tfbuilder.data import store, text
from tfbuilder.data.prepare import prepare, sample_rows
from tfbuilder.errors import DataError
from tfbuilder.spec.sections import DataSection

WORDS = "the a cat dog sat on mat ran far away house tree big small red green blue".split()


def corpus(folder: Path, *, train: int = 400, seed: int = 0, gz: bool = True) -> Path:
    """A small parallel corpus: target = source reversed word by word (plain or gzipped files)."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", train), ("val", 30), ("test", 20)):
        src = [" ".join(rng.choice(WORDS, rng.integers(2, 9))) for _ in range(n)]
        tgt = [" ".join(reversed(line.split())) for line in src]
        for lang, lines in (("de", src), ("en", tgt)):
            body = "\n".join(lines) + "\n"
            if gz:
                with gzip.open(folder / f"{split}.{lang}.gz", "wt", encoding="utf-8") as f:
                    f.write(body)
            else:
                (folder / f"{split}.{lang}").write_text(body, encoding="utf-8")
    return folder


def section(folder: Path, **changes) -> DataSection:
    fields = {
        "type": "parallel", "path": str(folder), "src_lang": "de", "tgt_lang": "en",
        "tokenizer": {"type": "bpe", "vocab_size": 280}, "max_tokens": 400, **changes,
    }
    return DataSection(**fields)


@pytest.fixture
def said():
    lines: list[str] = []
    return lines


def last(said: list[str]) -> str:
    """The last line on what happened to the store (prepared or reused)."""
    return [line for line in said if "prepared" in line][-1]


def test_every_data_field_decides_the_content_or_only_how_it_is_read():
    fields = set(DataSection.model_fields)
    assert set(store.CONTENT_FIELDS) | set(store.READING_FIELDS) == fields
    assert not set(store.CONTENT_FIELDS) & set(store.READING_FIELDS)


def test_prepared_once_beside_the_data_then_reused_without_reading_text(tmp_path, monkeypatch, said):
    monkeypatch.delenv(store.CACHE_ENV, raising=False)
    data = section(corpus(tmp_path / "data"))
    first = prepare(data, say=said.append)
    assert first.store is not None and first.store.parent == (tmp_path / "data" / ".tfbuilder").resolve()
    assert said[-1].startswith("data: prepared 400 train / 30 val / 20 test examples into") and "no store for these files yet" in said[-1]

    def no_reading(*args, **kwargs):
        raise AssertionError("text was read although a store matched")

    monkeypatch.setattr(text, "lines", no_reading)
    for loader_change in ({}, {"max_tokens": 999}, {"workers": 2}, {"batch_size": 8, "max_tokens": None}):
        again = prepare(section(tmp_path / "data", **loader_change), say=said.append)
        assert again.store == first.store
        assert "using the prepared store" in said[-1]
        assert again.splits["train"].src.tolist() == first.splits["train"].src.tolist()


def test_a_changed_file_or_setting_prepares_again_and_says_why(tmp_path, said):
    folder = corpus(tmp_path / "data")
    first = prepare(section(folder), say=said.append)
    bigger = prepare(section(folder, max_len=8), say=said.append)
    assert bigger.store != first.store and "data.max_len changed" in last(said)
    train = folder / "train.en.gz"
    os.utime(train, ns=(train.stat().st_atime_ns, train.stat().st_mtime_ns + 10**9))
    prepare(section(folder), say=said.append)
    assert "train.en.gz changed" in last(said)
    prepare(section(folder, tokenizer={"type": "bpe", "vocab_size": 290}), say=said.append)
    assert "data.tokenizer changed" in last(said)


def test_the_store_holds_exactly_what_the_tokenizer_gives(tmp_path):
    folder = corpus(tmp_path / "data", gz=False)
    prepared = prepare(section(folder, max_len=5))
    src = text.read_lines(folder / "train.de")
    tgt = text.read_lines(folder / "train.en")
    kept = [(s, t) for s, t in zip(src, tgt) if len(prepared.vocab.src.encode(s)) <= 5 and len(prepared.vocab.tgt.encode(t)) <= 5]
    train = prepared.splits["train"]
    assert train.dropped == len(src) - len(kept) > 0
    assert train.src.tolist() == [prepared.vocab.src.encode(s) for s, _ in kept]
    assert train.tgt.tolist() == [prepared.vocab.tgt.encode(t) for _, t in kept]
    assert train.src.dtype == np.uint16 and train.src.lengths.dtype == np.uint16
    assert list(train.src.lengths) == [len(r) for r in train.src.tolist()]
    assert prepared.raw["val"] == (text.read_lines(folder / "val.de"), text.read_lines(folder / "val.en"))


def test_a_given_vocabulary_reuses_the_store_that_has_it_and_prepares_with_another(tmp_path, said):
    folder = corpus(tmp_path / "data")
    first = prepare(section(folder), say=said.append)
    resumed = prepare(section(folder), vocab=first.vocab, say=said.append)  # a resumed run's vocabulary
    assert resumed.store == first.store and "using the prepared store" in said[-1]
    other = prepare(section(corpus(tmp_path / "other", seed=5), tokenizer={"type": "bpe", "vocab_size": 290})).vocab
    foreign = prepare(section(folder), vocab=other, say=said.append)  # --init-from a model of other data
    assert foreign.store != first.store and foreign.vocab.to_json() == other.to_json()
    assert "another vocabulary" in last(said)


def test_a_damaged_store_or_a_killed_preparers_leftovers_are_prepared_again(tmp_path, said):
    folder = corpus(tmp_path / "data")
    first = prepare(section(folder), say=said.append)
    expected = first.splits["train"].src.tolist()
    leftover = first.store.parent / f".{first.store.name}.tmp-999999"
    leftover.mkdir()
    (leftover / "train.src.tok").write_bytes(b"half")
    token_file = first.store / "train.src.tok"
    token_file.write_bytes(token_file.read_bytes()[:-4])  # truncated
    again = prepare(section(folder), say=said.append)
    assert last(said).startswith("data: prepared") and not leftover.exists()
    assert again.splits["train"].src.tolist() == expected


def test_a_read_only_data_folder_uses_the_user_cache(tmp_path, monkeypatch):
    monkeypatch.delenv(store.CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home-cache"))
    folder = corpus(tmp_path / "data")
    real_access = os.access
    monkeypatch.setattr(store.os, "access", lambda p, mode: False if Path(p).parent == folder else real_access(p, mode))
    assert store.root(section(folder)) == tmp_path / "home-cache" / "tfbuilder" / "data"
    assert store.root(section(folder, cache=str(tmp_path / "mine"))) == tmp_path / "mine"
    monkeypatch.setenv(store.CACHE_ENV, str(tmp_path / "env"))
    assert store.root(section(folder)) == tmp_path / "env"


def test_concurrent_preparers_prepare_once(tmp_path):
    """Two processes asked for the same store at once (two sweeps, several ranks): one prepares, the
    other waits for it and opens it; whatever the timing, exactly one prepared."""
    folder = corpus(tmp_path / "data", train=3000)
    script = (
        "import sys; from tfbuilder.data.prepare import prepare; from tfbuilder.spec.sections import DataSection\n"
        f"data = DataSection(type='parallel', path={str(folder)!r}, src_lang='de', tgt_lang='en', tokenizer={{'type': 'bpe', 'vocab_size': 60}})\n"
        "prepare(data, say=print)\n"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop(store.CACHE_ENV, None)
    procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for _ in range(2)]
    outputs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    lines = [line for out, _ in outputs for line in out.splitlines()]
    assert sum(line.startswith("data: prepared") for line in lines) == 1, lines
    assert sum("using the prepared store" in line for line in lines) == 1, lines
    stores = [p for p in (folder / ".tfbuilder").iterdir() if p.is_dir()]
    assert len(stores) == 1


def test_reservoir_sample_is_uniform_deterministic_and_keeps_small_inputs_whole():
    rows = [(str(i), None) for i in range(20000)]
    assert sample_rows(rows[:50], 100) == rows[:50]
    sample = sample_rows(rows, 2000)
    assert sample == sample_rows(rows, 2000) and len(sample) == 2000 and len(set(sample)) == 2000
    picked = np.array([int(r[0]) for r in sample])
    # Uniform: every tenth of the input holds about a tenth of the sample (fixed seed: no flakes).
    counts = np.bincount(picked // 2000, minlength=10)
    assert counts.min() > 150 and counts.max() < 250


@pytest.mark.parametrize("case", ["directory", "fifo", "loop", "device", "long line", "dangling"])
def test_data_paths_that_are_not_files_are_named_for_what_they_are(tmp_path, case):
    path = tmp_path / "train.de"
    if case == "directory":
        path.mkdir()
        expect = "is a directory"
    elif case == "fifo":
        os.mkfifo(path)
        expect = "not a regular file"
    elif case == "loop":
        path.symlink_to(tmp_path / "train.de")
        expect = "loop of symbolic links"
    elif case == "device":
        path.symlink_to("/dev/zero")
        expect = "not a regular file"
    elif case == "dangling":
        path.symlink_to(tmp_path / "nowhere")
        expect = "symbolic link to nothing"
    else:
        path.write_bytes(b"short\n" + b"x" * 5000 + b"\n")
        with pytest.raises(DataError, match=r"train\.de: line 2 is longer than"):
            list(text.lines(path, max_line_bytes=4096))
        return
    with pytest.raises(DataError, match=expect):
        text.find(tmp_path, "train", "de")


def test_a_data_path_that_is_a_file_is_named_so(tmp_path):
    (tmp_path / "corpus.txt").write_text("a\n")
    with pytest.raises(DataError, match=r"data.path .*corpus.txt is a file, not a directory"):
        text.find(tmp_path / "corpus.txt", "train", "de")


def test_a_small_gzip_that_expands_to_one_huge_line_is_refused_in_bounded_memory(tmp_path):
    """256 MiB of one line in a 256 KiB gzip: refused at the line limit, reading at most about one line's
    worth (measured as growth over the process's own start, so the interpreter's size does not count)."""
    folder = tmp_path / "data"
    folder.mkdir()
    with gzip.open(folder / "train.de.gz", "wb", compresslevel=1) as f:
        block = b"a" * 2**20
        for _ in range(256):
            f.write(block)
    script = (
        "import resource, sys; from pathlib import Path; from tfbuilder.data import text\n"
        "base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024\n"
        "try:\n"
        f"    list(text.lines(Path({str(folder / 'train.de.gz')!r})))\n"
        "except Exception as exc:\n"
        "    print(exc)\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024 - base)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120).stdout.splitlines()
    assert "line 1 is longer than 16 MiB" in out[0]
    assert int(out[1]) < 128  # MiB over the start: a bounded buffer or two, not the 256 MiB expansion


def test_fit_prepares_once_and_a_second_fit_reuses_the_store(tmp_path, monkeypatch):
    from tfbuilder.train.training import fit

    monkeypatch.delenv(store.CACHE_ENV, raising=False)
    folder = corpus(tmp_path / "data")
    overrides = [
        *ONE_LAYER, "data.type=parallel", f"data.path={folder}", "data.src_lang=de", "data.tgt_lang=en",
        "data.tokenizer.type=bpe", "data.tokenizer.vocab_size=280", "data.max_tokens=400", "model.vocab_size=280",
        "trainer.max_steps=2", "trainer.val_every=2", "trainer.progress=false", f"trainer.output={tmp_path / 'runs'}",
        "trainer.val_bleu=0",
    ]
    recipe = tfbuilder.load_recipe(Path(__file__).parent.parent / "recipes" / "quickstart.yaml", overrides)
    fit(recipe)
    stores = [p for p in (folder / ".tfbuilder").iterdir() if p.is_dir()]
    monkeypatch.setattr(text, "lines", lambda *a, **k: (_ for _ in ()).throw(AssertionError("text was read")))
    summary = fit(recipe)
    assert summary.steps == 2
    assert [p for p in (folder / ".tfbuilder").iterdir() if p.is_dir()] == stores


def test_a_run_on_the_store_resumes_bit_equal_with_loader_workers(tmp_path, monkeypatch):
    """Six steps straight, against three steps then a resume to six reading through two DataLoader
    worker processes: the same weights, bit for bit (the store's batches do not depend on who reads)."""
    import torch

    from tfbuilder.spec.recipe import recipe_from_dict
    from tfbuilder.runs.checkpoints import read_checkpoint
    from tfbuilder.train.training import fit

    monkeypatch.delenv(store.CACHE_ENV, raising=False)
    folder = corpus(tmp_path / "data")
    common = [
        *ONE_LAYER, "data.type=parallel", f"data.path={folder}", "data.src_lang=de", "data.tgt_lang=en",
        "data.tokenizer.type=bpe", "data.tokenizer.vocab_size=280", "data.max_tokens=300", "model.dropout=0.1",
        "trainer.val_every=3", "trainer.progress=false", "trainer.val_bleu=0", "trainer.deterministic=true", "trainer.threads=1",
    ]
    quickstart = Path(__file__).parent.parent / "recipes" / "quickstart.yaml"
    straight = fit(tfbuilder.load_recipe(quickstart, [*common, "trainer.max_steps=6", f"trainer.output={tmp_path / 'a'}"]))
    first = fit(tfbuilder.load_recipe(quickstart, [*common, "trainer.max_steps=3", f"trainer.output={tmp_path / 'b'}"]))
    meta = read_checkpoint(first.last_checkpoint)["tfbuilder"]
    resumed = fit(recipe_from_dict(meta["recipe"], ["trainer.max_steps=6", "data.workers=2"]), resume=first.run_dir)
    assert resumed.steps == 6
    a = read_checkpoint(straight.last_checkpoint)["state_dict"]
    b = read_checkpoint(resumed.last_checkpoint)["state_dict"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_prepare_on_the_command_line_reports_bad_data_with_exit_2_and_leaves_nothing_half_made(tmp_path, capsys, monkeypatch):
    from tfbuilder.cli.commands import main

    monkeypatch.delenv(store.CACHE_ENV, raising=False)
    folder = corpus(tmp_path / "data", gz=False)
    quickstart = str(Path(__file__).parent.parent / "recipes" / "quickstart.yaml")
    sets = sum((["--set", o] for o in [
        "data.type=parallel", f"data.path={folder}", "data.src_lang=de", "data.tgt_lang=en",
        "data.tokenizer.type=bpe", "data.tokenizer.vocab_size=280",
    ]), [])
    assert main(["prepare", quickstart, *sets]) == 0
    out = capsys.readouterr().out
    assert "data: prepared 400 train / 30 val / 20 test examples" in out and "store: " in out and "MiB on disk" in out
    with open(folder / "val.en", "a", encoding="utf-8") as f:
        f.write("one line too many\n")
    assert main(["prepare", quickstart, *sets]) == 2
    err = capsys.readouterr().err
    assert "val.de has 30 lines but" in err and "val.en has 31" in err and "Traceback" not in err
    assert not [p for p in (folder / ".tfbuilder").iterdir() if store.TEMP_MARK in p.name]


def test_stored_tokens_travel_to_spawned_workers(tmp_path):
    """A DataLoader started with spawn pickles the dataset: a stored side goes without its open files."""
    import pickle

    train = prepare(section(corpus(tmp_path / "data"))).splits["train"]
    first = train.src[0].tolist()
    copy = pickle.loads(pickle.dumps(train.src))
    assert copy[0].tolist() == first and copy[len(copy) - 1].tolist() == train.src[len(train) - 1].tolist()


@pytest.mark.parametrize("vocab_size, dtype", [
    (2, np.uint16), (2**16 - 1, np.uint16), (2**16, np.uint16),  # ids 0 to 65,535: two bytes
    (2**16 + 1, np.uint32), (2**17, np.uint32), (10_000_000, np.uint32), (2**32, np.uint32),  # id 65,536 and up: four
])
def test_token_ids_are_stored_in_the_narrowest_type_that_holds_the_vocabulary(vocab_size, dtype):
    from tfbuilder.data.tokens import token_dtype

    chosen = token_dtype(vocab_size)
    assert chosen == np.dtype(dtype)
    assert np.iinfo(chosen).max >= vocab_size - 1  # the largest id fits


@pytest.mark.parametrize("vocab_size", [2**16, 2**16 + 1, 2**17, 2**32])
def test_the_largest_ids_of_a_vocabulary_survive_the_store(tmp_path, vocab_size):
    """Written by the store's writer in the type the vocabulary gets and read back as training reads
    it: ids at the 16-bit edge (65,535, and 65,536 where the vocabulary has it) and the largest id."""
    from tfbuilder.data.tokens import StoredTokens, token_dtype

    dtype = np.dtype(token_dtype(vocab_size).name)  # as meta.json records it and open_store reads it
    top = vocab_size - 1
    rows = [[5, 2**16 - 1, top], [top], [min(2**16, top), 4, top - 1, 2**16 - 1]]
    writer = store.SideWriter(tmp_path, "train.src", dtype)
    writer.add(rows[:2])
    writer.add(rows[2:])
    writer.close()
    read = StoredTokens(tmp_path / "train.src", dtype, writer.examples)
    assert read.tolist() == rows
    assert int(read[2][0]) == min(2**16, top) and int(read[0][2]) == top
