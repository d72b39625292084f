"""Lines in batches: files fill batches, terminals and pipes never wait for lines not yet written."""

from __future__ import annotations

import io
import os
import select
import threading

import pytest

from tfbuilder import streams


def test_a_file_is_read_in_full_batches(tmp_path):
    path = tmp_path / "in.txt"
    path.write_bytes("a\nb\r\nc\u2028d\n\ne".encode())
    with open(path, "rb") as f:
        assert list(streams.batches(f, most=2)) == [["a", "b"], ["c\u2028d", ""], ["e"]]


def test_a_pipe_yields_each_line_as_it_arrives():
    """Each batch is asked for while the writer holds the pipe open with nothing more to say: a
    reader that waited for more input would only answer once the watchdog writes "late" and closes."""
    read, write = os.pipe()
    with os.fdopen(read, "rb", buffering=0) as r, os.fdopen(write, "wb", buffering=0) as w:
        lines = streams.batches(r, most=100)

        def next_batch() -> list[str]:
            answered = threading.Event()

            def watchdog():  # a hang guard only: it ends the input when the reader would wait forever
                if not answered.wait(30):
                    w.write(b"late\n")
                    w.close()

            guard = threading.Thread(target=watchdog)
            guard.start()
            try:
                return next(lines)
            finally:
                answered.set()
                guard.join()

        w.write(b"one\ntwo\n")  # both there at once: one batch
        assert next_batch() == ["one", "two"]
        w.write(b"thr")  # half a line: nothing to give yet ...
        finish = threading.Thread(target=lambda: (_drained(read), w.write(b"ee\n")))
        finish.start()  # ... until the reader has taken it and the rest of the line comes
        assert next_batch() == ["three"]
        finish.join()
        w.write(b"four")  # the last line has no newline: it ends with the input
        w.close()
        assert list(lines) == [["four"]]


def _drained(fd: int) -> None:
    """Wait until everything written to the pipe ``fd`` reads from has been read."""
    while select.select([fd], [], [], 0)[0]:
        threading.Event().wait(0.01)


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
