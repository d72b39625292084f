"""A prepared store whose own files cannot be trusted: FIFOs, devices, links and sparse giants in place
of its files, same-size damage to its token and offset files, a meta.json of the wrong shape, a
tokenizer.json that is not one, a lock held by a stopped process, a store folder that is a file, a full
disk. Each is prepared again (with a line naming what was damaged) or refused with exit 2 naming the
file, without blocking, within bounded time and memory, and nothing the user had is changed."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT
from hostile import assert_refused, run_cli, run_limited
from test_store import corpus, section

from tfbuilder.data import store, storefiles, storelock
from tfbuilder.data.prepare import prepare
from tfbuilder.errors import DataError

QUICKSTART = str(ROOT / "recipes" / "quickstart.yaml")


@pytest.fixture(autouse=True)
def deadline():
    """A case that blocks (a FIFO opened for reading, a lock waited on) fails instead of hanging."""

    def expired(signum, frame):
        raise TimeoutError("blocked: still running after 60 s")

    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


@pytest.fixture
def made(tmp_path, monkeypatch) -> tuple[Path, Path, list[str]]:
    """(data folder, its prepared store, what was said) of a tiny corpus."""
    monkeypatch.delenv(store.CACHE_ENV, raising=False)
    monkeypatch.delenv(storelock.LOCK_TIMEOUT_ENV, raising=False)
    folder = corpus(tmp_path / "data", train=120)
    said: list[str] = []
    first = prepare(section(folder), say=said.append)
    assert first.store is not None
    return folder, first.store, said


def again(folder: Path, said: list[str]):
    """Prepare the same data once more; the tokens of the training split and the last line said."""
    prepared = prepare(section(folder), say=said.append)
    return prepared, said[-1]


def expect_prepared_again(folder: Path, path: Path, said: list[str], *damage: str) -> None:
    """The store at ``path`` is found damaged (each of ``damage`` in the line saying so), prepared
    again, and holds what it held before."""
    before = json.loads((path.parent / "expected.json").read_text())
    prepared, line = again(folder, said)
    warned = [s for s in said if "is damaged" in s]
    assert warned and all(d in warned[-1] for d in damage), said[-3:]
    assert line.startswith("data: prepared") and "the store was damaged" in line, line
    assert prepared.store == path and prepared.splits["train"].src.tolist() == before
    assert again(folder, said)[1].startswith("data: using the prepared store")


@pytest.fixture
def damaged(made):
    """``made``, with the training tokens kept beside the store (what it must hold once prepared again)."""
    folder, path, said = made
    tokens = prepare(section(folder)).splits["train"].src.tolist()
    (path.parent / "expected.json").write_text(json.dumps(tokens))
    return made


def without_checksums(path: Path) -> None:
    """The store as one written before checksums were recorded."""
    meta = json.loads((path / "meta.json").read_text())
    del meta[store.CHECKSUMS]
    (path / "meta.json").write_text(json.dumps(meta))


# --- 1. files that are not regular files, or too large to read ----------------------------------------


def _fifo(file: Path) -> str:
    file.unlink()
    os.mkfifo(file)
    return "is a named pipe (FIFO)"


def _zero(file: Path) -> str:
    file.unlink()
    file.symlink_to("/dev/zero")
    return "is a symbolic link (to /dev/zero)"


def _loop(file: Path) -> str:
    file.unlink()
    file.symlink_to(file)
    return "is a loop of symbolic links"


def _sparse(file: Path) -> str:
    with open(file, "r+b") as f:
        f.truncate(2**31)  # 2 GiB of nothing: a hole, no disk used
    return "2,147,483,648 bytes"


@pytest.mark.parametrize("name", ["meta.json", "tokenizer.json", "train.src.tok", "val.tgt.txt"])
@pytest.mark.parametrize("make", [_fifo, _zero, _loop, _sparse])
def test_a_store_file_that_is_no_regular_file_or_a_sparse_giant_is_prepared_again(damaged, name, make):
    folder, path, said = damaged
    what = make(path / name)
    start = time.process_time()
    expect_prepared_again(folder, path, said, name, what)
    assert time.process_time() - start < 10


def test_sparse_giants_in_a_store_are_prepared_again_within_1_gib(damaged):
    """``tfbuilder prepare`` under RLIMIT_AS of 1 GiB, its store's meta.json and tokenizer.json each a
    sparse 2 GiB: neither is read, the store is prepared again."""
    folder, path, said = damaged
    _sparse(path / "meta.json")
    _sparse(path / "tokenizer.json")
    outcome = run_limited(["prepare", QUICKSTART, *sum((["--set", o] for o in _recipe_sets(folder)), [])], cwd=folder)
    assert outcome.rc == 0, outcome.err
    assert "meta.json has 2,147,483,648 bytes" in outcome.out and "data: prepared" in outcome.out, outcome.out
    assert outcome.seconds < 60  # a subprocess importing torch on a shared machine: the time is its start


def test_closest_looks_at_the_newest_stores_only_and_at_no_file_that_is_not_plain_or_small(made, monkeypatch):
    folder, path, said = made
    root = path.parent
    material = json.loads((path / "meta.json").read_text())["key_material"]
    for i, make in enumerate([_fifo, _zero, _sparse]):
        other = root / f"other{i}"
        other.mkdir()
        (other / "meta.json").write_text("{}")
        make(other / "meta.json")
    os.utime(path, (1, 1))  # the real store, the oldest of the folders
    changed = {**material, "data": {**material["data"], "max_len": 7}}
    assert store.closest(root, changed) == "data.max_len changed"  # read past the FIFO, the device, the giant
    for i in range(store.CLOSEST_STORES):
        (root / f"newer{i:02d}").mkdir()
    read: list[Path] = []
    real = storefiles.read_bounded
    monkeypatch.setattr(storefiles, "read_bounded", lambda p, limit: read.append(p) or real(p, limit))
    assert store.closest(root, changed) is None  # the real store is no longer among the newest 50
    assert len(read) == store.CLOSEST_STORES and path / "meta.json" not in read


def test_a_bounded_read_refuses_a_larger_file_without_reading_it(tmp_path):
    sparse = tmp_path / "big"
    sparse.write_bytes(b"")
    os.truncate(sparse, 2**31)
    with pytest.raises(OSError, match=r"has 2,147,483,648 bytes, more than the 1,000"):
        storefiles.read_bounded(sparse, 1000)
    (tmp_path / "small").write_bytes(b"0123456789")
    assert storefiles.read_bounded(tmp_path / "small", 10) == b"0123456789"


# --- 2. the lock ---------------------------------------------------------------------------------------


def hold(lock: Path, line: str = "pid 4242 on elsewhere since 2026-01-01 10:00:00\n") -> int:
    """The lock held as a stopped preparer holds it (another open file description, its line written)."""
    fd = os.open(lock, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, line.encode())
    return fd


def test_a_held_lock_says_who_holds_it_then_gives_up_after_the_timeout(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv(store.CACHE_ENV, raising=False)
    folder = corpus(tmp_path / "data", train=120)
    data = section(folder)
    from tfbuilder.data.readers import split_sources

    key = store.key_of(store.key_material(data, split_sources(data), "train"))
    root = folder / ".tfbuilder"
    root.mkdir()
    fd = hold(root / f"{key}.lock")
    monkeypatch.setenv(storelock.LOCK_TIMEOUT_ENV, "0.5")
    said: list[str] = []
    start = time.monotonic()
    try:
        with pytest.raises(DataError) as caught:
            prepare(data, say=said.append)
        assert time.monotonic() - start < 10
        message = str(caught.value)
        assert f"gave up waiting for the lock {root.resolve() / key}.lock" in message
        assert "no sign of life for 0.5 s" in message
        assert "held by pid 4242 on elsewhere since 2026-01-01 10:00:00" in message and "(fg)" in message
        assert [line for line in said if line.startswith("data: waiting for pid 4242 on elsewhere")], said
        sets = sum((["--set", o] for o in _recipe_sets(folder)), [])
        assert_refused(run_cli(["prepare", QUICKSTART, *sets], capsys), "gave up waiting", "pid 4242")
    finally:
        os.close(fd)
    assert not [p for p in root.iterdir() if store.TEMP_MARK in p.name]


def test_a_lock_released_while_waiting_is_taken_and_its_holder_is_written_into_it(tmp_path, monkeypatch):
    lock = tmp_path / "k.lock"
    fd = hold(lock)
    threading.Timer(0.3, lambda: os.close(fd)).start()
    said: list[str] = []
    with storelock.locked(lock, said.append):
        assert lock.read_text().startswith(f"pid {os.getpid()} on ") and len(said) == 1
    assert lock.read_text() == ""
    monkeypatch.setenv(storelock.LOCK_TIMEOUT_ENV, "soon")
    with pytest.raises(DataError, match=r"\$TFBUILDER_LOCK_TIMEOUT is 'soon'"):
        storelock.lock_timeout()
    monkeypatch.setenv(storelock.LOCK_TIMEOUT_ENV, "90")
    assert storelock.lock_timeout() == 90
    monkeypatch.delenv(storelock.LOCK_TIMEOUT_ENV)
    assert storelock.lock_timeout() == 30 * 60


def test_a_holder_that_renews_its_lock_is_waited_for_beyond_the_timeout(tmp_path, monkeypatch):
    """A preparer busy for longer than the timeout renews its lock: the waiter waits for it."""
    lock = tmp_path / "k.lock"
    monkeypatch.setattr(storelock, "LOCK_RENEW", 0.05)
    monkeypatch.setenv(storelock.LOCK_TIMEOUT_ENV, "0.4")
    held, release = threading.Event(), threading.Event()

    def busy() -> None:
        with storelock.locked(lock):
            held.set()
            release.wait(10)

    holder = threading.Thread(target=busy)
    holder.start()
    held.wait(10)
    threading.Timer(1.5, release.set).start()  # busy for almost four timeouts
    start = time.monotonic()
    said: list[str] = []
    try:
        with storelock.locked(lock, said.append):
            assert time.monotonic() - start > 1.2
    finally:
        release.set()
        holder.join()
    assert len(said) == 1 and said[0].startswith(f"data: waiting for pid {os.getpid()} on ")


@pytest.mark.parametrize("kind", ["folder", "fifo", "symlink", "hardlink"])
def test_a_lock_that_is_no_plain_file_of_its_own_is_refused_and_left_alone(tmp_path, kind):
    lock = tmp_path / "k.lock"
    mine = tmp_path / "mine.txt"
    mine.write_text("my notes\n")
    if kind == "folder":
        lock.mkdir()
        expect = "is a folder"
    elif kind == "fifo":
        os.mkfifo(lock)
        expect = "is a named pipe (FIFO)"
    elif kind == "symlink":
        lock.symlink_to(mine)
        expect = f"is a symbolic link (to {mine})"
    else:
        os.link(mine, lock)
        expect = "is a file with 2 names (a hard link)"
    with pytest.raises(DataError, match=r"k\.lock is .*not a lock file") as caught:
        with storelock.locked(lock):
            pass
    assert expect in str(caught.value)
    assert mine.read_text() == "my notes\n"


# --- 3. same-size damage to the token, offset and length files ---------------------------------------


def _poke(path: Path, offset: int, value: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(value)


STRUCTURE = {  # a change that keeps every size, and what the check says (stores without checksums)
    "idx_not_from_0": ("train.src.idx", 0, np.int64(3).tobytes(), "train.src.idx starts at 3, not 0"),
    "len_not_idx": ("val.src.len", 4, np.uint32(99).tobytes(), "val.src.len disagrees with val.src.idx"),
    "id_far_beyond": ("train.tgt.tok", 2, np.uint16(65535).tobytes(), "the token id 65,535, beyond"),
}


@pytest.mark.parametrize("case", [*STRUCTURE, "idx_decreasing", "idx_end", "id_at_vocab_size"])
def test_same_size_damage_to_a_store_without_checksums_is_found_and_prepared_again(damaged, case):
    folder, path, said = damaged
    without_checksums(path)
    assert again(folder, said)[1].startswith("data: using the prepared store")  # older stores still open
    if case == "idx_decreasing":  # by a single token
        offsets = np.fromfile(path / "train.src.idx", np.int64)
        _poke(path / "train.src.idx", 8 * 5, np.int64(offsets[4] - 1).tobytes())
        expect_prepared_again(folder, path, said, "train.src.idx decreases at example 5")
        return
    if case == "idx_end":  # the last example one token shorter, in its offsets and its length alike
        offsets, lengths = np.fromfile(path / "train.tgt.idx", np.int64), np.fromfile(path / "train.tgt.len", np.uint32)
        offsets[-1] -= 1
        lengths[-1] -= 1
        offsets.tofile(path / "train.tgt.idx")
        lengths.tofile(path / "train.tgt.len")
        end = f"train.tgt.idx ends at {offsets[-1]:,}, not at the {offsets[-1] + 1:,}"
        expect_prepared_again(folder, path, said, end)
        return
    if case == "id_at_vocab_size":  # the first id past the vocabulary
        size = json.loads((path / "meta.json").read_text())["vocab_size"]
        _poke(path / "val.src.tok", 0, np.uint16(size).tobytes())
        expect_prepared_again(folder, path, said, f"val.src.tok holds the token id {size:,}, beyond the {size:,}")
        return
    name, offset, value, expect = STRUCTURE[case]
    size = (path / name).stat().st_size
    _poke(path / name, offset % size, value)
    assert (path / name).stat().st_size == size
    expect_prepared_again(folder, path, said, expect)


def test_offsets_changed_after_the_store_was_opened_are_an_error_not_a_negative_read(made):
    folder, path, said = made
    train = prepare(section(folder)).splits["train"]
    assert len(train.src[4]) > 0
    _poke(path / "train.src.idx", 8 * 5, np.int64(1).tobytes())
    with pytest.raises(OSError, match=r"train\.src\.idx is damaged at example 4"):
        train.src[4]


def test_damage_only_a_checksum_finds_is_prepared_again(damaged):
    folder, path, said = damaged
    tok = path / "train.src.tok"
    ids = np.fromfile(tok, dtype=np.uint16)
    ids[[0, 1]] = ids[[1, 0]] if ids[0] != ids[1] else (ids[0], (ids[1] + 1) % 200)
    ids.tofile(tok)  # two ids swapped: offsets, lengths and the id range all still agree
    expect_prepared_again(folder, path, said, "train.src.tok is not what was written (its checksum differs)")


def test_checksums_are_recorded_at_prepare_time(made):
    folder, path, said = made
    sums = json.loads((path / "meta.json").read_text())[store.CHECKSUMS]
    files = sorted(p.name for p in path.iterdir() if p.name != "meta.json")
    assert sorted(sums) == files
    assert sums["train.src.tok"] == [(path / "train.src.tok").stat().st_size, storefiles.digest(path / "train.src.tok")]


def test_a_damaged_store_that_cannot_be_replaced_is_named(damaged, monkeypatch):
    folder, path, said = damaged
    _poke(path / "train.src.idx", 0, np.int64(3).tobytes())

    real = store.shutil.rmtree

    def refused(target, *args, **kwargs):
        if Path(target) != path:
            return real(target, *args, **kwargs)
        raise PermissionError(errno.EACCES, "Permission denied", str(target))

    monkeypatch.setattr(store.shutil, "rmtree", refused)
    with pytest.raises(DataError, match=rf"cannot replace the damaged prepared data in {path}: Permission denied"):
        prepare(section(folder), say=said.append)
    assert not [p for p in path.parent.iterdir() if store.TEMP_MARK in p.name]


# --- 4. meta.json of the wrong shape ----------------------------------------------------------------------

META = {
    "splits a number": (lambda m: m.update(splits=3), "splits is a number (3)"),
    "dtype a number": (lambda m: m.update(dtype=7), "dtype is a number (7)"),
    "examples as text": (lambda m: m["splits"]["train"].update(examples="120"), "splits.train.examples is text"),
    "a split named as a path": (lambda m: m["splits"].update({"../x": m["splits"]["val"]}), "a split named"),
    "sides a string": (lambda m: m["splits"]["val"].update(sides="src"), "splits.val.sides is text"),
    "not an object": (lambda m: m.clear() or m.update(x=1), "dtype is missing"),
    "checksums a list": (lambda m: m.update(checksums=[1]), "checksums is not an object"),
}


@pytest.mark.parametrize("case", list(META))
def test_a_meta_json_of_the_wrong_shape_is_damage(damaged, case):
    folder, path, said = damaged
    meta = json.loads((path / "meta.json").read_text())
    change, expect = META[case]
    change(meta)
    (path / "meta.json").write_text(json.dumps(meta))
    expect_prepared_again(folder, path, said, "meta.json", expect)


# --- 5. a store folder that is not one; a cache folder that cannot hold stores ----------------------------


def _recipe_sets(folder: Path, *more: str) -> list[str]:
    return ["data.type=parallel", f"data.path={folder}", "data.src_lang=de", "data.tgt_lang=en",
            "data.tokenizer.type=bpe", "data.tokenizer.vocab_size=280", "model.vocab_size=280", *more]  # fmt: skip


@pytest.mark.parametrize("kind", ["file", "symlink"])
def test_a_store_folder_that_is_a_file_or_a_link_is_refused_and_left_alone(made, capsys, tmp_path, kind):
    folder, path, said = made
    moved = tmp_path / "elsewhere"
    path.rename(moved)
    if kind == "file":
        path.write_text("mine\n")
        expect = "is a file, not a prepared store"
    else:
        path.symlink_to(moved)
        expect = f"is a symbolic link (to {moved}), not a prepared store"
    sets = sum((["--set", o] for o in _recipe_sets(folder)), [])
    assert_refused(run_cli(["prepare", QUICKSTART, *sets], capsys), str(path), expect)
    assert (path.read_text() == "mine\n") if kind == "file" else (path.readlink() == moved)
    assert (moved / "meta.json").is_file()


def test_a_cache_under_proc_is_refused_with_exit_2(made, capsys):
    folder, path, said = made
    sets = sum((["--set", o] for o in _recipe_sets(folder, "data.cache=/proc/self")), [])
    outcome = run_cli(["prepare", QUICKSTART, *sets], capsys)
    assert_refused(outcome, "/proc/")


# --- 6. tokenizer.json ------------------------------------------------------------------------------------


@pytest.mark.parametrize("content", ["{not json", '{"shared": {"type": "nothing"}}', "[]"])
@pytest.mark.parametrize("checksums", [True, False])
def test_a_damaged_tokenizer_json_is_prepared_again(damaged, content, checksums):
    folder, path, said = damaged
    if not checksums:
        without_checksums(path)
    (path / "tokenizer.json").write_text(content)
    expect = "tokenizer.json is not what was written" if checksums else "tokenizer.json: not a tfbuilder vocabulary"
    expect_prepared_again(folder, path, said, expect)


def test_a_tokenizer_json_changed_into_another_valid_one_is_found_by_its_checksum(damaged):
    folder, path, said = damaged
    vocab = path / "tokenizer.json"
    text = vocab.read_text()
    assert text.startswith('{"shared": "')
    vocab.write_text(text.replace('{"shared": "', '{"shared" :"', 1))  # the same vocabulary and size, other bytes
    expect_prepared_again(folder, path, said, "tokenizer.json is not what was written (its checksum differs)")


# --- 7. a full disk ---------------------------------------------------------------------------------------


def test_a_full_disk_while_preparing_is_named_and_nothing_else_is_lost(made, monkeypatch, capsys):
    folder, path, said = made
    root = path.parent
    before = {p.name: p.read_bytes() for p in path.iterdir()}

    def full(self, rows):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(store.SideWriter, "add", full)
    sets = sum((["--set", o] for o in _recipe_sets(folder, "data.max_len=9")), [])
    outcome = run_cli(["prepare", QUICKSTART, *sets], capsys)
    assert_refused(outcome, "the disk is full", str(root.resolve()), "data.cache")
    assert not [p for p in root.iterdir() if store.TEMP_MARK in p.name]
    assert {p.name: p.read_bytes() for p in path.iterdir()} == before
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == [path.name]
