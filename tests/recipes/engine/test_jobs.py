"""``--jobs`` / ``--cluster``: a grid's cells as submitit jobs, against submitit's real local
executor (each job a process of its own; nothing of the engine is mocked)."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import pytest

from adaptcl import cli
from adaptcl.recipes.engine import options
from adaptcl.recipes.engine.errors import RecipeError
from adaptcl.recipes.engine.job_options import JobOptions
from tests.recipes._process import children, env_with_src
from tests.recipes.engine._toy import ToyConfig, ToyRecipe, cell

pytest.importorskip("submitit")


def _stored(out: Path) -> dict[str, dict]:
    """label -> stored record of every cell under ``out/runs``."""
    return {f"{p.parent.parent.name}/{p.parent.name}/{p.stem}": json.loads(p.read_text())["record"]
            for p in sorted((out / "runs").glob("*/*/seed*.json"))}


def _toy(argv: list[str]) -> int:
    """``adaptcl toy ...`` through the CLI's error handling (one line, exit codes)."""
    return cli._handled("adaptcl toy", lambda: ToyRecipe.main(argv, "adaptcl toy"))


# ------------------------------------------------------------------- options, refusals


@pytest.mark.parametrize("argv, message", [
    (["--jobs", "0"], "adaptcl toy: error: jobs must be a number >= 1, got 0"),
    (["--jobs", "two"], "adaptcl toy: error: argument --jobs: invalid int value 'two'"),
    (["--cluster", "pbs"], "adaptcl toy: error: unknown cluster 'pbs'; choose from none, "
                           "local, slurm"),
    (["--cluster-option", "mem"], "adaptcl toy: error: --cluster-option: expected KEY=VALUE, "
                                  "got 'mem'"),
])
def test_bad_job_options_are_one_line_before_any_work(argv, message, capsys, tmp_path):
    assert _toy([*argv, "--output-dir", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.strip() == message
    assert not (tmp_path / "out").exists()


def test_slurm_options_without_slurm_or_slurm_absent_and_several_devices_are_refused(
        tmp_path, monkeypatch):
    for given, message in (
            ({"jobs": 2, "cluster_partition": "gpu", "cluster_time": 10},
             "--cluster-partition, --cluster-time only apply with --cluster slurm"),
            ({"cluster_option": ["slurm_mem=16G"]},
             "--cluster-option only applies with --cluster slurm")):
        with pytest.raises(RecipeError, match=message):
            JobOptions(**given)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no sbatch: refused before any work
    with pytest.raises(RecipeError, match="--cluster slurm: SLURM is not available on this "
                                          r"machine \(no sbatch on PATH\)"):
        ToyRecipe(ToyConfig(output_dir=str(tmp_path / "slurm")),
                  jobs=JobOptions(cluster="slurm")).run()
    assert not (tmp_path / "slurm").exists()

    @dataclasses.dataclass
    class OnDevices(ToyConfig):  # as the configs of images, tu, moleculenet
        devices: int = options.devices()

    class Toy(ToyRecipe):
        config_class = OnDevices

    with pytest.raises(RecipeError, match="--devices 2 with --jobs/--cluster"):
        Toy(OnDevices(output_dir=str(tmp_path / "out"), devices=2), jobs=JobOptions(jobs=2)).run()
    assert not (tmp_path / "out").exists()  # refused before any file


def test_threads_are_divided_between_local_jobs_and_whole_on_slurm():
    assert [JobOptions(jobs=n).threads_per_job(4) for n in (1, 2, 3, 4, 8)] == [4, 2, 1, 1, 1]
    assert JobOptions(cluster="slurm", jobs=8).threads_per_job(4) == 4


def test_slurm_jobs_get_partition_time_gpus_cpus_and_extra_options(tmp_path, monkeypatch):
    """The sbatch script submitit writes for ``--cluster slurm`` (a stand-in ``srun`` on PATH:
    submitit only checks that it exists before it writes the script)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    (bin_dir / "sbatch").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "sbatch").chmod(0o755)
    options = JobOptions(cluster="slurm", cluster_partition="gpu", cluster_time=90,
                         cluster_gpus=1, cluster_option=["slurm_mem=16G", "slurm_account=lab"])
    executor = options.executor(tmp_path / "jobs" / "%j", options.threads_per_job(4), "tu")
    script = executor._executor._make_submission_file_text("python -m x", "uid")
    for line in ("--partition=gpu", "--time=90", "--gpus-per-node=1", "--cpus-per-task=4",
                 "--mem=16G", "--account=lab", "--job-name=adaptcl-tu"):
        assert f"#SBATCH {line}\n" in script
    with pytest.raises(RecipeError, match="--cluster-option: .*nosuch"):
        JobOptions(cluster="slurm", cluster_option=["slurm_nosuch=1"]).executor(tmp_path, 1, "tu")


def test_slurm_submissions_carry_a_chunk_each_one_per_cell_without_jobs(tmp_path, monkeypatch):
    """``--cluster slurm --jobs 2`` on five cells: two sbatch submissions (a stand-in
    ``sbatch`` answering as SLURM does), each pickling ``run_chunk_job`` with its share of the
    cells; without ``--jobs``, one submission per cell as before."""
    from submitit.core.utils import DelayedSubmission

    from adaptcl.recipes.engine.job_cells import run_chunk_job
    from adaptcl.recipes.engine.jobs import JobRunner

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("srun", "exit 0"), ("sbatch", "echo Submitted batch job 4242")):
        (bin_dir / name).write_text(f"#!/bin/sh\n{text}\n")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    recipe = ToyRecipe(ToyConfig(output_dir=str(tmp_path / "out"), seeds=list(range(5))))
    recipe.prepare(recipe.point_configs())
    cells = recipe.cells()
    every = JobRunner(JobOptions(cluster="slurm"), recipe, threads=2, cells=len(cells))
    assert [len(c) for c in every.chunks(cells)] == [1] * 5
    runner = JobRunner(JobOptions(cluster="slurm", jobs=2), recipe, threads=2, cells=len(cells))
    chunks = runner.chunks(cells)
    assert chunks == [cells[0::2], cells[1::2]] and runner.threads == 2
    identities = {c: recipe.identity_of(c) for c in cells}
    job = runner.submit(chunks[1], identities)
    assert job.job_id == "4242"
    submission = DelayedSubmission.load(job.paths.submitted_pickle)
    assert submission.function is run_chunk_job
    assert submission.args[2] == chunks[1] and submission.args[-1] == "slurm"
    assert "#SBATCH --cpus-per-task=2" in job.paths.submission_file.read_text()


def test_fewer_cells_than_jobs_start_one_job_per_cell_and_say_so(tmp_path):
    from adaptcl.recipes.engine.jobs import JobRunner

    recipe = ToyRecipe(ToyConfig(output_dir=str(tmp_path / "out"), seeds=[0, 1, 2]))
    runner = JobRunner(JobOptions(jobs=4), recipe, threads=4, cells=3)
    assert [len(c) for c in runner.chunks(recipe.cells())] == [1, 1, 1]
    assert runner.describe(3).startswith(
        "3 jobs of up to 1 run each (local), 1 thread each; only 3 runs to compute for "
        "--jobs 4, so 3 jobs; logs under ")
    assert runner.describe(9).startswith("4 jobs of up to 3 runs each (local), 1 thread each;"
                                         " logs under ")


def test_a_job_fails_a_cell_whose_identity_changed_since_submission_and_goes_on(tmp_path):
    """The job function itself (what each submitit job runs), in this process: the parent's
    planned identity hash of seed0 no longer matches the recipe rebuilt from the config; that
    cell fails, named, and the chunk's next cell is computed and stored."""
    import torch

    from adaptcl.recipes.engine.job_cells import run_chunk_job
    from adaptcl.recipes.engine.provenance import stable_hash
    from adaptcl.recipes.engine.sweep import Sweep

    threads = torch.get_num_threads()  # the job function sets the process's threads
    config = ToyConfig(output_dir=str(tmp_path / "out"), seeds=[0, 1])
    sweep, cells = Sweep.of(config), [cell("d", "base", 0), cell("d", "base", 1)]
    recipe = ToyRecipe(config)
    recipe.prepare(recipe.point_configs())
    planned = stable_hash(recipe.identity_of(cells[1]))
    from threadpoolctl import threadpool_info, threadpool_limits

    try:
        with threadpool_limits(limits=2):  # restores this process's pools on exit
            result = run_chunk_job(ToyRecipe, sweep, cells, ["0" * 64, planned], 1, True,
                                   "local")
            pools = threadpool_info()
    finally:
        torch.set_num_threads(threads)
    assert result["cells"]["d/base/seed0"] == {
        "status": "failed", "error": "RecipeError: d/base/seed0: its identity (settings, data "
        "or code) changed since the run was submitted; rerun the command"}
    assert result["cells"]["d/base/seed1"]["status"] == "computed"
    assert not (tmp_path / "out" / "runs" / "d" / "base" / "seed0.json").exists()
    # the BLAS / OpenMP pools (numpy's, scikit-learn's) take the job's share too
    assert pools and {pool["num_threads"] for pool in pools} == {1}, pools
    execution = json.loads((tmp_path / "out" / "runs" / "d" / "base" / "seed1.json")
                           .read_text())["record"]["execution"]
    assert (execution["threads"], execution["cluster"]) == (1, "local")


# ------------------------------------------------------------------- real local jobs


@pytest.mark.slow
def test_a_failed_job_is_named_with_its_log_the_others_go_on_and_a_rerun_retries_it(
        tmp_path, monkeypatch, capsys):
    """seed1 raises, seed2 diverges, seeds 0 and 3 are stored; the run exits 1 naming seed1;
    the rerun computes exactly seeds 1 and 2 and reuses 0 and 3."""
    monkeypatch.setenv("ADAPTCL_TOY_EVENTS", str(tmp_path / "events"))
    monkeypatch.setenv("ADAPTCL_TOY_FAIL", "d/base/seed1")
    monkeypatch.setenv("ADAPTCL_TOY_DIVERGE", "d/base/seed2")
    out = tmp_path / "out"
    argv = ["--output-dir", str(out), "--seeds", "0", "1", "2", "3", "--jobs", "2",
            "--no-progress"]
    assert _toy(argv) == 1
    err = capsys.readouterr().err
    failed_line = next(line for line in err.splitlines() if "d/base/seed1 failed" in line)
    assert "RuntimeError: boom in d/base/seed1" in failed_line
    log = Path(failed_line.split("(log: ")[1].rstrip(")"))
    assert log.is_file() and "boom in d/base/seed1" in log.read_text()
    assert err.strip().splitlines()[-1].startswith(
        "adaptcl toy: error: 1 of 4 runs failed: d/base/seed1 (RuntimeError: boom in "
        "d/base/seed1)")
    assert "1 of 4 runs diverged" in err.strip().splitlines()[-1]
    assert sorted(_stored(out)) == ["d/base/seed0", "d/base/seed3"]
    result = json.loads((out / "results.json").read_text())
    assert [f["cell"] for f in result["failed"]] == [cell("d", "base", 1).as_dict()]
    assert [d["cell"] for d in result["diverged"]] == [cell("d", "base", 2).as_dict()]
    assert result["failed"][0]["log"] == str(log)
    assert {r["execution"]["threads"] for r in _stored(out).values()} == {1}
    assert "> **FAILED**: 1 run failed (d/base/seed1;" in (out / "results.md").read_text()

    monkeypatch.delenv("ADAPTCL_TOY_FAIL")
    monkeypatch.delenv("ADAPTCL_TOY_DIVERGE")
    assert _toy(argv) == 0
    result = json.loads((out / "results.json").read_text())
    assert result["computed"] == [cell("d", "base", s).as_dict() for s in (1, 2)]
    assert result["reused"] == [cell("d", "base", s).as_dict() for s in (0, 3)]
    assert result["failed"] == [] and result["diverged"] == [] and result["complete"]
    assert "FAILED" not in (out / "results.md").read_text()


@pytest.mark.slow
def test_n_jobs_for_more_cells_start_n_processes_each_cell_once_records_as_sequential(
        tmp_path, monkeypatch, capsys):
    """6 cells with ``--jobs 2``: two jobs (two processes, two job folders), each working
    through its share of 3 cells; every cell computed once; records equal to the sequential
    run's. A cell failing in a chunk is named and the rest of its chunk is computed."""
    monkeypatch.setenv("ADAPTCL_TOY_EVENTS", str(tmp_path / "events"))
    seeds = ["--seeds", *map(str, range(6)), "--no-progress"]
    assert _toy([*seeds, "--output-dir", str(tmp_path / "seq")]) == 0
    capsys.readouterr()
    assert _toy([*seeds, "--output-dir", str(tmp_path / "par"), "--jobs", "2"]) == 0
    assert "6 runs to compute as 2 jobs of up to 3 runs each (local), 1 thread each" in \
        capsys.readouterr().err
    seq, par = _stored(tmp_path / "seq"), _stored(tmp_path / "par")
    assert sorted(par) == sorted(seq) == [f"d/base/seed{s}" for s in range(6)]
    assert {label: r["metrics"] for label, r in par.items()} == \
        {label: r["metrics"] for label, r in seq.items()}
    assert len({r["pid"] for r in par.values()}) == 2  # two processes for six cells
    jobs = {r["execution"]["job_id"] for r in par.values()}
    assert len(jobs) == 2 and sorted(p.name for p in (tmp_path / "par" / "jobs").iterdir()
                                     if p.is_dir()) == sorted(jobs)
    result = json.loads((tmp_path / "par" / "results.json").read_text())
    assert result["computed"] == [cell("d", "base", s).as_dict() for s in range(6)]
    assert not (tmp_path / "par" / "runs" / "superseded").exists()  # none computed twice

    monkeypatch.setenv("ADAPTCL_TOY_FAIL", "d/base/seed2")  # chunks: seeds 0 2 4 and 1 3 5
    assert _toy([*seeds, "--output-dir", str(tmp_path / "fail"), "--jobs", "2"]) == 1
    assert "adaptcl: d/base/seed2 failed: RuntimeError: boom in d/base/seed2" in \
        capsys.readouterr().err
    stored = _stored(tmp_path / "fail")
    assert sorted(stored) == [f"d/base/seed{s}" for s in (0, 1, 3, 4, 5)]
    assert stored["d/base/seed0"]["pid"] == stored["d/base/seed4"]["pid"]  # seed2's job


@pytest.mark.slow
def test_a_killed_job_keeps_what_it_stored_and_the_rerun_computes_only_the_rest(
        tmp_path, monkeypatch, capsys):
    """Two jobs of two cells each; once each job has stored its first cell and started its
    second, one job's processes are killed (SIGKILL): its stored cell is kept, its unfinished
    one is named as failed, the other job finishes; the rerun computes exactly that cell."""
    import os
    import signal

    events = tmp_path / "events"
    monkeypatch.setenv("ADAPTCL_TOY_EVENTS", str(events))
    monkeypatch.setenv("ADAPTCL_TOY_BLOCK", "2")
    out, killed = tmp_path / "out", []
    recipe = ToyRecipe(ToyConfig(output_dir=str(out), seeds=[0, 1, 2, 3]),
                       jobs=JobOptions(jobs=2))

    class Kill:  # at the first record: kill the job that stored it, then release the other
        def write(self, grid):
            if killed:
                return
            deadline = time.monotonic() + 60
            while len(list(events.glob("start-d_base_seed[23]"))) < 2:
                assert time.monotonic() < deadline, "the second cells did not start"
                time.sleep(0.05)
            first = next(iter(grid.records))
            controller = int(grid.records[first]["execution"]["job_id"])
            for pid in [*children([controller]), controller]:
                os.kill(pid, signal.SIGKILL)
            killed.append(first.seed + 2)
            (events / "go").touch()

    monkeypatch.setattr(recipe, "make_report", lambda: Kill())
    recipe.run()  # the command then exits 1 naming the failed cell (its failed_error)
    lost = f"d/base/seed{killed[0]}"
    assert [c.label() for c in recipe.grid.failed] == [lost]
    assert f"adaptcl: {lost} failed: its process ended without a result" in \
        capsys.readouterr().err
    assert sorted(_stored(out)) == sorted(f"d/base/seed{s}" for s in range(4)
                                          if s != killed[0])
    monkeypatch.delenv("ADAPTCL_TOY_BLOCK")
    rerun = ToyRecipe(ToyConfig(output_dir=str(out), seeds=[0, 1, 2, 3]),
                      jobs=JobOptions(jobs=2))
    rerun.run()
    assert [c.label() for c in rerun.grid.computed] == [lost]
    assert len(rerun.grid.reused) == 3


@pytest.mark.slow
def test_an_interrupted_run_cancels_its_jobs_and_the_rerun_computes_only_the_rest(
        tmp_path, monkeypatch):
    """Seeds 0 and 1 finish; seeds >= 2 wait; the parent is interrupted at the first record
    (Ctrl-C while collecting): the waiting jobs are cancelled, nothing of theirs is stored,
    and the rerun computes exactly the cells without a record."""
    events = tmp_path / "events"
    monkeypatch.setenv("ADAPTCL_TOY_EVENTS", str(events))
    monkeypatch.setenv("ADAPTCL_TOY_BLOCK", "2")
    out = tmp_path / "out"
    recipe = ToyRecipe(ToyConfig(output_dir=str(out), seeds=[0, 1, 2, 3]),
                       jobs=JobOptions(jobs=2))

    class Interrupt:  # Ctrl-C once a waiting job is computing
        def write(self, grid):
            deadline = time.monotonic() + 60
            while not any(events.glob("start-d_base_seed[23]")):
                assert time.monotonic() < deadline, "no waiting job started"
                time.sleep(0.05)
            raise KeyboardInterrupt

    monkeypatch.setattr(recipe, "make_report", lambda: Interrupt())
    with pytest.raises(KeyboardInterrupt):
        recipe.run()
    stored = set(_stored(out))
    assert stored and stored <= {"d/base/seed0", "d/base/seed1"}
    (events / "go").touch()  # a waiting job not cancelled would finish and store now
    time.sleep(2)
    assert not any(events.glob("end-d_base_seed[23]"))
    assert set(_stored(out)) == stored
    monkeypatch.delenv("ADAPTCL_TOY_BLOCK")
    rerun = ToyRecipe(ToyConfig(output_dir=str(out), seeds=[0, 1, 2, 3]),
                      jobs=JobOptions(jobs=2))
    rerun.run()
    computed = {c.label() for c in rerun.grid.computed}
    assert computed == {f"d/base/seed{s}" for s in range(4)} - stored
    assert {c.label() for c in rerun.grid.reused} == stored


@pytest.mark.slow
def test_tu_with_two_jobs_is_bitwise_the_sequential_run(shared_data, tmp_path, capsys):
    """``adaptcl tu --datasets MUTAG --seeds 0 1 2 3 --jobs 2`` (issue 27): every metric, loss and
    summary equal (``==``) to the sequential run's, both at one thread per cell."""
    common = ["tu", "--data-root", str(shared_data), "--datasets", "MUTAG", "--seeds", "0", "1",
              "2", "3", "--epochs", "1", "--threads", "1", "--no-progress", "--no-plot"]
    assert cli.main([*common, "--output-dir", str(tmp_path / "seq")]) == 0
    assert cli.main([*common, "--output-dir", str(tmp_path / "par"), "--jobs", "2"]) == 0
    assert "8 runs to compute as 2 jobs of up to 4 runs each (local), 1 thread each" in \
        capsys.readouterr().err
    seq, par = _stored(tmp_path / "seq"), _stored(tmp_path / "par")
    assert len(seq) == 8 and sorted(seq) == sorted(par)
    for label in seq:
        assert par[label]["metrics"] == seq[label]["metrics"], label
        assert par[label]["losses"] == seq[label]["losses"], label
        assert par[label]["evaluation"] == seq[label]["evaluation"], label
        assert par[label]["execution"]["threads"] == 1 and "execution" not in seq[label]
    pids = {r["execution"]["job_id"] for r in par.values()}
    assert len(pids) == 2  # one job per share of cells, not per cell
    jobs = tmp_path / "par" / "jobs"  # a folder per job; not submitit's empty template "%j"
    assert sorted(p.name for p in jobs.iterdir() if p.is_dir()) == sorted(map(str, pids))
    results = [json.loads((tmp_path / d / "results.json").read_text()) for d in ("seq", "par")]
    assert results[0]["summary"] == results[1]["summary"]
    assert "MUTAG/dcl/seed0" in seq


def _alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie awaiting its reaper does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_sigterm_to_the_parent_cancels_its_jobs_and_keeps_what_finished(shared_data, tmp_path):
    """``kill`` / ``timeout`` / a scheduler's stop end a ``--jobs`` run as Ctrl-C does: the
    running jobs are cancelled (no process left computing), the live-run entry is removed,
    one line says what happened, exit status 143. Started as ``adaptcl ... &`` from a script
    starts it, with SIGINT ignored: submitit cancels a local job with SIGINT, so the jobs
    must not inherit that."""
    import signal
    import subprocess
    import sys

    out = tmp_path / "out"
    env = env_with_src()
    proc = subprocess.Popen(
        [sys.executable, "-m", "adaptcl", "tu", "--data-root", str(shared_data), "--datasets",
         "MUTAG", "--seeds", "0", "1", "2", "3", "--epochs", "50", "--jobs", "2",
         "--no-progress", "--no-plot", "--output-dir", str(out)],
        env=env, cwd=str(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))  # noqa: PLW1509
    deadline = time.monotonic() + 120
    while not (out / "jobs").is_dir() or len([p for p in (out / "jobs").iterdir()
                                              if p.name.isdigit()]) < 2:
        assert proc.poll() is None and time.monotonic() < deadline, "no two jobs started"
        time.sleep(0.2)
    controllers = [int(p.name) for p in (out / "jobs").iterdir() if p.name.isdigit()]
    while len(children(controllers)) < 2:  # each controller runs its cell in a child
        assert time.monotonic() < deadline, "the jobs' cells did not start"
        time.sleep(0.2)
    jobs = controllers + children(controllers)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-3000:]
    assert "Traceback" not in err, err[-3000:]  # the cancelled controllers' are in their log
    assert "KeyboardInterrupt" in (out / "jobs" / "controllers.log").read_text()
    assert err.strip().splitlines()[-1] == (
        f"adaptcl tu: terminated (SIGTERM); finished runs are kept under {out}/runs: rerun the "
        "same command to resume")
    assert not [pid for pid in jobs if _alive(pid)]  # cancelled before the command returned
    assert not list((out / "runs" / ".active").glob("*.json"))  # the live-run entry is gone
    time.sleep(3)  # a job left running would store its cell (one takes ~5 s here)
    assert not list((out / "runs").glob("MUTAG/*/seed*.json"))


def test_a_job_killed_before_its_result_is_named_as_such():
    from submitit.core.utils import UncompletedJobError

    from adaptcl.recipes.engine.jobs import job_failure

    class Killed:
        paths = type("Paths", (), {"stderr": "/x/jobs/2770/2770_0_log.err"})()

        def exception(self):
            return UncompletedJobError("Job 2770 (task: 0) with path /x/jobs/2770/2770_0_result"
                                       ".pkl\nhas not produced any output (state: FINISHED)")

    reason, log = job_failure(Killed())
    assert reason == ("its process ended without a result (killed, or out of memory or time); "
                      "submitit: Job 2770 (task: 0) with path /x/jobs/2770/2770_0_result.pkl")
    assert log == "/x/jobs/2770/2770_0_log.err"
