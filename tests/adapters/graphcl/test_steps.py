"""The step both GraphCL loops share (train_epoch and GraphCLModule): numbering, when a
non-finite loss is noticed, and what reaches the history."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch_geometric")

from torch_geometric.data import Batch, Data  # noqa: E402

from adaptcl.adapters.graphcl.steps import StepRecorder  # noqa: E402
from adaptcl.plugins.validation import NonFiniteError  # noqa: E402


def _views(n: int):
    graphs = [Data(x=torch.ones(2, 1), edge_index=torch.tensor([[0, 1], [1, 0]]))
              for _ in range(n)]
    return Batch.from_data_list(graphs), Batch.from_data_list(graphs)


def test_steps_are_numbered_on_from_a_resumed_run_and_weighted_by_graphs():
    steps = StepRecorder("run", first_step=5)
    assert not steps.takes_step(_views(1)) and steps.takes_step(_views(1), negatives_elsewhere=True)
    for value, graphs in ((2.0, 4), (1.0, 2)):
        loss = steps.loss(lambda *v, value=value: torch.tensor(value), _views(graphs))
        steps.record(loss, graphs, torch.nn.Linear(1, 1), step=float(steps.step))
    history: list[dict[str, float]] = [{"step": 4.0, "loss": 9.0}]
    assert steps.flush(into=history) == history[1:]
    assert history[1:] == [{"step": 5.0, "loss": 2.0}, {"step": 6.0, "loss": 1.0}]
    assert steps.mean_loss() == pytest.approx((2.0 * 4 + 1.0 * 2) / 6)


def test_a_non_finite_loss_read_on_the_host_stops_at_its_step():
    steps = StepRecorder("MUTAG/macl/seed0", sync_each_step=True)
    steps.loss(lambda *v: torch.tensor(1.0), _views(2))
    with pytest.raises(NonFiniteError, match="non-finite loss on MUTAG/macl/seed0 at step 2") \
            as excinfo:
        steps.loss(lambda *v: torch.tensor(float("inf")), _views(2))
    assert (excinfo.value.step, excinfo.value.loss) == (2, float("inf"))


def test_a_non_finite_loss_left_on_the_device_raises_at_the_flush_after_keeping_the_rows():
    steps = StepRecorder("run", sync_each_step=False)
    for value in (1.0, float("nan"), 3.0):
        loss = steps.loss(lambda *v, value=value: torch.tensor(value), _views(2))
        steps.record(loss, 2, torch.nn.Linear(1, 1))
    history: list[dict[str, float]] = []
    with pytest.raises(NonFiniteError, match="non-finite loss on run by step 3"):
        steps.flush(into=history)
    assert [row["loss"] for row in history][::2] == [1.0, 3.0] and len(history) == 3
