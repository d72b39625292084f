"""Reading Parquet files and Hugging Face datasets in record batches: memory stays flat as the corpus grows.

Builds WMT-style rows ({"translation": {"de": ..., "en": ...}}) from Multi30k's training pairs replicated
N times (each copy's lines tagged with its number), written as Parquet (row groups of 29,000 rows, and
one file written with pyarrow's default row groups of 1,048,576 rows) and as a ``DatasetDict.save_to_disk``
folder, into a scratch folder that is removed afterwards. For each, a fresh process streams every row of
the training split through tfbuilder's reader (``split_sources(data)["train"].rows()``, what ``prepare``
reads; no tokenization) and reports rows/s and the growth of its resident memory over the state after
imports and opening the split: anonymous memory (the process's own) and file pages (a memory-mapped
dataset's pages, shared with every process through the page cache). For contrast, reading the whole
Parquet table at once (``pyarrow.parquet.read_table``) is measured the same way.

    python benchmarks/arrow_reading.py --data ../shared/data/multi30k                # 1x 30x 150x
    python benchmarks/arrow_reading.py --data ../shared/data/multi30k --sizes 1 10
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tfbuilder.data import text  # noqa: E402

READ = r"""
import json, sys, threading, time
from tfbuilder.spec.sections import DataSection
from tfbuilder.data.readers import split_sources

def status():
    fields = dict(line.split(":", 1) for line in open("/proc/self/status"))
    return int(fields["RssAnon"].split()[0]) // 1024, int(fields["RssFile"].split()[0]) // 1024

import pyarrow.parquet as pq  # imported before the baseline, as after any first read
fmt, path, how = sys.argv[1], sys.argv[2], sys.argv[3]
data = DataSection(type="parallel", path=path, format=fmt, columns={"source": "translation.de", "target": "translation.en"},
                   tokenizer={"type": "bpe", "vocab_size": 1000})
if how == "stream":
    source = split_sources(data)["train"]
base = status()
peak = list(base)
done = threading.Event()

def sample():
    while not done.is_set():
        anon, file = status()
        peak[0], peak[1] = max(peak[0], anon), max(peak[1], file)
        time.sleep(0.01)

threading.Thread(target=sample, daemon=True).start()
start = time.perf_counter()
if how == "stream":
    rows = sum(1 for _ in source.rows())
else:
    rows = pq.read_table(path + "/train.parquet", columns=["translation"]).num_rows
seconds = time.perf_counter() - start
done.set()
anon, file = status()
peak = [max(peak[0], anon), max(peak[1], file)]
print("RESULT " + json.dumps({"rows": rows, "seconds": seconds, "anon": [base[0], peak[0]], "file": [base[1], peak[1]]}))
"""


def build(source: Path, out: Path, copies: int) -> dict[str, Path]:
    """Parquet (two row-group sizes) and a save_to_disk folder of ``copies`` x the training pairs."""
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    de, en = text.read_lines(source / "train.de.gz"), text.read_lines(source / "train.en.gz")
    small, default, saved = out / "parquet-29k", out / "parquet-1m", out / "datasets"
    for folder in (small, default):
        folder.mkdir(parents=True)
    val = pa.Table.from_pylist([{"translation": {"de": s, "en": t}} for s, t in zip(de[:1000], en[:1000])])
    schema = val.schema
    with pq.ParquetWriter(small / "train.parquet", schema) as writer:
        for k in range(copies):
            tag = f" {k}" if k else ""
            writer.write_table(pa.Table.from_pylist([{"translation": {"de": s + tag, "en": t + tag}} for s, t in zip(de, en)], schema=schema))
    for folder in (small, default):
        pq.write_table(val, folder / "val.parquet")
    pq.write_table(pq.read_table(small / "train.parquet"), default / "train.parquet")  # pyarrow's default row groups
    cache = out / "hf-cache"
    splits = {name: datasets.Dataset.from_parquet(str(small / f"{name}.parquet"), cache_dir=str(cache)) for name in ("train", "val")}
    datasets.DatasetDict(splits).save_to_disk(str(saved))
    shutil.rmtree(cache)
    return {"parquet (row groups of 29,000)": small, "parquet (row groups of 1,048,576)": default, "datasets (save_to_disk)": saved}


def measure(fmt: str, path: Path, how: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", READ, fmt, str(path), how], capture_output=True, text=True, env=env, check=True)
    line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "multi30k"), help="the Multi30k folder")
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 30, 150], help="copies of the training pairs")
    args = ap.parse_args()
    print(f"$ python benchmarks/arrow_reading.py --data {args.data} --sizes {' '.join(map(str, args.sizes))}\n")
    print("| corpus | train rows | source | reading | rows/s | anon MB before -> peak | file MB before -> peak |")
    print("|---|---:|---|---|---:|---:|---:|")
    for copies in args.sizes:
        with tempfile.TemporaryDirectory(prefix="arrow-reading-") as scratch:
            built = build(Path(args.data), Path(scratch), copies)
            for name, path in built.items():
                fmt = "datasets" if name.startswith("datasets") else "parquet"
                hows = ["stream", "whole table"] if name.startswith("parquet (row groups of 29") else ["stream"]
                for how in hows:
                    r = measure(fmt, path, "stream" if how == "stream" else "whole")
                    reading = "tfbuilder's reader" if how == "stream" else "read_table (contrast)"
                    print(
                        f"| {copies}x | {r['rows']:,} | {name} | {reading} | {r['rows'] / r['seconds']:,.0f} | "
                        f"{r['anon'][0]:,} -> {r['anon'][1]:,} | {r['file'][0]:,} -> {r['file'][1]:,} |",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
