"""One GPU check of tfbuilder: every measurement of docs/gpu.md ("Measuring on a GPU") in one call, on one
H100/H200, written to one folder as a markdown table and JSON. All parts take about 14 minutes, more than
one 10-minute call of a lent machine allows: run them as two calls (``--parts``, see FIRST and SECOND).

    python benchmarks/gpu_check.py --out DIR --parts first    # on a CUDA GPU: the steps and the profile
    python benchmarks/gpu_check.py --out DIR --parts second   # fit, ddp, fsdp, decoding
    python benchmarks/gpu_check.py --out DIR --dry-run   # tiny shapes on the CPU (about a minute)

Parts, each in a subprocess of its own with its own time budget (a part that runs past it is cut and
reported as "timed out after N s", one that crashes as "failed: <its last lines>", and the next part
runs; ``DIR/gpu_check.md`` and ``DIR/gpu_check.json`` are rewritten before and after every part, so a
run that is itself cut off still leaves what it measured):

- ``env``: versions, the device;
- ``peak``: the bf16 matrix-multiply peak of this card in this run (8192^3 products, CUDA events, median);
- ``pytest``: ``pytest -m gpu`` over the test files that mark tests ``gpu``: passed/failed/skipped;
- ``train-base``: one training step (forward, label-smoothed loss, backward, fused Adam; bf16 autocast)
  of the paper's base model (recipes/vanilla.yaml, batch 256 x 64 tokens, 32k vocabulary), tfbuilder
  eager and compiled, against ``torch.nn.Transformer`` with embeddings, tied output projection and
  label-smoothed cross-entropy, eager and compiled;
- ``train-gpt2``: the same for GPT-2 small (recipes/architectures/gpt2-small.yaml, batch 16 x 1024)
  against a minimal GPT written below;
- ``fit``: ``tfbuilder.fit`` of recipes/multi30k/vanilla-small.yaml with bf16-mixed and
  ``trainer.compile`` for a fixed number of steps, its steps/s against the bare compiled step of the
  same model (a fixed batch of the recipe's ``max_tokens``); ``fit-ddp`` and ``fit-fsdp``: the same
  under ``trainer.strategy: ddp`` / ``fsdp`` on one device;
- ``decode``: greedy and beam-4 translation of the Multi30k test set (test_2016_flickr), tokens/s, with
  the weights of the ``fit`` part's run (only a few hundred steps: the speed is what counts here);
- ``profile``: ``torch.profiler``'s top 10 operators by GPU time of the compiled paper-base step.

FLOPs of a training step are counted analytically, the same for every implementation of a shape:

    FLOPs = 6 * sum over weight matrices (parameters of the matrix * tokens it multiplies)
          + 12 * sum over attention layers (batch * query positions * key positions * heads * head size)

that is 2 FLOPs per multiply-add, times 3 for forward + backward (PaLM, Chowdhery et al. 2022, app. B).
Embedding look-ups, norms, biases and softmax are not counted; the tied output projection is (a matrix of
vocabulary x d_model over the target tokens); causal attention is counted in full (as PaLM counts it).
The encoder's matrices multiply source tokens, the decoder's target tokens, the cross-attention's key and
value projections source tokens. The share of the peak is FLOPs / step time / the ``peak`` part's figure.

Multi30k is read from ``$MULTI30K_DIR``, else ``.gpu-data/multi30k`` (benchmarks/gpu_prepare.sh copies
it there so it travels to the GPU machine), else ``../shared/data/multi30k``; without it the parts that
need it are skipped, saying so. ``--budget PART=SECONDS`` changes a part's budget, ``--total`` the run's.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gzip
import json
import math
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# recipes/multi30k/vanilla-small.yaml reads Multi30k from the Hub; these overrides read a folder of its text files.
TEXT_FOLDER = [
    "data.format=text", "data.hub=null", "data.columns=null", "data.src_lang=de", "data.tgt_lang=en",
    "data.splits.val=val", "data.splits.test=test_2016_flickr",
]
# The parts in the order they run: (name, what it measures, budget in seconds on a GPU, in a dry run).
# The GPU budgets are what each part took on an H200 (torch 2.11) with room: every compiled variant spends about
# 40 s compiling. They add up to about 14 minutes; `first` and `second` split them into two calls under 9 minutes. A dry run's budgets only stop a part that
# hangs: its CPU work is about a minute and a half in all, but a shared machine may stretch it many times over.
PARTS = [
    ("env", "versions and device", 30, 120),
    ("peak", "bf16 matmul peak", 30, 120),
    ("pytest", "pytest -m gpu", 45, 150),
    ("train-base", "paper-base step: tfbuilder vs nn.Transformer", 150, 150),
    ("train-gpt2", "GPT-2-small step: tfbuilder vs minimal GPT", 150, 150),
    ("fit", "tfbuilder fit, bf16 + compile, vs the bare step", 150, 150),
    ("fit-ddp", "the same fit, strategy ddp, one device", 100, 150),
    ("fit-fsdp", "the same fit, strategy fsdp, one device", 100, 150),
    ("decode", "greedy and beam-4 over the Multi30k test set", 90, 150),
    ("profile", "torch.profiler top 10 of the compiled paper-base step", 75, 150),
]
# Two calls of a lent machine (each at most 10 minutes): --parts first, then --parts second.
GROUPS = {
    "first": "env,peak,pytest,train-base,train-gpt2,profile",
    "second": "env,fit,fit-ddp,fit-fsdp,decode",
}
TOTAL = {"gpu": 540, "dry": 1200}
STATE_ENV = "GPU_CHECK_STATE"  # the parent's JSON, read by parts that use an earlier part's result


# ---------------------------------------------------------------------------------------------------
# The parent: runs each part in a subprocess, with its budget, and writes the table after each.


def multi30k_dir() -> Path | None:
    """Where Multi30k lies (the folder with test_2016_flickr.de.gz), or None."""
    candidates = [
        os.environ.get("MULTI30K_DIR"),
        ROOT / ".gpu-data" / "multi30k",
        ROOT.parent / "shared" / "data" / "multi30k",
    ]
    for c in candidates:
        if c and (Path(c) / "test_2016_flickr.de.gz").is_file():
            return Path(c).resolve()
    return None


def children_cpu() -> float:
    """CPU seconds (user + system) of the finished child processes so far."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def last_lines(text: str, n: int = 6) -> str:
    lines = [line.rstrip() for line in text.splitlines() if line.strip()]
    return " / ".join(lines[-n:])[-900:]


class Run:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.out = Path(args.out).resolve()
        self.out.mkdir(parents=True, exist_ok=True)
        self.scratch = Path(tempfile.mkdtemp(prefix="gpu_check-"))
        mode = "dry" if args.dry_run else "gpu"
        chosen = GROUPS.get(args.parts, args.parts).split(",") if args.parts else [p[0] for p in PARTS]
        unknown = sorted(set(chosen) - {p[0] for p in PARTS})
        if unknown:
            raise SystemExit(f"unknown parts: {', '.join(unknown)} (parts: {', '.join(p[0] for p in PARTS)})")
        budgets = {}
        for item in args.budget:
            name, _, seconds = item.partition("=")
            budgets[name] = float(seconds)
        self.total = args.total if args.total is not None else TOTAL[mode]
        self.state = {
            "command": "python benchmarks/gpu_check.py " + " ".join(sys.argv[1:]),
            "dry_run": args.dry_run,
            "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "total_budget_s": self.total,
            "multi30k": str(multi30k_dir()) if multi30k_dir() else None,
            "parts": {},
        }
        for name, title, gpu, dry in PARTS:
            if name in chosen:
                budget = budgets.get(name, dry if args.dry_run else gpu)
                self.state["parts"][name] = {"title": title, "status": "pending", "budget_s": budget}
        self.log = open(self.out / "gpu_check.log", "a")  # noqa: SIM115 (open for the run's length)
        self.env = dict(os.environ)
        self.env["PYTHONUNBUFFERED"] = "1"
        if args.dry_run:  # one thread a process: on a busy CPU, threads that wait for each other spin
            self.env["OMP_NUM_THREADS"] = "1"
        self.env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(self.scratch / "inductor"))  # parts share compiled kernels
        self.env["PYTHONPATH"] = os.pathsep.join(p for p in [self.env.get("PYTHONPATH"), str(ROOT)] if p)
        self.env[STATE_ENV] = str(self.out / "gpu_check.json")
        if self.state["multi30k"]:
            self.env["MULTI30K_DIR"] = self.state["multi30k"]

    def write(self) -> None:
        write_atomic(self.out / "gpu_check.json", json.dumps(self.state, indent=2, default=str) + "\n")
        write_atomic(self.out / "gpu_check.md", render(self.state))

    def run(self) -> int:
        start, cpu = time.monotonic(), children_cpu()
        self.write()
        print(f"# {self.state['command']}  (scratch {self.scratch})", flush=True)
        for name, part in self.state["parts"].items():
            left = self.total - (time.monotonic() - start)
            budget = min(part["budget_s"], left)
            if budget < min(5.0, part["budget_s"]):
                part.update(status="skipped", reason=f"the run's total budget ({self.total:g} s) was spent")
                self.write()
                continue
            part.update(status="running", budget_s=round(budget, 1))
            self.write()
            self.run_part(name, part, budget)
            self.write()
            print(
                f"{name:<11} {part['status']:<10} {part.get('seconds', 0):6.1f} s  {summary(name, part, self.state)}",
                flush=True,
            )
        self.state["seconds"] = round(time.monotonic() - start, 1)
        self.state["cpu_s"] = round(children_cpu() - cpu, 1)
        self.write()
        self.log.close()
        print(render(self.state), flush=True)
        if not self.args.keep:
            import shutil

            shutil.rmtree(self.scratch, ignore_errors=True)
        return 0

    def run_part(self, name: str, part: dict, budget: float) -> None:
        result = self.scratch / f"{name}.json"
        output = self.scratch / f"{name}.log"
        cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--part",
            name,
            "--result",
            str(result),
            "--scratch",
            str(self.scratch),
        ]
        if self.args.dry_run:
            cmd.append("--dry-run")
        began, cpu = time.monotonic(), children_cpu()
        with open(output, "w") as sink:
            proc = subprocess.Popen(
                cmd, cwd=ROOT, env=self.env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
            )
            try:
                rc = proc.wait(timeout=budget)
            except subprocess.TimeoutExpired:
                rc = None
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)  # the part and whatever it started (compile workers, pytest)
                proc.wait()
        part["seconds"] = round(time.monotonic() - began, 1)
        part["cpu_s"] = round(children_cpu() - cpu, 1)
        text = output.read_text(errors="replace")
        self.log.write(f"\n===== {name} ({part['seconds']} s, budget {budget:.0f} s) =====\n{text}")
        self.log.flush()
        found = {}
        if result.is_file():
            with contextlib.suppress(ValueError):
                found = json.loads(result.read_text())
        status = found.pop("status", None)
        reason = found.pop("reason", None)
        part["result"] = found
        if rc is None:
            part.update(status="timed out", reason=f"timed out after {budget:g} s" + (f"; {reason}" if reason else ""))
        elif rc != 0 or status not in ("ok", "skipped", "failed"):
            part.update(status="failed", reason=f"failed (exit {rc}): {last_lines(text)}")
        else:
            part["status"] = status
            if reason:
                part["reason"] = reason


# ---------------------------------------------------------------------------------------------------
# The table.


def fmt(x, spec: str = ",.0f", none: str = "-") -> str:
    return none if x is None else format(x, spec)


def peak_tflops(state: dict) -> float | None:
    return ((state["parts"].get("peak") or {}).get("result") or {}).get("tflops")


def summary(name: str, part: dict, state: dict) -> str:
    """One cell: what the part found, or why it has nothing."""
    r = part.get("result") or {}
    why = part.get("reason", "")
    if part["status"] in ("pending", "running"):
        return part["status"]
    text = ""
    if name == "env" and r:
        text = f"{r.get('device')}; torch {r.get('torch')}, CUDA {r.get('cuda')}, Python {r.get('python')}"
    elif name == "peak" and r.get("tflops"):
        text = f"{r['tflops']:.4g} TFLOP/s {r['dtype']} ({r['size']}^3, median of {r['repeats']})"
    elif name == "pytest" and "passed" in r:
        text = (
            f"{r['passed']} passed, {r['failed']} failed, {r['errors']} errors, {r['skipped']} skipped ({r['files']})"
        )
    elif name.startswith("train") and r.get("rows"):
        best = max(r["rows"], key=lambda row: row.get("tokens_per_s") or 0)
        text = f"{len(r['rows'])} variants measured; fastest {best['implementation']} {fmt(best.get('tokens_per_s'))} tok/s"
    elif name.startswith("fit") and r.get("steps_done") is not None:
        text = f"{r['steps_done']} steps, {fmt(r.get('steps_per_s'), '.1f')} steps/s"
        if r.get("bare_steps_per_s"):
            text += f" vs bare step {r['bare_steps_per_s']:.1f}/s"
    elif name == "decode" and r.get("rows"):
        text = "; ".join(f"{row['search']} {fmt(row['tokens_per_s'])} tok/s" for row in r["rows"])
    elif name == "profile" and r.get("top"):
        text = f"top: {r['top'][0]['name'][:50]} ({r['top'][0]['share']:.0%})"
    return "; ".join(t for t in (text, why) if t).replace("|", "\\|")


def render(state: dict) -> str:
    parts = state["parts"]
    env = (parts.get("env") or {}).get("result") or {}
    peak = peak_tflops(state)
    lines = ["# tfbuilder GPU check", ""]
    lines.append(f"`{state['command']}`, started {state['started']}")
    if env:
        lines.append(
            f"on {env.get('device')} (torch {env.get('torch')}, CUDA {env.get('cuda')}, lightning {env.get('lightning')}, Python {env.get('python')}, commit {env.get('commit')})."
        )
    if state["dry_run"]:
        lines += [
            "",
            "**Dry run**: tiny shapes on the CPU, to check that every part runs; its numbers say nothing about speed.",
        ]
    if "seconds" in state:
        lines.append(
            f"\nThe run took {state['seconds']} s of its {state['total_budget_s']:g} s budget ({state.get('cpu_s')} s of CPU in its parts)."
        )
    lines += [
        "",
        "## Parts",
        "",
        "| part | what | status | seconds | CPU s | budget s | result |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, part in parts.items():
        lines.append(
            f"| {name} | {part['title']} | {part['status']} | {part.get('seconds', '')} | {part.get('cpu_s', '')} | {part['budget_s']:g} | {summary(name, part, state)} |"
        )

    train = [
        (name, row)
        for name in ("train-base", "train-gpt2")
        for row in ((parts.get(name) or {}).get("result") or {}).get("rows", [])
    ]
    if train:
        lines += ["", "## Training step throughput", ""]
        lines.append(
            "A step: forward, label-smoothed cross-entropy, backward, fused Adam, bf16 autocast (float32 in a dry run); "
            "median of the timed steps. Share of peak: analytic FLOPs (see benchmarks/gpu_check.py) over the step time "
            f"over the `peak` part's {fmt(peak, '.4g')} TFLOP/s. Memory: `torch.cuda.max_memory_allocated` during the "
            "variant's steps, less what the other variants held."
        )
        lines += [
            "",
            "| workload | implementation | target tok/s | step ms | TFLOP/s | share of peak | peak mem GiB | warm-up s |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for name, row in train:
            r = parts[name]["result"]
            share = row["tflops"] / peak if peak and row.get("tflops") else None
            lines.append(
                f"| {r.get('workload')} | {row['implementation']} | {fmt(row.get('tokens_per_s'))} | {fmt(row.get('step_ms'), '.2f')} | "
                f"{fmt(row.get('tflops'), '.3g')} | {fmt(share, '.1%')} | {fmt(row.get('peak_gib'), '.2f')} | {fmt(row.get('warmup_s'), '.1f')} |"
            )
        for name in ("train-base", "train-gpt2"):
            r = (parts.get(name) or {}).get("result") or {}
            if r.get("shape"):
                lines.append(
                    f"\n{r['workload']}: {r['shape']}; {fmt(r.get('flops_per_step'), '.3e')} FLOPs a step; loss: {r.get('loss')}."
                )

    fits = [(name, (parts.get(name) or {})) for name in ("fit", "fit-ddp", "fit-fsdp") if name in parts]
    if fits:
        lines += ["", "## tfbuilder fit (recipes/multi30k/vanilla-small.yaml)", ""]
        lines += [
            "| run | status | steps | steps/s (median step) | sustained steps/s | bare step steps/s | fit / bare | train tok/s | peak mem MB |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        bare = ((parts.get("fit") or {}).get("result") or {}).get("bare_steps_per_s")
        for name, part in fits:
            r = part.get("result") or {}
            ratio = r["steps_per_s"] / bare if bare and r.get("steps_per_s") else None
            status = part["status"] + (f": {part['reason']}" if part.get("reason") else "")
            lines.append(
                f"| {r.get('label', name)} | {status.replace('|', '/')} | {fmt(r.get('steps_done'))} | {fmt(r.get('steps_per_s'), '.2f')} | "
                f"{fmt(r.get('sustained_steps_per_s'), '.2f')} | {fmt(bare if name == 'fit' else None, '.2f')} | {fmt(ratio, '.2f')} | "
                f"{fmt(r.get('tokens_per_s'))} | {fmt(r.get('peak_memory_mb'))} |"
            )
        r = (parts.get("fit") or {}).get("result") or {}
        if r.get("bare_shape"):
            lines.append(
                f"\nBare step: the recipe's model and loss, {r.get('bare_how')}, Adam, on a fixed batch {r['bare_shape']}; "
                "fit steps/s: the median interval between optimizer steps after the first "
                f"{r.get('skipped_steps')} (compilation), sustained: steps over the time of the second half."
            )

    d = (parts.get("decode") or {}).get("result") or {}
    if d.get("rows"):
        lines += ["", "## Decoding (Multi30k test_2016_flickr, de-en)", "", d.get("weights", ""), ""]
        lines += [
            "| search | sentences | seconds | sentences/s | output tokens/s | mean output length |",
            "|---|---|---|---|---|---|",
        ]
        for row in d["rows"]:
            lines.append(
                f"| {row['search']} | {row['sentences']} | {row['seconds']:.2f} | {fmt(row['sentences_per_s'], ',.1f')} | {fmt(row['tokens_per_s'])} | {row['mean_length']:.1f} |"
            )

    p = (parts.get("profile") or {}).get("result") or {}
    if p.get("top"):
        lines += [
            "",
            f"## Profile: {p.get('what')}",
            "",
            f"Top 10 by self {p.get('clock')} time, per step ({p.get('steps')} profiled steps, {p.get('total_ms_per_step', 0):.2f} ms per step in all).",
            "",
        ]
        lines += ["| operator | self ms / step | share | calls / step |", "|---|---|---|---|"]
        for row in p["top"]:
            lines.append(
                f"| `{row['name'][:80]}` | {row['ms_per_step']:.3f} | {row['share']:.1%} | {row['calls_per_step']:g} |"
            )
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------------
# The parts (each runs in its own process: ``--part NAME``).


class Skip(Exception):
    """The part cannot run here; its message says why."""


class Report:
    """The part's result file, rewritten at every update: what a part had measured survives its cut."""

    def __init__(self, path: Path):
        self.path, self.data = path, {}
        self.update(status="running")

    def update(self, **fields) -> None:
        self.data.update(fields)
        write_atomic(self.path, json.dumps(self.data, indent=2, default=str))


def earlier(name: str) -> dict:
    """An earlier part's result (from the parent's JSON)."""
    with contextlib.suppress(OSError, ValueError, KeyError):
        return json.loads(Path(os.environ[STATE_ENV]).read_text())["parts"][name].get("result") or {}
    return {}


def device_and_dtype(dry: bool):
    import torch

    if dry:
        return torch.device("cpu"), torch.float32
    if not torch.cuda.is_available():
        raise Skip("no CUDA device (use --dry-run on the CPU)")
    return torch.device("cuda"), torch.bfloat16


def sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def part_env(rep: Report, dry: bool) -> None:
    import platform

    import torch

    info = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
    }
    info["device"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"CPU ({platform.machine()})"
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(
            memory_gib=round(props.total_memory / 2**30, 1),
            multiprocessors=props.multi_processor_count,
            capability=f"{props.major}.{props.minor}",
        )
    from importlib.metadata import PackageNotFoundError, version

    for name in ("lightning", "pydantic", "tokenizers", "sacrebleu"):  # read, not imported: Lightning takes seconds
        try:
            info[name] = version(name)
        except PackageNotFoundError:
            info[name] = "missing"
    try:
        import tfbuilder

        info["tfbuilder"] = tfbuilder.__version__
    except Exception as exc:  # noqa: BLE001
        info["tfbuilder"] = f"import failed: {exc}"
    try:  # the device machine's copy may have no git, or no .git
        git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        info["commit"] = git.stdout.strip() if git.returncode == 0 else "unknown (no git repository here)"
    except OSError:
        info["commit"] = "unknown (no git here)"
    info["multi30k"] = str(multi30k_dir()) if multi30k_dir() else "absent"
    if not torch.cuda.is_available() and not dry:
        rep.update(**info, status="skipped", reason="no CUDA device: the GPU parts skip")
        return
    if str(info["tfbuilder"]).startswith("import failed"):
        rep.update(**info, status="failed", reason=f"tfbuilder: {info['tfbuilder']}")
        return
    rep.update(**info, status="ok")


def part_peak(rep: Report, dry: bool) -> None:
    import torch

    device, dtype = device_and_dtype(dry)
    size, repeats = (512, 10) if dry else (8192, 30)
    torch.manual_seed(0)
    a = torch.randn(size, size, device=device, dtype=dtype)  # random data: zeros run faster than real data
    b = torch.randn(size, size, device=device, dtype=dtype)
    for _ in range(3 if dry else 10):
        a @ b
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            a @ b
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t = time.perf_counter()
            a @ b
            times.append(time.perf_counter() - t)
    flops = 2 * size**3
    rep.update(
        status="ok",
        tflops=flops / statistics.median(times) / 1e12,
        best_tflops=flops / min(times) / 1e12,
        dtype=str(dtype).removeprefix("torch."),
        size=size,
        repeats=repeats,
    )


def part_pytest(rep: Report, dry: bool, scratch: Path) -> None:
    import xml.etree.ElementTree as ET

    files = sorted(
        str(p.relative_to(ROOT))
        for p in (ROOT / "tests").glob("test_*.py")
        if "mark.gpu" in p.read_text(errors="replace")
    )
    if not files:
        raise Skip("no test is marked gpu")
    junit = scratch / "pytest-gpu.xml"
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-m",
        "gpu",
        "-q",
        "-p",
        "no:randomly",
        "-p",
        "no:cacheprovider",
        "--junitxml",
        str(junit),
        *files,
    ]
    rep.update(command=" ".join(cmd[1:]).replace(str(junit), "JUNIT.xml"), files=" ".join(files))
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "GPU_CHECK"))
    }  # not a worker of an outer pytest
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    print(proc.stdout[-20000:], proc.stderr[-5000:], sep="\n")
    if not junit.is_file():
        rep.update(status="failed", reason=f"pytest exit {proc.returncode}: {last_lines(proc.stdout + proc.stderr)}")
        return
    suite = ET.parse(junit).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    passed = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    rep.update(
        passed=passed,
        failed=counts["failures"],
        errors=counts["errors"],
        skipped=counts["skipped"],
        exit=proc.returncode,
    )
    if counts["failures"] or counts["errors"] or proc.returncode not in (0, 5):
        failing = [
            c.get("classname", "") + "::" + c.get("name", "")
            for c in suite.iter("testcase")
            if c.find("failure") is not None or c.find("error") is not None
        ]
        rep.update(
            status="failed",
            reason="failing: " + ", ".join(failing[:8]) if failing else f"pytest exit {proc.returncode}",
        )
    else:
        rep.update(status="ok")


# --- training steps ---------------------------------------------------------------------------------


def loss_of(recipe):
    """tfbuilder's own training loss ``fn(model, batch) -> scalar`` (the fused, chunked objective that
    ``fit`` uses); if that module has moved, the plain loss from the model's logits."""
    try:
        from tfbuilder.train.objectives import objective

        fn = objective(recipe, epsilon=recipe.optim.label_smoothing)
        return (lambda model, batch: fn(model, batch).loss), "tfbuilder's objective (fused, chunked projection + loss)"
    except ImportError:
        import torch.nn.functional as F

        eps = recipe.optim.label_smoothing

        def plain(model, batch):
            if "src" in batch:
                logits, target = model(batch["src"], batch["tgt_in"]), batch["tgt_out"]
            else:
                logits, target = model(batch["tokens"][:, :-1]), batch["tokens"][:, 1:]
            return F.cross_entropy(logits.float().flatten(0, 1), target.flatten(), label_smoothing=eps)

        return plain, "cross-entropy of the model's logits (tfbuilder.train.objectives not found)"


def sinusoids(length: int, d: int):
    import torch

    pos = torch.arange(length, dtype=torch.float32)[:, None]
    freq = torch.exp(torch.arange(0, d, 2, dtype=torch.float32) * (-math.log(10000.0) / d))
    table = torch.zeros(length, d)
    table[:, 0::2], table[:, 1::2] = torch.sin(pos * freq), torch.cos(pos * freq)
    return table


def reference_models():
    """The two references, defined here so that the parent needs no torch."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    class PaperTransformer(nn.Module):
        """torch.nn.Transformer (post-norm) with the paper's shared, scaled embeddings, sinusoidal
        positions and the output projection tied to the embeddings."""

        def __init__(self, spec, vocab: int, length: int):
            super().__init__()
            d = spec.d_model
            self.embed = nn.Embedding(vocab, d)
            self.register_buffer("pe", sinusoids(length, d), persistent=False)
            self.core = nn.Transformer(
                d_model=d,
                nhead=spec.attention.heads,
                num_encoder_layers=spec.encoder.layers,
                num_decoder_layers=spec.decoder.layers,
                dim_feedforward=spec.ffn.hidden,
                dropout=spec.dropout,
                batch_first=True,
            )
            self.core.encoder.norm = self.core.decoder.norm = None  # post-norm: no final norms
            self.scale = math.sqrt(d)

        def forward(self, src, tgt):
            x = self.embed(src) * self.scale + self.pe[: src.shape[1]]
            y = self.embed(tgt) * self.scale + self.pe[: tgt.shape[1]]
            causal = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1], dtype=x.dtype, device=x.device)
            return self.core(x, y, tgt_mask=causal, tgt_is_causal=True) @ self.embed.weight.T

    class MiniGPT(nn.Module):
        """A minimal GPT-2: learned positions, pre-norm blocks, fused qkv, SDPA (causal), tanh-GELU MLP, tied head."""

        def __init__(self, vocab: int, d: int, heads: int, layers: int, hidden: int, length: int, dropout: float):
            super().__init__()
            self.tok, self.pos, self.heads, self.dropout = (
                nn.Embedding(vocab, d),
                nn.Embedding(length, d),
                heads,
                dropout,
            )
            self.blocks = nn.ModuleList(
                nn.ModuleDict(
                    {
                        "ln1": nn.LayerNorm(d),
                        "qkv": nn.Linear(d, 3 * d),
                        "proj": nn.Linear(d, d),
                        "ln2": nn.LayerNorm(d),
                        "fc": nn.Linear(d, hidden),
                        "out": nn.Linear(hidden, d),
                    }
                )
                for _ in range(layers)
            )
            self.ln = nn.LayerNorm(d)

        def forward(self, ids):
            b, n = ids.shape
            p = self.dropout if self.training else 0.0
            x = F.dropout(self.tok(ids) + self.pos.weight[:n], p)
            for blk in self.blocks:
                q, k, v = blk["qkv"](blk["ln1"](x)).view(b, n, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
                a = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=p)
                x = x + F.dropout(blk["proj"](a.transpose(1, 2).reshape(b, n, -1)), p)
                x = x + F.dropout(blk["out"](F.gelu(blk["fc"](blk["ln2"](x)), approximate="tanh")), p)
            return self.ln(x) @ self.tok.weight.T

    return PaperTransformer, MiniGPT, torch


def seq2seq_flops(spec, vocab: int, b: int, s: int, t: int) -> float:
    """The formula of the module docstring for an encoder-decoder: source length s, target length t."""
    d, h = spec.d_model, spec.attention.heads
    dk = spec.attention.key_dim or d // h
    dv = spec.attention.value_dim or d // h
    ff = spec.ffn.hidden
    qkvo = d * h * (2 * dk + dv) + h * dv * d  # parameters of one attention's four projections
    S, T = b * s, b * t
    matrices = spec.encoder.layers * (qkvo + 2 * d * ff) * S
    matrices += spec.decoder.layers * ((qkvo + 2 * d * ff + d * h * dk + h * dv * d) * T + d * h * (dk + dv) * S)
    matrices += d * vocab * T  # the output projection
    attention = (
        spec.encoder.layers * b * s * s * h * (dk + dv) / 2
        + spec.decoder.layers * b * (t * t + t * s) * h * (dk + dv) / 2
    )
    return 6 * matrices + 12 * attention


def decoder_flops(d: int, heads: int, layers: int, hidden: int, vocab: int, b: int, n: int) -> float:
    """The formula of the module docstring for a decoder-only model (causal attention counted in full)."""
    return 6 * (layers * (4 * d * d + 2 * d * hidden) + d * vocab) * b * n + 12 * layers * b * n * n * d


def make_step(model, loss_fn, batch, *, device, compiled: bool, dry: bool):
    """One optimizer step of ``loss_fn(model, batch)``: bf16 autocast on a GPU (float32 in a dry run),
    fused Adam on a GPU, ``torch.compile`` of the loss (the whole forward) when ``compiled``; in a dry
    run compiled with the "eager" backend (dynamo traces, Inductor's CPU code generation is skipped)."""
    import torch

    optimizer = torch.optim.Adam(
        model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, fused=device.type == "cuda" or None
    )
    fn = torch.compile(loss_fn, backend="eager" if dry else "inductor") if compiled else loss_fn
    autocast = (
        (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if device.type == "cuda" else contextlib.nullcontext
    )

    def step():
        with autocast():
            loss = fn(model, batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    step.model, step.optimizer = model, optimizer
    return step


def resident_bytes(step) -> int:
    """Bytes of a variant's weights, gradients and optimizer state."""
    import torch

    seen, total = set(), 0
    tensors = [p for p in step.model.parameters()] + [p.grad for p in step.model.parameters() if p.grad is not None]
    tensors += [v for s in step.optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    for t in tensors:
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
    return total


def workload(name: str, dry: bool, device):
    """(workload label, shape text, FLOPs a step, target tokens a step, loss text, [(implementation, step)])."""
    import tfbuilder

    PaperTransformer, MiniGPT, torch = reference_models()
    torch.manual_seed(0)
    if name == "base":
        vocab, b, n = (512, 4, 16) if dry else (32000, 256, 64)
        tiny = (
            [
                "model.d_model=32",
                "model.attention.heads=2",
                "model.attention.key_dim=16",
                "model.attention.value_dim=16",
                "model.ffn.hidden=64",
                "model.encoder.layers=1",
                "model.decoder.layers=1",
            ]
            if dry
            else []
        )
        recipe = tfbuilder.load_recipe(ROOT / "recipes" / "vanilla.yaml", [f"data.tokenizer.vocab_size={vocab}", *tiny])
        spec, eps = recipe.model, recipe.optim.label_smoothing
        vocab = spec.vocab_size or vocab
        src = torch.randint(5, vocab, (b, n), device=device)
        tgt = torch.randint(5, vocab, (b, n + 1), device=device)
        batch = {"src": src, "tgt_in": tgt[:, :-1], "tgt_out": tgt[:, 1:]}
        ours_loss, loss_text = loss_of(recipe)
        ours = tfbuilder.build_model(recipe).to(device).train()
        ref = PaperTransformer(spec, vocab, n + 1).to(device).train()

        def ref_loss(model, bt):
            logits = model(bt["src"], bt["tgt_in"])
            return torch.nn.functional.cross_entropy(
                logits.float().flatten(0, 1), bt["tgt_out"].flatten(), label_smoothing=eps
            )

        impls = [("tfbuilder", ours, ours_loss), ("nn.Transformer", ref, ref_loss)]
        label = f"paper-base ({spec.encoder.layers}+{spec.decoder.layers} layers, d {spec.d_model})"
        shape = f"batch {b} x {n} source and target tokens, vocabulary {vocab}"
        flops = seq2seq_flops(spec, vocab, b, n, n)
    else:
        vocab, b, n = (256, 2, 32) if dry else (50257, 16, 1024)
        tiny = (
            [
                "model.d_model=32",
                "model.attention.heads=2",
                "model.ffn.hidden=64",
                "model.decoder.layers=1",
                f"model.vocab_size={vocab}",
                "model.position.max_len=64",
            ]
            if dry
            else []
        )
        recipe = tfbuilder.load_recipe(ROOT / "recipes" / "architectures" / "gpt2-small.yaml", tiny)
        spec = recipe.model
        vocab, d, heads, layers, hidden = (
            spec.vocab_size,
            spec.d_model,
            spec.attention.heads,
            spec.decoder.layers,
            spec.ffn.hidden,
        )
        tokens = torch.randint(5, vocab, (b, n + 1), device=device)
        batch = {"tokens": tokens}
        ours_loss, loss_text = loss_of(recipe)
        ours = tfbuilder.build_model(recipe).to(device).train()
        ref = MiniGPT(vocab, d, heads, layers, hidden, spec.position.max_len, spec.dropout).to(device).train()

        def ref_loss(model, bt):
            logits = model(bt["tokens"][:, :-1])
            return torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), bt["tokens"][:, 1:].flatten())

        impls = [("tfbuilder", ours, ours_loss), ("minimal GPT", ref, ref_loss)]
        label = f"GPT-2 small ({layers} layers, d {d})"
        shape = f"batch {b} x {n} tokens, vocabulary {vocab}"
        flops = decoder_flops(d, heads, layers, hidden, vocab, b, n)
    steps = []
    for impl, model, fn in impls:
        steps.append((impl, make_step(model, fn, batch, device=device, compiled=False, dry=dry)))
        steps.append((f"{impl} compiled", make_step(model, fn, batch, device=device, compiled=True, dry=dry)))
    return label, shape, flops, b * n, loss_text, steps


def part_train(rep: Report, dry: bool, which: str) -> None:
    import torch

    device, _ = device_and_dtype(dry)
    label, shape, flops, tokens, loss_text, steps = workload(which, dry, device)
    rep.update(workload=label, shape=shape, flops_per_step=flops, loss=loss_text, rows=[])
    warmup, timed, rounds = (1, 3, 1) if dry else (3, 15, 2)
    times: dict[str, list[float]] = {}
    rows: dict[str, dict] = {}
    cuda = device.type == "cuda"

    def measure(impl, step) -> None:
        if cuda:
            others = torch.cuda.memory_allocated(device) - resident_bytes(step)
            torch.cuda.reset_peak_memory_stats(device)
        samples = []
        for _ in range(timed):
            sync(device)
            t = time.perf_counter()
            step()
            sync(device)
            samples.append(time.perf_counter() - t)
        times.setdefault(impl, []).append(statistics.median(samples))
        t = statistics.median(times[impl])
        row = rows.setdefault(impl, {"implementation": impl})
        row.update(step_ms=t * 1e3, tokens_per_s=tokens / t, tflops=flops / t / 1e12)
        if cuda:
            row["peak_gib"] = max(row.get("peak_gib", 0.0), (torch.cuda.max_memory_allocated(device) - others) / 2**30)
        rep.update(rows=list(rows.values()))

    for impl, step in steps:  # first round: warm up (compile) each, then time it; every row is saved as it comes
        t = time.perf_counter()
        for _ in range(warmup):
            step()
        sync(device)
        rows[impl] = {"implementation": impl, "warmup_s": time.perf_counter() - t}
        measure(impl, step)
    for _ in range(rounds - 1):  # further rounds interleave the variants: drift falls on all alike
        for impl, step in steps:
            measure(impl, step)
    rep.update(status="ok")


# --- fit ----------------------------------------------------------------------------------------------


def data_dir(dry: bool, scratch: Path) -> Path:
    """Multi30k, or (dry run) its first lines in a folder of the same shape."""
    found = multi30k_dir()
    if found is None:
        raise Skip(
            "no Multi30k: set MULTI30K_DIR, or run benchmarks/gpu_prepare.sh (it copies ../shared/data/multi30k to .gpu-data/)"
        )
    if not dry:
        return found
    small = scratch / "multi30k-head"
    if not small.is_dir():
        tmp = scratch / "multi30k-head.tmp"
        tmp.mkdir(exist_ok=True)
        for f in found.glob("*.gz"):
            with gzip.open(f, "rt", encoding="utf-8") as src, gzip.open(tmp / f.name, "wt", encoding="utf-8") as dst:
                for i, line in enumerate(src):
                    if i >= (400 if f.name.startswith("train") else 60):
                        break
                    dst.write(line)
        with contextlib.suppress(OSError):
            os.replace(tmp, small)
    return small


def fit_recipe(dry: bool, scratch: Path, steps: int, *extra: str):
    import tfbuilder

    data = data_dir(dry, scratch)
    tiny = (
        [
            "model.d_model=32",
            "model.attention.heads=2",
            "model.attention.key_dim=16",
            "model.attention.value_dim=16",
            "model.ffn.hidden=64",
            "model.encoder.layers=1",
            "model.decoder.layers=1",
            "data.tokenizer.vocab_size=300",
            "data.max_tokens=400",
            "trainer.accelerator=cpu",
            "data.workers=0",
        ]
        if dry
        else []
    )
    overrides = [
        *TEXT_FOLDER,  # the recipe reads Multi30k from the Hub: here, from the folder of its text files
        f"data.path={data}",
        f"data.cache={scratch / 'store'}",
        f"trainer.output={scratch / 'runs'}",
        f"trainer.max_steps={steps}",
        f"trainer.val_every={steps}",
        "trainer.val_batches=2",
        "trainer.val_bleu=0",
        "trainer.progress=false",
        "trainer.patience=null",
        "trainer.precision=" + ("32" if dry else "bf16-mixed"),
        "trainer.compile=" + ("false" if dry else "true"),
        *tiny,
        *extra,
    ]
    return tfbuilder.load_recipe(ROOT / "recipes" / "multi30k" / "vanilla-small.yaml", overrides), overrides


def bare_step(recipe, dry: bool, rep: Report) -> None:
    """Steps/s of the recipe's model and loss (compiled when the recipe compiles, in its precision), on a
    fixed batch of about ``data.max_tokens``."""
    import torch

    import tfbuilder

    device, _ = device_and_dtype(dry)
    torch.manual_seed(0)
    vocab = recipe.model.vocab_size or recipe.data.tokenizer.vocab_size
    n = 24
    b = max(1, recipe.data.max_tokens // n)
    src = torch.randint(5, vocab, (b, n), device=device)
    tgt = torch.randint(5, vocab, (b, n + 1), device=device)
    batch = {"src": src, "tgt_in": tgt[:, :-1], "tgt_out": tgt[:, 1:]}
    loss, _ = loss_of(recipe)
    model = tfbuilder.build_model(recipe).to(device).train()
    step = make_step(model, loss, batch, device=device, compiled=recipe.trainer.compile, dry=dry)
    for _ in range(2 if dry else 5):
        step()
    samples = []
    for _ in range(3 if dry else 30):
        sync(device)
        t = time.perf_counter()
        step()
        sync(device)
        samples.append(time.perf_counter() - t)
    how = ("compiled, " if recipe.trainer.compile else "eager, ") + (
        "bf16 autocast" if device.type == "cuda" else "float32"
    )
    rep.update(
        bare_steps_per_s=1 / statistics.median(samples), bare_shape=f"{b} x {n} source and target tokens", bare_how=how
    )


def part_fit(rep: Report, dry: bool, scratch: Path, strategy: str | None) -> None:
    if dry and strategy == "fsdp":  # before importing anything: Lightning's FSDP strategy takes a GPU only
        raise Skip("FSDP needs a GPU: Lightning refuses strategy fsdp with accelerator cpu")
    import torch

    import tfbuilder

    if not dry and not torch.cuda.is_available():
        raise Skip("no CUDA device")
    steps = (3 if dry else 60) if strategy else (4 if dry else 150)
    extra = [f"trainer.strategy={strategy}", "trainer.devices=1"] if strategy else []
    try:
        recipe, overrides = fit_recipe(dry, scratch, steps, *extra)
    except tfbuilder.RecipeError as exc:
        raise Skip(f"the recipe refuses strategy {strategy} on one device: {exc}".replace("\n", " ")) from None
    label = f"fit, strategy {strategy or 'auto'}, " + ("float32, eager (dry run)" if dry else "bf16-mixed, compile")
    rep.update(label=label, overrides=overrides, steps_planned=steps, steps_done=0)
    if strategy is None:
        bare_step(recipe, dry, rep)
    if strategy:  # one process: a rendezvous of its own on this machine
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(s.getsockname()[1]))
    stamps: list[float] = []
    skip = 1 if dry else 10

    def rates() -> dict:
        gaps = [b - a for a, b in zip(stamps[skip:-1], stamps[skip + 1 :], strict=True)]
        if not gaps:
            return {"steps_done": len(stamps)}
        half = stamps[len(stamps) // 2 :]
        sustained = (len(half) - 1) / (half[-1] - half[0]) if len(half) > 1 and half[-1] > half[0] else None
        return {
            "steps_done": len(stamps),
            "steps_per_s": 1 / statistics.median(gaps),
            "sustained_steps_per_s": sustained,
            "skipped_steps": skip,
        }

    def on_step(step: int, max_steps: int) -> None:
        stamps.append(time.perf_counter())
        if len(stamps) % 10 == 0 or len(stamps) == max_steps:
            rep.update(**rates())

    began = time.perf_counter()
    try:
        summary = tfbuilder.fit(recipe, on_step=on_step)
    except tfbuilder.RecipeError as exc:
        raise Skip(f"refused: {exc}".replace("\n", " ")) from None
    except Exception as exc:  # noqa: BLE001 (a strategy Lightning refuses here is reported, not fatal)
        if strategy and ("not supported" in str(exc).lower() or "requires" in str(exc).lower()):
            raise Skip(
                f"strategy {strategy} on one device: {type(exc).__name__}: {exc}".replace("\n", " ")[:400]
            ) from None
        raise
    rep.update(
        **rates(),
        seconds_in_fit=time.perf_counter() - began,
        tokens_per_s=summary.tokens_per_s,
        peak_memory_mb=summary.peak_memory_mb,
        run_dir=summary.run_dir,
        last_checkpoint=summary.last_checkpoint,
        status="ok",
    )


# --- decoding -----------------------------------------------------------------------------------------


def part_decode(rep: Report, dry: bool, scratch: Path) -> None:
    import torch

    import tfbuilder
    from tfbuilder.inference import decoding

    device, _ = device_and_dtype(dry)
    data = data_dir(dry, scratch)
    run = earlier("fit").get("run_dir")
    if run and Path(run).is_dir():
        weights = f"Weights: the `fit` part's run, {earlier('fit').get('steps_done')} steps: its speed counts here, not its translations."
    else:
        recipe, _ = fit_recipe(
            dry, scratch, 2 if dry else 40, "trainer.compile=false", f"trainer.output={scratch / 'decode-runs'}"
        )
        run = tfbuilder.fit(recipe).run_dir
        weights = f"Weights: a {recipe.trainer.max_steps}-step run of its own (the `fit` part left none): its speed counts here, not its translations."
    loaded = tfbuilder.load_checkpoint(run, device=device)
    model = loaded.model.eval()
    with gzip.open(data / "test_2016_flickr.de.gz", "rt", encoding="utf-8") as f:
        sources = [line.rstrip("\n") for line in f]
    sources = sources[:8] if dry else sources
    longest = {"max_len_a": 0.0, "max_len_b": 8} if dry else {}  # a dry run's untrained model writes to the limit
    ids = loaded.vocab.src.encode_batch(sources)
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    rep.update(weights=weights, rows=[])
    rows = []
    for search, beam in (("greedy", 1), ("beam 4", 4)):
        budget = 6000 // beam  # source tokens a batch, all beams together (translate's --max-tokens default)
        batches, current = [], []
        for i in order:
            if current and (len(current) + 1) * (len(ids[i]) + 1) > budget:
                batches.append(current)
                current = []
            current.append(i)
        batches.append(current)
        tensors = [decoding.source_batch(model, [ids[i] for i in rows_]).to(device) for rows_ in batches]

        def decode(src, beam=beam):
            if beam == 1:
                return decoding.greedy(model, src, **longest)
            return decoding.beam_search(model, src, beam=beam, alpha=0.6, **longest)

        with torch.inference_mode():
            decode(tensors[0][:2])  # warm-up
            sync(device)
            t = time.perf_counter()
            outputs = [h for src in tensors for h in decode(src)]
            sync(device)
            seconds = time.perf_counter() - t
        produced = sum(len(h) for h in outputs)
        rows.append(
            {
                "search": search,
                "sentences": len(outputs),
                "seconds": seconds,
                "sentences_per_s": len(outputs) / seconds,
                "tokens_per_s": produced / seconds,
                "mean_length": produced / max(1, len(outputs)),
            }
        )
        rep.update(rows=rows)
    rep.update(status="ok")


# --- profile ------------------------------------------------------------------------------------------


def part_profile(rep: Report, dry: bool) -> None:
    from torch.profiler import ProfilerActivity, profile

    device, _ = device_and_dtype(dry)
    _, shape, _, _, _, steps = workload("base", dry, device)
    step = dict(steps)["tfbuilder" if dry else "tfbuilder compiled"]  # dry run: train-base traced it already
    for _ in range(2 if dry else 4):
        step()
    sync(device)
    n = 2 if dry else 5
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(n):
            step()
        sync(device)
    events = prof.key_averages()

    def self_time(e) -> float:  # microseconds; the attribute's name changed across torch versions
        if cuda:
            return getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0.0)
        return e.self_cpu_time_total

    total = sum(self_time(e) for e in events) or 1.0
    top = sorted(events, key=self_time, reverse=True)[:10]
    rep.update(
        what=f"tfbuilder paper-base step, {'eager (dry run)' if dry else 'compiled'}, {shape}",
        clock="CUDA" if cuda else "CPU",
        steps=n,
        total_ms_per_step=total / n / 1e3,
        top=[
            {
                "name": e.key,
                "ms_per_step": self_time(e) / n / 1e3,
                "share": self_time(e) / total,
                "calls_per_step": e.count / n,
            }
            for e in top
        ],
        status="ok",
    )
    for sort in ("self_device_time_total", "self_cuda_time_total") if cuda else ("self_cpu_time_total",):
        with contextlib.suppress(Exception):
            print(events.table(sort_by=sort, row_limit=10))  # the profiler's own table, in the log
            break


def run_part(name: str, result: Path, dry: bool, scratch: Path) -> int:
    rep = Report(result)
    try:
        if os.environ.get("GPU_CHECK_FAIL") == name:  # the tests' way to crash a part
            raise RuntimeError(f"injected failure of {name} (GPU_CHECK_FAIL)")
        if name == "env":
            part_env(rep, dry)
        elif name == "peak":
            part_peak(rep, dry)
        elif name == "pytest":
            part_pytest(rep, dry, scratch)
        elif name == "train-base":
            part_train(rep, dry, "base")
        elif name == "train-gpt2":
            part_train(rep, dry, "gpt2")
        elif name == "fit":
            part_fit(rep, dry, scratch, None)
        elif name in ("fit-ddp", "fit-fsdp"):
            part_fit(rep, dry, scratch, name.removeprefix("fit-"))
        elif name == "decode":
            part_decode(rep, dry, scratch)
        elif name == "profile":
            part_profile(rep, dry)
    except Skip as why:
        rep.update(status="skipped", reason=str(why))
    except Exception:  # noqa: BLE001 (the parent reports the last lines)
        traceback.print_exc()
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="the folder for gpu_check.md, gpu_check.json and gpu_check.log")
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU (no CUDA needed)")
    parser.add_argument(
        "--parts",
        help=f"comma-separated parts to run, or first / second ({'; '.join(f'{k}: {v}' for k, v in GROUPS.items())}); "
        f"default all: {','.join(p[0] for p in PARTS)}",
    )
    parser.add_argument("--budget", action="append", default=[], metavar="PART=SECONDS", help="a part's time budget")
    parser.add_argument(
        "--total",
        type=float,
        help=f"the whole run's budget in seconds (default {TOTAL['gpu']}; dry run {TOTAL['dry']})",
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep the scratch folder (runs, data store, compiled kernels)"
    )
    parser.add_argument("--part", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--scratch", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.part:
        sys.path.insert(0, str(ROOT))
        return run_part(args.part, Path(args.result), args.dry_run, Path(args.scratch))
    if not args.out:
        parser.error("--out DIR is required")
    return Run(args).run()


if __name__ == "__main__":
    sys.exit(main())
