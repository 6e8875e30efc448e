"""Progress: a bar on a terminal; off one, a line per finished run and nothing from inside a run."""

from __future__ import annotations

import io

from adaptcl.recipes.engine import progress as progress_module
from adaptcl.recipes.engine.progress import on_terminal, progress


class _Stream(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def test_off_a_terminal_the_grid_prints_a_line_per_run_and_a_run_prints_nothing(monkeypatch):
    stream = _Stream(tty=False)
    monkeypatch.setattr(progress_module.sys, "stderr", stream)
    grid = progress(total=3, initial=1, desc="tu runs", leave=True)
    grid.set_postfix_str("MUTAG/macl/seed0")
    grid.update(1)
    grid.set_postfix_str("MUTAG/macl/seed1")
    grid.update(1)
    epochs = progress(range(20), desc="MUTAG/macl/seed1")
    assert list(epochs) == list(range(20))
    epochs.set_postfix(loss="0.1")
    assert stream.getvalue().splitlines() == ["adaptcl: tu runs: 2/3 (MUTAG/macl/seed0)",
                                              "adaptcl: tu runs: 3/3 (MUTAG/macl/seed1)"]
    assert not on_terminal(True)
    monkeypatch.setattr(progress_module.sys, "stderr", _Stream(tty=True))
    assert on_terminal(True) and not on_terminal(False)
    assert type(progress(total=2, desc="x", leave=True)).__name__ == "tqdm_asyncio"
