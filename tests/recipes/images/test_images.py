"""The images recipe: data loading, settings (presets, derived defaults, sweeps), the command
line and a tiny real run (kNN and the linear probe: tests/evaluation/test_images.py)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

pytest.importorskip("lightly")
pytest.importorskip("pytorch_lightning")

from adaptcl.recipes.engine import RecipeError, Sweep  # noqa: E402
from adaptcl.recipes.engine.command_line import parse  # noqa: E402
from adaptcl.recipes.images import train  # noqa: E402
from adaptcl.recipes.images.config import PRESETS, ImagesConfig  # noqa: E402
from adaptcl.recipes.images.data import (  # noqa: E402
    ArrayImageDataset,
    load_image_splits,
    load_npz_arrays,
)
from adaptcl.recipes.images.recipe import ImagesRecipe  # noqa: E402

# ---------------------------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------------------------


def test_npz_cifar_splits_from_the_shared_data(shared_data):
    splits = load_image_splits(shared_data, train_limit=200, test_limit=100)
    assert "lossless" in splits.source and splits.name == "cifar10"  # exact pixels first
    assert len(splits.train) == 200 and len(splits.test) == 100
    counts = np.bincount(splits.train.labels, minlength=10)
    assert counts.min() == counts.max() == 20  # class-stratified subset
    image, label = splits.train[0]
    assert image.size == (32, 32) and 0 <= label < 10
    big = load_image_splits(shared_data, train_limit=5000, test_limit=2000)
    assert "jpeg" in big.source and len(big.train) == 5000
    assert big.fingerprint["sha256"] != splits.fingerprint["sha256"]


def test_array_dataset_validation_and_multi_view_transform():
    images = np.zeros((4, 8, 8, 3), np.uint8)
    data = ArrayImageDataset(images, [0, 1, 2, 3], transform=lambda im: [im, im])
    views, label = data[1]
    assert len(views) == 2 and label == 1
    with pytest.raises(ValueError, match="uint8"):
        ArrayImageDataset(images.astype(np.float32), [0, 1, 2, 3])
    with pytest.raises(ValueError, match="labels"):
        ArrayImageDataset(images, [0, 1])
    with pytest.raises(ValueError, match="shape"):
        ArrayImageDataset(np.zeros((4, 8, 8), np.uint8), [0, 1, 2, 3])


def test_npz_and_folder_sources_and_missing_data(tmp_path):
    from PIL import Image

    rng = np.random.default_rng(0)
    imgs = rng.integers(0, 255, (20, 32, 32, 3), dtype=np.uint8)
    labels = np.repeat(np.arange(2), 10).astype(np.uint8)
    npz_dir = tmp_path / "npz"
    npz_dir.mkdir()
    np.savez(npz_dir / "cifar10_train_lossless_0-19.npz", images=imgs, labels=labels)
    np.savez(npz_dir / "cifar10_test_lossless_0-9.npz", images=imgs[:10], labels=labels[:10])
    splits = load_image_splits(npz_dir, source="npz", npz_variant="lossless")
    assert len(splits.train) == 20 and len(splits.test) == 10
    x, y = load_npz_arrays(sorted(npz_dir.glob("*.npz")))
    assert x.shape == (30, 32, 32, 3)

    folder = tmp_path / "pets"
    for split in ("train", "val"):
        for cls in ("cat", "dog"):
            (folder / split / cls).mkdir(parents=True)
            for i in range(3):
                Image.fromarray(imgs[i]).save(folder / split / cls / f"{i}.png")
    splits = load_image_splits(folder, train_limit=4)
    assert splits.source.startswith("image folder") and splits.num_classes == 2
    assert splits.name == "pets"  # the table's row: the folder's name
    assert len(splits.train) == 4 and len(splits.test) == 6
    image, label = splits.train.with_transform(lambda im: im.size)[0]
    assert image == (32, 32) and label in (0, 1)

    with pytest.raises(FileNotFoundError, match="no image data"):
        load_image_splits(tmp_path / "npz" / "..")
    with pytest.raises(FileNotFoundError, match="cifar-10-batches-py"):
        load_image_splits(npz_dir, source="torchvision")


def test_torchvision_cifar_is_read_in_place_and_downloaded_only_when_asked(tmp_path,
                                                                         monkeypatch):
    import torchvision.datasets

    calls = []

    class FakeCIFAR10:  # torchvision's class checks the real files' md5 sums
        def __init__(self, root, train, download):
            calls.append((root, train, download))
            rng = np.random.default_rng(int(train))
            self.data = rng.integers(0, 255, (40, 32, 32, 3), dtype=np.uint8)
            self.targets = list(np.repeat(np.arange(10), 4))

    monkeypatch.setattr(torchvision.datasets, "CIFAR10", FakeCIFAR10)
    (tmp_path / "local" / "cifar10" / "cifar-10-batches-py").mkdir(parents=True)
    splits = load_image_splits(tmp_path / "local", train_limit=20, download=True)
    local = str(tmp_path / "local" / "cifar10")
    assert calls == [(local, True, False), (local, False, False)]  # found: no download
    assert splits.source == f"torchvision CIFAR10 at {local}" and splits.name == "cifar10"
    assert (len(splits.train), len(splits.test)) == (20, 40)
    assert np.bincount(splits.train.labels).tolist() == [2] * 10
    calls.clear()
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no image data"):
        load_image_splits(tmp_path / "empty")
    assert calls == []
    load_image_splits(tmp_path / "empty", download=True)
    assert calls == [(str(tmp_path / "empty"), True, True), (str(tmp_path / "empty"), False, True)]


# ---------------------------------------------------------------------------------------------
# settings and the command line
# ---------------------------------------------------------------------------------------------


def _config(*argv: str) -> ImagesConfig:
    return parse(ImagesRecipe, list(argv), "adaptcl images").sweep.base


def test_presets_and_derived_defaults():
    cpu = ImagesConfig()  # the defaults are the CPU preset
    assert (cpu.backbone, cpu.width, cpu.epochs, cpu.train_limit) == ("resnet-18", 0.125, 15, 4000)
    assert dataclasses.asdict(_config("--preset", "cpu")) == dataclasses.asdict(cpu)
    paper = _config("--preset", "paper")
    assert (paper.backbone, paper.width, paper.epochs, paper.batch_size) == ("resnet-18", 1.0,
                                                                             200, 512)
    assert paper.optimizer == "adam" and paper.lr == pytest.approx(1e-3 * 512 / 256)
    assert paper.train_limit is None and paper.temperature == 0.1 and paper.a0 == 0.0
    assert _config("--preset", "paper", "--epochs", "3").epochs == 3
    assert set(PRESETS) == {"cpu", "paper"} and list(ImagesRecipe.presets)[0] == "cpu"
    moco = ImagesConfig(method="moco")
    assert (moco.temperature, moco.macl_temperature, moco.a0) == (0.2, 0.15, 0.2)
    assert ImagesConfig(method="moco", temperature=0.3).macl_temperature == 0.3
    assert ImagesConfig(method="moco", macl_temperature=0.4).temperature == 0.2
    full = ImagesConfig(full_data=True, train_limit=300)
    assert (full.train_limit, full.test_limit) == (None, None)


def test_the_temperature_schedule_runs_five_periods_per_training_by_default():
    cfg = ImagesConfig(losses=["infonce", "temperature_schedule"], epochs=10)
    assert cfg.schedule_period == 2.0  # a fifth of the epochs
    module = train.build_module(cfg, "temperature_schedule", num_classes=10, steps_per_epoch=7)
    core = module.criterion.criterion
    assert (core.min_temperature, core.max_temperature, core.period) == (0.1, 1.0, 14)
    with pytest.raises(ValueError, match="max_temperature"):
        ImagesConfig(losses=["temperature_schedule"], temperature=0.5, max_temperature=0.3)


def test_the_modules_settings_come_from_the_config_in_one_place():
    """Every field of the module's settings is the setting of the same name, or one of the
    few derived from the data, the strategy and the schedule's period."""
    from adaptcl.adapters.lightning import SSLModuleSettings

    fields = {f.name for f in dataclasses.fields(ImagesConfig)}
    assert set(SSLModuleSettings.field_names()) - fields == set(train.DERIVED)
    cfg = ImagesConfig(method="moco", kappa=3, beta=0.01, strategy="ddp", epochs=10,
                       optimizer="sgd", lr=0.03)
    settings = train.module_settings(cfg, num_classes=7, steps_per_epoch=5)
    for name in SSLModuleSettings.field_names():
        if name not in train.DERIVED:
            assert getattr(settings, name) == getattr(cfg, name), name
    assert (settings.num_classes, settings.gather_distributed, settings.period) == (7, True, 10)
    assert settings.dystress_max_temperature is None  # DySTreSS's default: twice tau
    module = train.build_module(cfg, "macl", num_classes=7, steps_per_epoch=5)
    assert (module.criterion.temperature, module.lr, module.num_classes) == (0.15, 0.03, 7)


def test_the_npz_variants_a_config_offers_are_the_copies_the_loader_reads():
    from adaptcl.recipes.common.cifar import NPZ_PATTERNS
    from adaptcl.recipes.common.cifar_settings import NPZ_VARIANTS

    assert NPZ_VARIANTS == tuple(NPZ_PATTERNS)


def test_a_module_setting_no_loss_accepts_is_refused_before_any_work(shared_data, tmp_path):
    with pytest.raises(ValueError, match="^kappa must be a number >= 1, got 0"):  # declared
        ImagesConfig(data_root=str(shared_data), output_dir=str(tmp_path), kappa=0)
    assert not any(tmp_path.iterdir())


def test_settings_are_checked():
    with pytest.raises(ValueError, match="does not apply"):
        ImagesConfig(method="simsiam", losses=["macl"])
    with pytest.raises(ValueError, match="batch_size"):
        ImagesConfig(batch_size=0)
    with pytest.raises(ValueError, match="precision"):
        ImagesConfig(precision="fp8")
    with pytest.raises(ValueError, match="unknown backbone"):
        ImagesConfig(backbone="resnet-7")
    with pytest.raises(RecipeError, match="'gpu' is not one of this recipe's presets"):
        _config("--preset", "gpu")
    with pytest.warns(FutureWarning, match="use .infonce."):
        assert ImagesConfig(losses=["NT_Xent", "macl"]).losses == ["infonce", "macl"]


def test_cli_maps_flags_to_the_config():
    import importlib

    cfg = _config("--data-root", "/data", "--preset", "paper", "--method", "moco",
                  "--losses", "infonce", "MACL", "--seeds", "0", "1", "--devices", "4",
                  "--strategy", "ddp", "--precision", "bf16-mixed", "--logger", "tensorboard")
    assert importlib.import_module("adaptcl.recipes.images.recipe").RECIPE is ImagesRecipe
    assert cfg.losses == ["infonce", "macl"] and cfg.seeds == [0, 1] and cfg.method == "moco"
    assert cfg.devices == 4 and cfg.strategy == "ddp" and cfg.epochs == 200
    assert cfg.precision == "bf16-mixed" and cfg.logger == "tensorboard"


def test_a_method_sweep_derives_each_points_defaults_and_checks_every_point():
    sweep = parse(ImagesRecipe, ["--method", "simclr", "moco"], "adaptcl images").sweep
    assert sweep.axes == {"method": ["simclr", "moco"]}
    configs = [sweep.config_at(p) for p in sweep.points()]
    assert [(c.temperature, c.macl_temperature, c.a0) for c in configs] == [(0.1, 0.1, 0.0),
                                                                           (0.2, 0.15, 0.2)]
    with pytest.raises(RecipeError, match="method=simsiam: loss 'infonce' does not apply"):
        parse(ImagesRecipe, ["--method", "simclr", "simsiam"], "adaptcl images")


def _checkpoint(recipe, cell):
    return recipe.checkpoint_dir(cell, recipe.config_of(cell))


def test_rows_are_the_data_and_each_point_has_its_images_and_identity(shared_data, tmp_path):
    sweep = Sweep.from_values(ImagesConfig, {
        "data_root": str(shared_data), "output_dir": str(tmp_path), "losses": ["infonce"],
        "seeds": [0, 1], "train_limit": [200, 300], "test_limit": 100, "batch_size": 64})
    recipe = ImagesRecipe(sweep)
    recipe.prepare(recipe.point_configs())
    assert recipe.rows() == ["cifar10"]
    cells = recipe.cells()  # point by point, seed by seed
    assert [(c.train_limit, c.seed) for c in cells] == [(200, 0), (200, 1), (300, 0), (300, 1)]
    small, large = (recipe.identity_of(c) for c in cells[::2])
    assert small["data"]["train_size"] == 200 and large["data"]["train_size"] == 300
    assert small["settings"]["train_limit"] == 200 and large["settings"]["train_limit"] == 300
    assert set(recipe.fingerprints) == {"cifar10", "cifar10, train_limit=300"}
    assert _checkpoint(recipe, cells[0]) != _checkpoint(recipe, cells[2])
    assert _checkpoint(recipe, cells[0]).parent == tmp_path / "checkpoints/cifar10/infonce/train_limit=200/seed0"
    assert recipe.report_spec().metrics == ("knn_top1", "linear_top1")
    no_probe = ImagesRecipe(dataclasses.replace(recipe.config, linear_epochs=0))
    no_probe.prepare(no_probe.point_configs())
    assert no_probe.report_spec().metrics == ("knn_top1",)
    # the checkpoint folder follows the identity: another setting, another folder
    other = ImagesRecipe(dataclasses.replace(recipe.config, lr=2e-3))
    other.prepare(other.point_configs())
    cell = no_probe.cells()[0]
    assert _checkpoint(no_probe, cell) != _checkpoint(other, cell)
    assert _checkpoint(no_probe, cell).parent == _checkpoint(other, cell).parent


def test_a_batch_larger_than_a_points_training_set_is_refused(shared_data, tmp_path):
    sweep = Sweep.from_values(ImagesConfig, {
        "data_root": str(shared_data), "output_dir": str(tmp_path), "train_limit": 200,
        "test_limit": 100, "batch_size": [128, 256]})
    with pytest.raises(ValueError, match=r"\(200 images\) is smaller than one batch \(256\)"):
        (r := ImagesRecipe(sweep)).prepare(r.point_configs())


def test_lightning_trainer_gets_device_precision_and_logger(tmp_path):
    from pytorch_lightning.loggers import TensorBoardLogger

    cfg = ImagesConfig(device="cpu", precision="bf16-mixed", logger="tensorboard")
    trainer = train.lightning_trainer(cfg, tmp_path)
    assert trainer.accelerator.__class__.__name__ == "CPUAccelerator"
    assert trainer.precision == "bf16-mixed" and trainer.max_epochs == cfg.epochs
    assert isinstance(trainer.logger, TensorBoardLogger)
    assert train.lightning_trainer(ImagesConfig(device="cpu"), tmp_path).logger is None


# ---------------------------------------------------------------------------------------------
# a tiny real run on CIFAR-10 npz images
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_tiny_real_run_writes_json_table_plot_and_tensorboard(shared_data, tmp_path, capsys):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    config = ImagesConfig(
        data_root=str(shared_data), output_dir=str(tmp_path), losses=["macl"],
        train_limit=320, test_limit=200, epochs=1, batch_size=64, width=0.125,
        hidden_dim=64, output_dim=32, linear_epochs=5, knn_every=1, progress=False,
        device="cpu", logger="tensorboard",
    )
    given = dataclasses.asdict(config)
    recipe = ImagesRecipe(config)
    result = recipe.run()
    assert dataclasses.asdict(recipe.config) == given  # the run changed no setting
    assert {p.name for p in tmp_path.iterdir()} >= {"results.json", "results.md", "config.yaml",
                                                    "images_temperature.png"}
    assert (tmp_path / "images_temperature.png").stat().st_size > 0
    assert result["plot"] == str(tmp_path / "images_temperature.png")
    saved = json.loads((tmp_path / "results.json").read_text())
    (run,) = saved["runs"]
    assert run["cell"] == {"dataset": "cifar10", "loss": "macl", "seed": 0}
    assert run["optimisation_steps"] == 320 // 64 and run["method"] == "simclr"
    assert 0.0 <= run["metrics"]["knn_top1"] <= 1.0 and 0.0 <= run["metrics"]["linear_top1"] <= 1.0
    assert run["online_knn"] and 0.0 <= run["online_knn"][0]["knn_top1"] <= 1.0
    assert all("temperature" in h and h["temperature"] > 0 for h in run["history"])
    assert saved["data"]["cifar10"]["train_size"] == 320
    assert "lossless" in saved["data"]["cifar10"]["source"]
    assert saved["environment"]["frameworks"]["lightly"] and run["train_seconds"] > 0
    table = (tmp_path / "results.md").read_text()
    assert "\nnpz (lossless) at " in table and "| cifar10 | " in table
    assert "## linear_top1" in table
    (events_dir,) = {p.parent for p in tmp_path.glob("logs/cifar10/macl/seed0/**/events.*")}
    events = EventAccumulator(str(events_dir))
    events.Reload()
    assert {"train_loss", "train_temperature", "train_alignment", "val_knn_top1"} <= set(
        events.Tags()["scalars"])
    # the saved config runs the same cell again: reused, nothing trained
    assert ImagesRecipe.main(["--config", str(tmp_path / "config.yaml")], "adaptcl images") == 0
    again = json.loads((tmp_path / "results.json").read_text())
    assert again["computed"] == [] and again["reused"] == [run["cell"]]
    assert again["runs"][0]["metrics"] == run["metrics"]
    capsys.readouterr()
