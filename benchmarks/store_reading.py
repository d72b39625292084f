"""Reading a prepared store: a memory map against positioned reads, by the resident memory they cost.

Writes a store-shaped split of ``--examples`` random examples (5 to 40 tokens per side, uint16 ids) to a
scratch folder, then, in a fresh process per way of reading, buckets it and collates ``--batches``
batches of 4,000 tokens, printing the process's resident memory (anonymous and file-backed, from
/proc/self/status) before and after, and the time per batch.

    python benchmarks/store_reading.py                       # 4.35 million examples (WMT14-sized)
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent

READ = r"""
import itertools, json, sys, time
from pathlib import Path
import numpy as np
from tfbuilder.data.batching import BucketBatchSampler
from tfbuilder.data.collate import Collate, lengths
from tfbuilder.data.tokens import Split, StoredTokens, TokenArray

def memory():
    out = {}
    for line in open("/proc/self/status"):
        key = line.split(":")[0]
        if key in ("RssAnon", "RssFile"):
            out[key] = int(line.split()[1]) / 1024
    return out

folder, n, batches, way = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
def side(name):
    if way == "pread":
        return StoredTokens(folder / name, np.uint16, n)
    return TokenArray(np.memmap(folder / f"{name}.tok", np.uint16, mode="r"), np.memmap(folder / f"{name}.idx", np.int64, mode="r"),
                      np.memmap(folder / f"{name}.len", np.uint32, mode="r"))
split = Split(side("src"), side("tgt"))
src, tgt, extra = lengths(split)
sampler = BucketBatchSampler(src, tgt, max_tokens=4000, extra=extra, seed=0, infinite=True)
sampler.epoch(0)
before = memory()
collate = Collate(split)
start = time.perf_counter()
for batch in itertools.islice(iter(sampler), batches):
    collate(batch)
seconds = (time.perf_counter() - start) / batches
print(json.dumps({"before": before, "after": memory(), "ms_per_batch": 1000 * seconds}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--examples", type=int, default=4_350_000)
    ap.add_argument("--batches", type=int, default=20)
    args = ap.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="tfbuilder-store-reading-"))
    try:
        rng = np.random.default_rng(0)
        for name in ("src", "tgt"):
            lens = rng.integers(5, 40, args.examples).astype(np.uint32)
            offsets = np.zeros(args.examples + 1, np.int64)
            np.cumsum(lens, out=offsets[1:])
            lens.tofile(folder / f"{name}.len")
            offsets.tofile(folder / f"{name}.idx")
            rng.integers(5, 8000, int(offsets[-1])).astype(np.uint16).tofile(folder / f"{name}.tok")
        print(f"command: python benchmarks/store_reading.py {' '.join(sys.argv[1:])}")
        print()
        print("| reading | examples | batches | RSS anon before -> after MB | RSS file before -> after MB | ms per batch |")
        print("|---|---:|---:|---:|---:|---:|")
        for way in ("mmap", "pread"):
            out = subprocess.run([sys.executable, "-c", READ, str(folder), str(args.examples), str(args.batches), way],
                                 capture_output=True, text=True, check=True, env={"PYTHONPATH": str(ROOT)}).stdout
            r = json.loads(out.splitlines()[-1])
            b, a = r["before"], r["after"]
            print(f"| {way} | {args.examples:,} | {args.batches} | {b['RssAnon']:,.0f} -> {a['RssAnon']:,.0f} | "
                  f"{b['RssFile']:,.0f} -> {a['RssFile']:,.0f} | {r['ms_per_batch']:.1f} |")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
