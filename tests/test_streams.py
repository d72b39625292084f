"""Lines in batches: files fill batches, terminals and pipes never wait for lines not yet written."""

from __future__ import annotations

import io
import os
import threading
import time

import pytest

from tfbuilder import streams


def test_a_file_is_read_in_full_batches(tmp_path):
    path = tmp_path / "in.txt"
    path.write_bytes("a\nb\r\nc\u2028d\n\ne".encode())
    with open(path, "rb") as f:
        assert list(streams.batches(f, most=2)) == [["a", "b"], ["c\u2028d", ""], ["e"]]


def test_a_pipe_yields_each_line_as_it_arrives():
    read, write = os.pipe()
    got: list[tuple[float, list[str]]] = []

    def writer():
        with os.fdopen(write, "wb", buffering=0) as w:
            w.write(b"one\ntwo\n")  # both there at once: one batch
            time.sleep(0.5)
            w.write(b"thr")  # half a line: nothing to give yet
            time.sleep(0.3)
            w.write(b"ee\nfour")  # the last line has no newline

    thread = threading.Thread(target=writer)
    start = time.monotonic()
    thread.start()
    with os.fdopen(read, "rb", buffering=0) as r:
        for batch in streams.batches(r, most=100):
            got.append((time.monotonic() - start, batch))
    thread.join()
    # "four" ends with the input, which has come by the time "three" is complete: one batch.
    assert [batch for _, batch in got] == [["one", "two"], ["three", "four"]]
    assert got[0][0] < 0.4  # given before the writer's pause ended: nothing waited for more input


def test_a_pipe_batch_is_at_most_most_lines():
    read, write = os.pipe()
    os.write(write, b"".join(b"%d\n" % i for i in range(10)))
    os.close(write)
    with os.fdopen(read, "rb", buffering=0) as r:
        assert [len(b) for b in streams.batches(r, most=4)] == [4, 4, 2]


@pytest.mark.parametrize("kind", ["file", "pipe"])
def test_hostile_input_is_refused_not_buffered(tmp_path, kind, monkeypatch):
    monkeypatch.setattr(streams, "MAX_LINE_BYTES", 1000)
    for data, message in [(b"x" * 5000, "longer than 1,000 bytes"), (b"ok\n\xff\xfe\n", "not UTF-8")]:
        if kind == "file":
            path = tmp_path / "in.bin"
            path.write_bytes(data)
            source = open(path, "rb")
        else:
            read, write = os.pipe()
            threading.Thread(target=lambda w=write, d=data: (os.write(w, d), os.close(w))).start()
            source = os.fdopen(read, "rb", buffering=0)
        with source, pytest.raises(streams.NotText, match=message):
            list(streams.batches(source, most=10))


def test_an_in_memory_stream_is_read_like_a_file():
    assert list(streams.batches(io.BytesIO(b"x\ny\n"), most=5)) == [["x", "y"]]
