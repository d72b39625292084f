"""Data at scale: prepare once, then train in constant memory, whatever the corpus size.

Builds Multi30k-shaped corpora of several sizes (the real training pairs replicated, every copy after the
first perturbed: two words of each line swapped, the same two in source and target order), generated on
the fly into a scratch folder and never kept, and measures per size:

- ``prepare``: seconds, MB/s of raw text (all of it, and the encoding alone after tokenizer training),
  peak RSS of the process, size of the store on disk;
- HF tokenizers' own ``encode_batch`` throughput on the same text, same cores (the bound on encoding);
- ``fit`` of recipes/multi30k/vanilla-small.yaml for ``--steps`` steps with the store prepared:
  start-up (process start to the first finished step), peak RSS of the training process, and the peak
  summed PSS of the process and its DataLoader workers (shared pages counted once), with
  ``data.workers`` 0 and 2;
- the loader alone (batches/s, ``data.workers: 0``) against the training step rate.

    python benchmarks/data_scale.py --data ../shared/data/multi30k                 # 1x 10x 30x 150x
    python benchmarks/data_scale.py --data ../shared/data/multi30k --sizes 1 10     # quicker
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# recipes/multi30k/vanilla-small.yaml reads Multi30k from the Hub; these overrides read a folder of its text files.
TEXT_FOLDER = [
    "data.format=text", "data.hub=null", "data.columns=null", "data.src_lang=de", "data.tgt_lang=en",
    "data.splits.val=val", "data.splits.test=test_2016_flickr",
]
sys.path.insert(0, str(ROOT))

from tfbuilder.data import text  # noqa: E402

FIT = r"""
import json, sys, time
t0 = float(sys.argv[1])
import tfbuilder
from tfbuilder.train.fit import fit
stamps = []
recipe = tfbuilder.load_recipe(sys.argv[2], json.loads(sys.argv[3]))
fit(recipe, on_step=lambda step, total: stamps.append(time.time()))
gaps = [b - a for a, b in zip(stamps[1:], stamps[2:])]
print("RESULT " + json.dumps({"first_step": stamps[0] - t0, "step": sorted(gaps)[len(gaps) // 2]}))
"""

LOADER = r"""
import json, sys, time, itertools
import tfbuilder
from tfbuilder.data.prepare import prepare
from tfbuilder.data.datamodule import DataModule
recipe = tfbuilder.load_recipe(sys.argv[1], json.loads(sys.argv[2]))
module = DataModule(prepare(recipe.data, say=lambda line: None), recipe.data, seed=0)
it = iter(module.train_dataloader())
next(it)
start = time.perf_counter()
n = 200
for _ in itertools.islice(it, n):
    pass
print("RESULT " + json.dumps({"batches_per_s": n / (time.perf_counter() - start)}))
"""

ENCODE = r"""
import json, sys, time
from tfbuilder.data.prepare import Vocab
vocab = Vocab.from_json(open(sys.argv[1], encoding="utf-8").read())
lines = open(sys.argv[2], encoding="utf-8").read().split("\n")[:400000]
size = sum(len(l.encode()) + 1 for l in lines)
start = time.perf_counter()
for i in range(0, len(lines), 8192):
    vocab.src.encode_batch(lines[i:i + 8192])
print("RESULT " + json.dumps({"mb_per_s": size / 2**20 / (time.perf_counter() - start)}))
"""


def make_corpus(source: Path, out: Path, copies: int, seed: int = 0) -> int:
    """``copies`` x Multi30k's training pairs (perturbed) plus its val/test; returns raw bytes of train."""
    out.mkdir(parents=True)
    de = text.read_lines(source / "train.de.gz")
    en = text.read_lines(source / "train.en.gz")
    rng = random.Random(seed)
    size = 0
    with open(out / "train.de", "w", encoding="utf-8") as fd, open(out / "train.en", "w", encoding="utf-8") as fe:
        for copy in range(copies):
            for s, t in zip(de, en):
                if copy:
                    s, t = swap(s, rng), swap(t, rng)
                fd.write(s + "\n")
                fe.write(t + "\n")
        size = fd.tell() + fe.tell()
    for split in ("val", "test_2016_flickr"):
        for lang in ("de", "en"):
            (out / f"{split}.{lang}").write_text("\n".join(text.read_lines(source / f"{split}.{lang}.gz")) + "\n", encoding="utf-8")
    return size


def swap(line: str, rng: random.Random) -> str:
    words = line.split()
    if len(words) > 2:
        i, j = rng.randrange(len(words)), rng.randrange(len(words))
        words[i], words[j] = words[j], words[i]
    return " ".join(words)


def tree(pid: int) -> list[int]:
    """``pid`` and its descendants (from /proc)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except OSError:
            pass
    return out


def memory(pid: int) -> tuple[int, int]:
    """(RSS of ``pid``, summed PSS of ``pid`` and its descendants), bytes."""
    rss = pss = 0
    for p in tree(pid):
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Rss:") and p == pid:
                        rss = int(line.split()[1]) * 1024
                    elif line.startswith("Pss:"):
                        pss += int(line.split()[1]) * 1024
        except OSError:
            pass
    return rss, pss


def run(args: list[str], env: dict) -> tuple[dict, float, int, int]:
    """Run a command, sampling its memory; (its RESULT json, seconds, peak RSS, peak tree PSS)."""
    start = time.time()
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    peaks = [0, 0]

    def sample():
        while proc.poll() is None:
            rss, pss = memory(proc.pid)
            peaks[0], peaks[1] = max(peaks[0], rss), max(peaks[1], pss)
            time.sleep(0.05)

    watcher = threading.Thread(target=sample, daemon=True)
    watcher.start()
    out, err = proc.communicate()
    watcher.join()
    seconds = time.time() - start
    if proc.returncode != 0:
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(args[:4])}...\n{err[-3000:]}")
    result = next((json.loads(line[7:]) for line in out.splitlines() if line.startswith("RESULT ")), {})
    return result, seconds, peaks[0], peaks[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "multi30k"), help="the Multi30k folder")
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 10, 30, 150], help="copies of the training pairs")
    ap.add_argument("--steps", type=int, default=20, help="training steps per fit")
    ap.add_argument("--scratch", default=None, help="where corpora and runs go (default: a temporary folder, removed); "
                    "given, corpora and their stores are kept and reused")
    args = ap.parse_args()
    scratch = Path(args.scratch or tempfile.mkdtemp(prefix="tfbuilder-data-scale-"))
    recipe = str(ROOT / "recipes" / "multi30k" / "vanilla-small.yaml")  # it reads the Hub; TEXT_FOLDER: a folder
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("TFBUILDER_CACHE", None)
    rows = []
    try:
        for copies in args.sizes:
            folder = scratch / f"x{copies}"
            if folder.exists():  # kept from an earlier run (--scratch): the same corpus, prepared again below
                raw = (folder / "train.de").stat().st_size + (folder / "train.en").stat().st_size
                shutil.rmtree(folder / ".tfbuilder", ignore_errors=True)
            else:
                raw = make_corpus(Path(args.data), folder, copies)
            base = [*TEXT_FOLDER, f"data.path={folder}", "data.splits.test=test_2016_flickr", "data.splits.train=train"]
            prepared, seconds, rss, _ = run(
                [sys.executable, "-m", "tfbuilder", "prepare", recipe, *sum((["--set", o] for o in base), [])], env
            )
            store_dir = next(p for p in (folder / ".tfbuilder").iterdir() if p.is_dir())
            meta = json.loads((store_dir / "meta.json").read_text())
            disk = sum(f.stat().st_size for f in store_dir.iterdir())
            encode_mb = raw / 2**20 / max(meta["seconds"] - meta["seconds_tokenizer"], 1e-9)
            hf, _, _, _ = run([sys.executable, "-c", ENCODE, str(store_dir / "tokenizer.json"), str(folder / "train.de")], env)
            row = {
                "copies": copies, "pairs": meta["splits"]["train"]["rows"], "raw_mb": raw / 2**20,
                "prepare_s": seconds, "prepare_mb_s": raw / 2**20 / seconds, "encode_mb_s": encode_mb,
                "hf_encode_mb_s": hf["mb_per_s"], "prepare_rss_mb": rss / 2**20, "store_mb": disk / 2**20,
            }
            for workers in (0, 2):
                overrides = base + [f"trainer.max_steps={args.steps}", f"trainer.val_every={10 * args.steps}", "trainer.progress=false",
                                    f"trainer.output={scratch / 'runs'}", f"data.workers={workers}", "trainer.max_minutes=null"]
                fitted, _, rss, pss = run([sys.executable, "-c", FIT, str(time.time()), recipe, json.dumps(overrides)], env)
                row[f"w{workers}"] = {"startup_s": fitted["first_step"], "step_s": fitted["step"], "rss_mb": rss / 2**20, "pss_mb": pss / 2**20}
            loader, _, _, _ = run([sys.executable, "-c", LOADER, recipe, json.dumps(base + ["data.workers=0"])], env)
            row["loader_batches_s"] = loader["batches_per_s"]
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
            if args.scratch is None:
                shutil.rmtree(folder)  # the next size needs the disk
    finally:
        if args.scratch is None:
            shutil.rmtree(scratch, ignore_errors=True)
    print(f"command: python benchmarks/data_scale.py {' '.join(sys.argv[1:])}")
    print(f"machine: {os.cpu_count()} CPU cores; torch threads as tfbuilder picks them")
    print()
    print("| corpus | train pairs | raw text MB | prepare s | prepare MB/s | encode MB/s | HF encode_batch MB/s | prepare peak RSS MB | store MB |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['copies']}x | {r['pairs']:,} | {r['raw_mb']:,.0f} | {r['prepare_s']:.1f} | {r['prepare_mb_s']:.2f} | {r['encode_mb_s']:.2f} | "
              f"{r['hf_encode_mb_s']:.2f} | {r['prepare_rss_mb']:,.0f} | {r['store_mb']:,.0f} |")
    print()
    print("| corpus | workers | fit start-up s | peak RSS MB | peak PSS MB (with workers) | step s | loader batches/s | loader / step rate |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        for w in (0, 2):
            f = r[f"w{w}"]
            print(f"| {r['copies']}x | {w} | {f['startup_s']:.1f} | {f['rss_mb']:,.0f} | {f['pss_mb']:,.0f} | {f['step_s']:.3f} | "
                  f"{r['loader_batches_s']:.0f} | {r['loader_batches_s'] * f['step_s']:.0f}x |")


if __name__ == "__main__":
    main()
