"""tfbuilder sweep --launcher: one submitit job per entry (local processes here, a SLURM job array on a
cluster), each entry trained exactly once, one report; the jobs' requeue callable; submitit missing."""

from __future__ import annotations

import csv
import os
import pickle
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT
from test_sweeps import TINY, recipes, trained_once  # noqa: F401  (recipes: the tiny sweep's fixture)

from tfbuilder.cli.commands import main

pytestmark = pytest.mark.xdist_group("sweeps")


def tfbuilder(*argv: str, cwd: Path, timeout: float = 400) -> subprocess.CompletedProcess:
    """``python -m tfbuilder`` in a child process (submitit's local jobs are its children in turn)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env = {k: v for k, v in env.items() if not k.startswith(("SLURM_", "SUBMITIT_"))}
    return subprocess.run(
        [sys.executable, "-m", "tfbuilder", *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.cluster
def test_a_local_launch_runs_every_entry_once_and_writes_one_report(recipes, tmp_path):  # noqa: F811
    """About a minute on two cores: two jobs, each its own Python process training one tiny run."""
    out = tmp_path / "sweep"
    proc = tfbuilder(
        "sweep", *map(str, recipes), "--seeds", "1", "--out", str(out), "--no-bleu", *TINY, "--launcher", "local",
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert trained_once(out) == {"tiny-post/seed-0": 1, "tiny-pre/seed-0": 1}
    for index, label in enumerate(("tiny-post seed 0", "tiny-pre seed 0")):
        assert f"entry {index} ({label}, job " in proc.stderr
    assert proc.stderr.count(", finished\n") == 2  # after submitit's state of the job
    report = (out / "report.md").read_text()
    assert "| tiny-post |" in report and "| tiny-pre |" in report and "| tiny-pre |" in proc.stdout
    logs = sorted(p.name for p in (out / "jobs").rglob("*_log.out"))
    assert len(logs) == 2  # one job per entry


@pytest.mark.cluster
def test_no_wait_prints_the_job_ids_and_the_report_command(recipes, tmp_path):  # noqa: F811
    out = tmp_path / "sweep"
    command = ["sweep", str(recipes[0]), "--seeds", "1", "--out", str(out), "--no-bleu", *TINY]
    proc = tfbuilder(*command, "--launcher", "local", "--no-wait", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0].split()[:2] == ["0", "job"] and lines[0].split()[2].isdigit()
    assert lines[0].endswith(str(out / "runs" / "tiny-post" / "seed-0"))
    assert lines[-1].startswith("tfbuilder sweep ") and lines[-1].endswith(" --report-only")
    assert f"--out {out}" in lines[-1] and "--set trainer.max_steps=12" in lines[-1]
    job = lines[0].split()[2]  # the job goes on after the command returned: wait for it, then the report
    deadline = time.monotonic() + 300
    while not (out / "jobs" / f"{job}_0_result.pkl").exists():
        assert time.monotonic() < deadline, "the local job did not end"
        time.sleep(1)
    report = tfbuilder(*shlex.split(lines[-1])[1:], cwd=tmp_path)
    assert report.returncode == 0 and "| tiny-post |" in report.stdout, report.stderr[-3000:]
    assert trained_once(out) == {"tiny-post/seed-0": 1}


def test_without_submitit_the_launcher_exits_2_saying_what_to_install(recipes, tmp_path, monkeypatch, capsys):  # noqa: F811
    monkeypatch.setitem(sys.modules, "submitit", None)  # `import submitit` raises ImportError
    out = tmp_path / "sweep"
    assert main(["sweep", str(recipes[0]), "--out", str(out), "--no-bleu", *TINY, "--launcher", "submitit"]) == 2
    err = capsys.readouterr().err
    assert "--launcher submitit needs submitit: pip install 'tfbuilder[slurm]'" in err and "Traceback" not in err
    assert not out.exists()  # refused before the sweep's directory is made


def test_launcher_options_are_refused_where_they_cannot_apply(recipes, tmp_path, capsys):  # noqa: F811
    command = ["sweep", str(recipes[0]), "--out", str(tmp_path / "s"), "--no-bleu", *TINY]
    assert main([*command, "--slurm-partition", "gpu", "--no-wait"]) == 2
    assert "--slurm-partition, --no-wait only applies with --launcher" in capsys.readouterr().err
    assert main([*command, "--launcher", "local", "--entry", "0"]) == 2
    assert "leave out --entry and --report-only" in capsys.readouterr().err


def test_an_entry_job_runs_its_entry_and_requeues_as_itself(monkeypatch):
    """submitit calls ``checkpoint()`` when a job is stopped (time limit, preemption) and runs what it
    returns in the requeued job: the same entry, which continues its run from its last checkpoint."""
    from tfbuilder.use.launch import Entry, LaunchError

    monkeypatch.setattr(sys.modules[__name__], "CALLS", [])
    entry = Entry(record, ("sweep", "a.yaml", "--seeds", "2"), 3)
    assert entry() == 0 and CALLS == [["sweep", "a.yaml", "--seeds", "2", "--entry", "3"]]
    again = pickle.loads(pickle.dumps(entry.checkpoint()))  # requeued: pickled into the job's folder
    assert again.function == entry and (again.args, again.kwargs) == ((), {})
    assert again.result() == 0 and CALLS == [CALLS[0], CALLS[0]]
    with pytest.raises(LaunchError, match="entry 1: tfbuilder sweep exited 2"):
        Entry(record, ("sweep", "a.yaml", "--exit", "2"), 1)()
    with pytest.raises(LaunchError, match="entry 2: stopped by signal 15; the same sweep command continues"):
        Entry(record, ("sweep", "a.yaml", "--exit", "143"), 2)()
    assert Entry(record, ("sweep", "a.yaml", "--exit", "1"), 0)() == 1  # diverged: in the report, not a failure


def test_an_entry_stopped_by_submitits_signal_hands_it_back_to_submitit(monkeypatch):
    """submitit's jobs get SIGUSR2 before their time limit (or when preempted). tfbuilder takes it as a
    stop (the step checkpointed, exit 140); the entry then raises it again for submitit's own handler,
    which calls ``checkpoint()`` and requeues the job (and exits it)."""
    from tfbuilder.use.launch import Entry, LaunchError

    seen: list[int] = []
    previous = signal.signal(signal.SIGUSR2, lambda signum, frame: seen.append(signum))  # submitit's, here
    try:
        with pytest.raises(LaunchError, match="stopped by signal 12"):  # a handler that did not exit the job
            Entry(record, ("sweep", "a.yaml", "--exit", str(128 + signal.SIGUSR2)), 4)()
    finally:
        signal.signal(signal.SIGUSR2, previous)
    assert seen == [signal.SIGUSR2]
    with pytest.raises(LaunchError, match="stopped by signal 15"):
        Entry(record, ("sweep", "a.yaml", "--exit", "143"), 2)()
    assert seen == [signal.SIGUSR2]  # SIGTERM is not submitit's notice: nothing raised again


CALLS: list[list[str]] = []  # what record() was called with (a picklable stand-in for the CLI's main)


def record(argv: list[str]) -> int:
    CALLS.append(argv)
    return int(argv[argv.index("--exit") + 1]) if "--exit" in argv else 0


# --- docs/gpu.md's SLURM job-array script, verbatim, with stand-ins for sbatch, srun and scontrol -------


def documented_script() -> str:
    """The ```bash block after ``<!-- slurm-table3 -->`` in docs/gpu.md (as .ci/run reads the README's command)."""
    page = (ROOT / "docs" / "gpu.md").read_text(encoding="utf-8")
    block = page.split("<!-- slurm-table3 -->\n```bash\n", 1)[1]
    return block.split("\n```\n", 1)[0] + "\n"


def stand_ins(bin_dir: Path, log: Path) -> None:
    """sbatch records its arguments (one JSON list a line) and prints a job id; srun runs its arguments;
    scontrol records; tfbuilder is this checkout's."""
    bin_dir.mkdir()
    tools = {
        "sbatch": f"#!{sys.executable}\nimport json, sys\n"
        f"with open({str(log)!r}, 'a') as f: f.write(json.dumps(sys.argv[1:]) + '\\n')\nprint('4242;cluster')\n",
        "srun": '#!/bin/sh\nexec "$@"\n',
        "scontrol": f'#!/bin/sh\necho "scontrol $@" >> {log}.scontrol\n',
        "tfbuilder": f'#!/bin/sh\nexec {sys.executable} -m tfbuilder "$@"\n',
    }
    for name, text in tools.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)


def test_the_documented_slurm_script_trains_each_entry_once_then_reports(tmp_path):
    """About a minute on two cores: the login-node call, two array tasks, then the report job."""
    import json

    script = tmp_path / "table3.sh"
    script.write_text(documented_script())
    recipe = tmp_path / "tiny.yaml"  # the sweep's settings in the recipe: the script passes no --set
    recipe.write_text(
        f"name: tiny-post\nextends: {ROOT / 'recipes' / 'quickstart.yaml'}\n"
        "trainer: {max_steps: 12, val_every: 6, log_every: 3}\ndata: {train_size: 300, val_size: 40, lengths: [1, 6]}\n"
    )
    log, out = tmp_path / "sbatch.log", tmp_path / "sweep"
    stand_ins(tmp_path / "bin", log)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SUBMITIT_"))}
    base |= {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "RECIPES": str(recipe), "OUT": str(out)}
    base["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])

    def bash(*argv: str, **env: str) -> subprocess.CompletedProcess:
        proc = subprocess.run(["bash", *argv], cwd=ROOT, env=base | env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return proc

    assert "submitted job array 4242 (1 recipes x 2 seeds)" in bash(str(script)).stdout  # on the login node
    array, report = [json.loads(line) for line in log.read_text().splitlines()]
    assert array == ["--parsable", str(script)]
    assert "--dependency=afterany:4242" in report and report[-2] == "--wrap"
    for task in range(2):  # each array task, as sbatch would start it (the copy of the script, its variables)
        task_env = {"SLURM_ARRAY_JOB_ID": "4242", "SLURM_ARRAY_TASK_ID": str(task), "SLURM_JOB_ID": str(4243 + task)}
        bash(str(script), **task_env, SLURM_NTASKS="1", SLURM_PROCID="0", SLURM_JOB_NAME="table3")
        assert trained_once(out) == {f"tiny-post/seed-{s}": 1 for s in range(task + 1)}  # entry I = task I
    (out / "report.md").unlink()  # written by the task that finished the last run; the report job writes it again
    assert "| tiny-post |" in bash("-c", report[-1]).stdout
    assert trained_once(out) == {"tiny-post/seed-0": 1, "tiny-post/seed-1": 1}
    assert "| tiny-post | (baseline) |" in (out / "report.md").read_text()
    with open(out / "report.csv", newline="") as f:
        assert [(row["recipe"], row["seeds"]) for row in csv.DictReader(f)] == [("tiny-post", "2")]
    assert not Path(f"{log}.scontrol").exists()  # no task was stopped: nothing requeued


def test_on_slurm_the_options_become_one_job_array(recipes, tmp_path, monkeypatch, capsys):  # noqa: F811
    """submitit finds SLURM by ``srun`` on PATH; a stand-in ``sbatch`` keeps the script it is given."""
    bin_dir, out = tmp_path / "bin", tmp_path / "sweep"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 0\n")
    keep = tmp_path / "submitted.sh"
    (bin_dir / "sbatch").write_text(f'#!/bin/sh\ncp "$1" {keep}\necho "Submitted batch job 4242"\n')
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    for name in [n for n in os.environ if n.startswith("SLURM_")]:
        monkeypatch.delenv(name)
    options = ["--slurm-partition", "gpu", "--slurm-gpus-per-node", "1", "--slurm-cpus-per-task", "4"]
    options += ["--slurm-time", "30", "--slurm-array-parallelism", "3"]
    argv = ["sweep", *map(str, recipes), "--seeds", "2", "--out", str(out), *TINY, "--launcher", "submitit"]
    assert main([*argv, *options, "--no-wait"]) == 0
    captured = capsys.readouterr()
    shown = [line.split()[:3] for line in captured.out.splitlines()[:4]]
    assert shown == [[str(i), "job", f"4242_{i}"] for i in range(4)]  # one array task per entry
    assert "4 jobs submitted (slurm)" in captured.err
    script = keep.read_text()
    for line in ("--array=0-3%3", "--partition=gpu", "--gpus-per-node=1", "--cpus-per-task=4", "--time=30",
                 "--signal=USR2@90", "--job-name=tfbuilder-sweep"):  # fmt: skip
        assert f"#SBATCH {line}\n" in script, line
    assert f"--output={out / 'jobs'}" in script and "srun" in script and "submitit.core._submit" in script
    assert not (out / "runs").exists()  # nothing trained here: the jobs would
