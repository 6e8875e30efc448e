"""``fit`` as the recipes run Lightning: an interrupt comes out as it went in (one line, exit
130 / 143, SIGINT's handler back), and the death of another process is one line naming it."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("pytorch_lightning")
pytest.importorskip("torch_geometric")

from adaptcl import cli  # noqa: E402
from adaptcl.adapters.graphcl.lightning import GraphCLModule  # noqa: E402
from adaptcl.recipes.common.lightning import fit  # noqa: E402
from adaptcl.recipes.engine import RunStopped  # noqa: E402


@pytest.mark.parametrize("stop, code, how", [(KeyboardInterrupt, 130, "interrupted"),
                                             (cli.Terminated, 143, "terminated (SIGTERM)")])
def test_an_interrupt_under_lightning_is_one_line_and_sigint_comes_back(
        stop, code, how, shared_data, tmp_path, capsys, monkeypatch):
    steps = []

    def step(self, batch, batch_idx):  # Ctrl-C (or SIGTERM, as the CLI raises it) at step 2
        steps.append(batch_idx)
        if len(steps) == 2:
            raise stop
        return original(self, batch, batch_idx)

    original = GraphCLModule.training_step
    monkeypatch.setattr(GraphCLModule, "training_step", step)
    handler = signal.getsignal(signal.SIGINT)
    out = tmp_path / "out"
    assert cli.main(["tu", "--data-root", str(shared_data), "--datasets", "MUTAG", "--seeds",
                     "0", "--losses", "macl", "--output-dir", str(out), "--no-progress"]) == code
    assert capsys.readouterr().err.strip().splitlines() == [
        f"adaptcl tu: {how}; finished runs are kept under {out}/runs: rerun the same command to "
        "resume"]
    assert signal.getsignal(signal.SIGINT) is handler  # Lightning leaves it ignored


class _Trainer:
    """What ``fit`` reads of a trainer whose run lost its other process."""

    world_size, global_rank = 2, 0

    def __init__(self) -> None:
        self.callbacks: list = []

    def fit(self, *args, **kwargs) -> None:
        raise RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Read error "
                           "[127.0.0.1]:29500: Connection reset by peer")


def test_the_death_of_another_rank_is_a_run_stopped_naming_it():
    with pytest.raises(RunStopped, match=r"^rank 1 of 2 processes stopped \(it was killed or "
                                         r"crashed; its own output says why\), so rank 0 "):
        fit(_Trainer(), None)
    alone = _Trainer()
    alone.world_size = 1  # one process: a gloo error is a crash of its own, kept as it is
    with pytest.raises(RuntimeError, match="Connection reset by peer"):
        fit(alone, None)


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError):  # it ended between the two reads
        return b""


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_a_killed_rank_stops_the_other_with_one_line(shared_data, tmp_path):
    from tests.recipes._process import children, env_with_src

    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "adaptcl", "tu", "--devices", "2", "--strategy", "ddp",
         "--device", "cpu", "--data-root", str(shared_data), "--datasets", "MUTAG", "--seeds",
         "0", "--losses", "macl", "--epochs", "5000", "--no-progress", "--output-dir", str(out)],
        env=env_with_src(OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1"), cwd=str(tmp_path),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)
    reader.start()
    deadline = time.monotonic() + 240
    rank1: list[int] = []
    while not (rank1 and any("GLOBAL_RANK: 1, MEMBER: 2/2" in line for line in lines)):
        assert proc.poll() is None and time.monotonic() < deadline, "".join(lines)[-2000:]
        time.sleep(0.5)
        rank1 = [c for c in children([proc.pid]) if b"adaptcl" in _cmdline(c)]
    # both ranks in the training loop: 5000 epochs take many minutes on any CPU (200 took
    # under 15 s on CI's), so the kill lands in training, not before it nor after the run
    time.sleep(10)
    assert proc.poll() is None, "".join(lines)[-2000:]
    subprocess.run(["kill", "-9", str(rank1[0])], check=True)
    proc.wait(timeout=120)
    reader.join(timeout=30)
    err = "".join(lines)
    assert proc.returncode == 1, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert err.strip().splitlines()[-1] == (
        "adaptcl tu: rank 1 of 2 processes stopped (it was killed or crashed; its own output "
        f"says why), so rank 0 stopped too; finished runs are kept under {out}/runs: rerun the "
        "same command to resume")
