"""AMCL's max-negative form degenerates when the positive and the hardest negative share one
temperature (issue 16): the regulariser cancels and the temperature runs to a bound that only
the sign of ``s_hardest_negative - s_positive`` picks, whatever beta is.

Only the temperature network learns, on fixed tiny embeddings. Its ``phi`` weight is frozen at
zero, so ``phi(x) = b`` for every sample and every pair gets the one temperature
``iota * sigmoid(-|b|^2) + eta``: the limit of a shared pair network that no longer tells pairs
apart. Since ``|b|^2 >= 0`` its largest value is the sigmoid's midpoint ``eta + iota / 2``.
"""

from __future__ import annotations

import pytest
import torch

from adaptcl.plugins import AMCLLoss, PairTemperature

DIM, N = 8, 4
ETA, IOTA = 1e-5, 2.0
MIDPOINT = ETA + IOTA / 2


def _batch(kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``aligned``: each positive is the closest candidate; ``swapped``: each positive sits next
    to another sample's anchor, so the hardest negative is closer than the positive."""
    g = torch.Generator().manual_seed(0)
    base = torch.eye(DIM)[:N] + 0.05 * torch.randn(N, DIM, generator=g)
    partner = base if kind == "aligned" else base.roll(1, 0)
    return base, partner + 0.05 * torch.randn(N, DIM, generator=g)


def _shared_temperature_net() -> PairTemperature:
    net = PairTemperature(DIM, eta=ETA, iota=IOTA)
    with torch.no_grad():
        net.phi.weight.zero_()
        net.phi.bias.fill_(0.3)
    net.phi.weight.requires_grad_(False)
    return net


def _learned_temperature(kind: str, beta: float, negative_term: str = "topk",
                         steps: int = 200) -> float:
    z0, z1 = _batch(kind)
    net = _shared_temperature_net()
    loss_fn = AMCLLoss(net, beta, negative_term=negative_term, kappa=1,
                       bound_warning_steps=None)
    opt = torch.optim.Adam([net.phi.bias], lr=0.05)
    for _ in range(steps):
        opt.zero_grad()
        loss_fn(z0, z1).backward()
        opt.step()
    return loss_fn.last_stats["temperature"].item()


def _hardest_negative_minus_positive(kind: str) -> torch.Tensor:
    z0, z1 = (torch.nn.functional.normalize(z, dim=1) for z in _batch(kind))
    views = torch.cat([z0, z1])
    sims = views @ views.T
    sims.fill_diagonal_(-float("inf"))
    positive = torch.cat([(z0 * z1).sum(1), (z0 * z1).sum(1)])
    sims[torch.arange(2 * N), torch.arange(2 * N).roll(N)] = -float("inf")
    return sims.max(dim=1).values - positive


def test_constructed_batches_have_the_intended_sign_of_hardest_negative_minus_positive():
    assert (_hardest_negative_minus_positive("aligned") < 0).all()
    assert (_hardest_negative_minus_positive("swapped") > 0).all()


@pytest.mark.parametrize("negative_term", ["topk", "softmax"])
@pytest.mark.parametrize("kind", ["aligned", "swapped"])
def test_regulariser_cancels_exactly_when_positive_and_negative_temperatures_are_equal(
        kind, negative_term):
    """``beta Omega(tau+) - beta Omega(tau-)`` is exactly zero: the loss does not depend on
    beta. In the soft-max form Omega factors out of the log-sum-exp, so it cancels too."""
    z0, z1 = _batch(kind)
    net = _shared_temperature_net()
    losses = [AMCLLoss(net, beta, negative_term=negative_term)(z0, z1)
              for beta in (0.0, 1e-3, 1.0, 10.0)]
    for loss in losses[1:]:
        torch.testing.assert_close(loss, losses[0], rtol=1e-6, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "bound"), [("aligned", ETA), ("swapped", MIDPOINT)])
def test_shared_temperature_runs_to_the_bound_set_by_the_sign_whatever_beta(kind, bound):
    """Positive closer than the hardest negative: ``(s- - s+) / tau`` falls as tau -> 0, the
    floor eta. Hardest negative closer: it falls as tau grows, to the largest temperature the
    shared network reaches (the sigmoid's midpoint). beta from 1e-5 to 1 changes nothing."""
    for beta in (1e-5, 1e-2, 1.0):
        tau = _learned_temperature(kind, beta)
        assert tau == pytest.approx(bound, rel=1e-3, abs=1e-6), (kind, beta, tau)


def test_softmax_negative_form_with_a_shared_temperature_degenerates_the_same_way():
    """The soft-max term (Eq. 7) is no cure once the temperature is shared: Omega cancels
    there too, and on these fixed embeddings it reaches the same bounds."""
    assert _learned_temperature("aligned", 1e-3, "softmax") == pytest.approx(ETA, rel=1e-3)
    assert _learned_temperature("swapped", 1e-3, "softmax") == pytest.approx(MIDPOINT, rel=1e-3)


def test_paper_config_builds_a_working_three_head_top_100_loss_with_the_papers_settings():
    from adaptcl.plugins import MultiHeadProjection
    from adaptcl.plugins.amcl import AMCL_PAPER, AMCL_PAPER_BETA_RANGE

    loss_fn = AMCLLoss.paper_config(dim=16)
    assert (loss_fn.negative_term, loss_fn.kappa, loss_fn.objective) == ("topk", 100, "nt_xent")
    assert loss_fn.beta == 1.0 and AMCL_PAPER_BETA_RANGE[0] <= loss_fn.beta <= AMCL_PAPER_BETA_RANGE[1]
    net = loss_fn.temperature_net
    assert isinstance(net, PairTemperature) and (net.eta, net.iota) == (1e-5, 2.0)
    torch.manual_seed(0)
    heads = MultiHeadProjection(24, 24, 16, num_heads=AMCL_PAPER["num_heads"])
    z0, z1 = heads(torch.randn(64, 24)), heads(torch.randn(64, 24))
    assert z0.shape == (3, 64, 16)
    loss = loss_fn(z0, z1)
    loss.backward()
    assert torch.isfinite(loss)
    assert net.phi.weight.grad is not None and net.phi.weight.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="kappa=100"):  # 2 * 32 - 2 = 62 negatives per anchor
        loss_fn(z0[:, :32], z1[:, :32])


def test_paper_config_overrides_replace_settings_and_unknown_keywords_are_rejected():
    assert AMCLLoss.paper_config(dim=8, kappa=150, iota=5.0).kappa == 150
    assert AMCLLoss.paper_config(dim=8, iota=5.0).temperature_net.iota == 5.0
    with pytest.raises(TypeError, match="temprature"):
        AMCLLoss.paper_config(dim=8, temprature=0.1)


@pytest.mark.slow
def test_paper_config_keys_are_keywords_of_both_adapters():
    import inspect

    pytest.importorskip("lightly")
    pytest.importorskip("sentence_transformers")
    from adaptcl.adapters import sentence_transformers as st_adapter
    from adaptcl.adapters.lightly.loss import AMCLLoss as LightlyAMCLLoss
    from adaptcl.plugins.amcl import AMCL_PAPER

    lightly_loss = LightlyAMCLLoss(dim=16, **AMCL_PAPER)
    assert lightly_loss(torch.randn(3, 64, 16), torch.randn(3, 64, 16)).isfinite()
    assert set(AMCL_PAPER) <= set(inspect.signature(st_adapter.AMCLLoss).parameters)


def _loss_with_temperature_at(bias: float, steps: int | None = 5) -> AMCLLoss:
    """A loss whose shared temperature is fixed by ``phi``'s bias: large -> the floor eta."""
    net = _shared_temperature_net()
    with torch.no_grad():
        net.phi.bias.fill_(bias)
    return AMCLLoss(net, 1e-3, bound_warning_steps=steps)


def _steps(loss_fn: AMCLLoss, count: int) -> None:
    z0, z1 = _batch("aligned")
    for _ in range(count):
        loss_fn(z0, z1).backward()


def test_bound_warning_fires_once_after_the_configured_number_of_steps_at_the_floor():
    import warnings

    loss_fn = _loss_with_temperature_at(bias=10.0)  # <phi, phi> = 800, clamped: tau = eta
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _steps(loss_fn, 4)
        assert caught == []
        _steps(loss_fn, 1)
        assert [w.category for w in caught] == [RuntimeWarning]
        assert "sat at a bound" in str(caught[0].message)
        assert "5 consecutive training steps" in str(caught[0].message)
        _steps(loss_fn, 20)
    assert len(caught) == 1


def test_bound_warning_stays_silent_when_temperatures_are_inside_or_it_is_disabled():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _steps(_loss_with_temperature_at(bias=0.3), 12)  # tau = 2 sigmoid(-0.72) ~ 0.65
        _steps(_loss_with_temperature_at(bias=10.0, steps=None), 12)
        evaluating = _loss_with_temperature_at(bias=10.0).eval()
        _steps(evaluating, 12)


def test_bound_warning_counts_consecutive_steps_only():
    """Four steps at the floor, one inside, four at the floor: never five in a row."""
    import warnings

    loss_fn = _loss_with_temperature_at(bias=10.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _steps(loss_fn, 4)
        with torch.no_grad():
            loss_fn.temperature_net.phi.bias.fill_(0.3)
        _steps(loss_fn, 1)
        with torch.no_grad():
            loss_fn.temperature_net.phi.bias.fill_(10.0)
        _steps(loss_fn, 4)


def test_bound_tracking_reads_the_device_counter_once_per_window_only():
    from .test_devices import HostSyncDetector

    loss_fn = _loss_with_temperature_at(bias=10.0, steps=3)
    loss_fn.check_finite = False  # its own CPU read is not what this test counts
    z0, z1 = _batch("aligned")
    reads = []
    with pytest.warns(RuntimeWarning, match="3 consecutive training steps"):
        for _ in range(6):
            with HostSyncDetector() as detector:
                loss_fn(z0, z1)
            reads.append(len(detector.calls))
    assert reads == [0, 0, 1, 0, 0, 0]  # warned at step 3, no reads after


# ---------------------------------------------------------------- the default, as it trains


def _train_on_digits(steps: int = 150, **loss_kwargs) -> list[tuple[float, float]]:
    """A small MLP encoder, AMCL's two heads and its temperature network trained SimCLR-style
    on augmented scikit-learn digits (the demo's data and views): (tau+, tau-) per step."""
    from adaptcl.plugins import MultiHeadProjection
    from adaptcl.recipes.demo.data import augment, load_digits_split

    images = load_digits_split(0.25, 0)[0]
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    encoder = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 128),
                                  torch.nn.ReLU(), torch.nn.Linear(128, 64))
    heads = MultiHeadProjection(64, 64, 32, num_heads=2)
    loss_fn = AMCLLoss(PairTemperature(32), bound_warning_steps=None, **loss_kwargs)
    params = [*encoder.parameters(), *heads.parameters(), *loss_fn.parameters()]
    opt = torch.optim.Adam(params, lr=1e-3)
    history = []
    for _ in range(steps):
        x = images[torch.randint(len(images), (128,), generator=g)]
        loss = loss_fn(heads(encoder(augment(x, g))), heads(encoder(augment(x, g))))
        opt.zero_grad()
        loss.backward()
        opt.step()
        history.append((float(loss_fn.last_stats["temperature"]),
                        float(loss_fn.last_stats["negative_temperature"])))
    return history


def _late_means(history: list[tuple[float, float]]) -> tuple[float, float]:
    late = history[-25:]
    return sum(p for p, _ in late) / len(late), sum(n for _, n in late) / len(late)


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
def test_default_soft_max_form_trains_with_temperatures_apart_and_away_from_the_bounds():
    """The default (Eq. 7 soft-max negatives) as on the CIFAR subset: the pair network gives
    positives and negatives different temperatures, both well inside (eta, midpoint)."""
    tau_pos, tau_neg = _late_means(_train_on_digits())
    assert 0.05 < tau_pos < 0.4, tau_pos
    assert tau_pos + 0.03 < tau_neg < 0.5, (tau_pos, tau_neg)


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
def test_top_1_form_parks_both_temperatures_together_at_the_midpoint_while_training():
    """The old default (Table 2.1 max, kappa 1) on the same data and seed: tau+ = tau- near
    ``eta + iota / 2``, the degeneracy of the fixed-embedding tests, in a real training run."""
    tau_pos, tau_neg = _late_means(_train_on_digits(negative_term="topk", kappa=1))
    assert tau_pos > 0.9 and abs(tau_pos - tau_neg) < 0.01, (tau_pos, tau_neg)


def test_top_kappa_negative_term_is_unbounded_below_when_beta_exceeds_the_similarity():
    """Why the paper configuration (beta 1, top-100) ran away on CIFAR: a negative's term
    ``(s - beta)/tau - beta (d/2) log tau`` falls without bound as its temperature goes to eta
    whenever beta > s, so the loss is minimised by sending negative temperatures to eta."""
    from adaptcl.plugins.amcl import pair_term

    s, dim = torch.tensor(0.5, dtype=torch.float64), 128
    taus = torch.logspace(-5, 0.3, 200, dtype=torch.float64)  # eta .. 2 (the paper's bounds)
    with_paper_beta = pair_term(s, taus, 1.0, dim)
    assert int(with_paper_beta.argmin()) == 0 and float(with_paper_beta[0]) < -4e4
    assert bool((with_paper_beta[:50].diff() > 0).all())  # falling all the way down to eta
    with_small_beta = pair_term(s, taus, 1e-3, dim)  # s > beta: bounded, smallest at the top
    assert int(with_small_beta.argmin()) == len(taus) - 1
