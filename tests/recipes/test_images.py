"""The images recipe: data loading, configuration and a tiny real run (kNN and the linear probe:
tests/evaluation/test_images.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("lightly")
pytest.importorskip("pytorch_lightning")

from adaptcl.cli import build_parser  # noqa: E402
from adaptcl.recipes import image_training  # noqa: E402
from adaptcl.recipes.image_data import (  # noqa: E402
    ArrayImageDataset,
    load_image_splits,
    load_npz_arrays,
)
from adaptcl.recipes.images import PRESETS, ImagesConfig, ImagesRecipe  # noqa: E402

# ---------------------------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------------------------


def test_npz_cifar_splits_from_the_shared_data(shared_data):
    splits = load_image_splits(shared_data, train_limit=200, test_limit=100)
    assert "lossless" in splits.source  # exact pixels preferred when they suffice
    assert len(splits.train) == 200 and len(splits.test) == 100
    counts = np.bincount(splits.train.labels, minlength=10)
    assert counts.min() == counts.max() == 20  # class-stratified subset
    image, label = splits.train[0]
    assert image.size == (32, 32) and 0 <= label < 10
    big = load_image_splits(shared_data, train_limit=5000, test_limit=2000)
    assert "jpeg" in big.source and len(big.train) == 5000


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

    folder = tmp_path / "folder"
    for split in ("train", "val"):
        for cls in ("cat", "dog"):
            (folder / split / cls).mkdir(parents=True)
            for i in range(3):
                Image.fromarray(imgs[i]).save(folder / split / cls / f"{i}.png")
    splits = load_image_splits(folder, train_limit=4)
    assert splits.source.startswith("image folder") and splits.num_classes == 2
    assert len(splits.train) == 4 and len(splits.test) == 6
    image, label = splits.train.with_transform(lambda im: im.size)[0]
    assert image == (32, 32) and label in (0, 1)

    with pytest.raises(FileNotFoundError, match="no image data"):
        load_image_splits(tmp_path / "npz" / "..")
    with pytest.raises(FileNotFoundError, match="cifar-10-batches-py"):
        load_image_splits(npz_dir, source="torchvision")


# ---------------------------------------------------------------------------------------------
# configuration
# ---------------------------------------------------------------------------------------------


def test_presets_and_validation():
    cpu = ImagesConfig().resolved()  # the default preset is the CPU one
    assert (cpu.backbone, cpu.width, cpu.epochs) == ("resnet-18", 0.125, 15)
    paper = ImagesConfig(preset="paper").resolved()
    assert (paper.backbone, paper.width, paper.epochs, paper.batch_size) == ("resnet-18", 1.0,
                                                                             200, 512)
    assert paper.optimizer == "adam" and paper.lr == pytest.approx(1e-3 * 512 / 256)
    assert paper.train_limit is None and paper.temperature == 0.1 and paper.a0 == 0.0
    assert ImagesConfig(preset="cpu", epochs=3).resolved().epochs == 3
    moco = ImagesConfig(method="moco").resolved()
    assert (moco.temperature, moco.macl_temperature, moco.a0) == (0.2, 0.15, 0.2)
    assert ImagesConfig(method="moco", temperature=0.3).resolved().macl_temperature == 0.3
    assert ImagesConfig(full_data=True).resolved().train_limit is None
    assert set(PRESETS) == {"cpu", "paper"}
    with pytest.raises(ValueError, match="does not apply"):
        ImagesConfig(method="simsiam", losses=["macl"]).resolved()
    with pytest.raises(ValueError, match="preset"):
        ImagesConfig(preset="gpu").resolved()
    with pytest.raises(ValueError, match="batch_size"):
        ImagesConfig(batch_size=0).resolved()
    with pytest.raises(ValueError, match="precision"):
        ImagesConfig(precision="fp8").resolved()


def test_cli_maps_flags_to_the_config(capsys):
    from adaptcl.recipes import images

    args = build_parser("images").parse_args([
        "images", "--data-root", "/data", "--preset", "paper", "--method", "moco",
        "--losses", "NT_Xent", "macl", "--seeds", "0", "1", "--devices", "4", "--strategy", "ddp",
        "--precision", "bf16-mixed", "--logger", "tensorboard",
    ])
    cfg = ImagesRecipe.config_from_args(args).resolved()
    assert args._module == "adaptcl.recipes.images" and images.RECIPE is ImagesRecipe
    assert cfg.losses == ["infonce", "macl"] and cfg.seeds == [0, 1]
    assert cfg.devices == 4 and cfg.strategy == "ddp" and cfg.epochs == 200
    assert cfg.precision == "bf16-mixed" and cfg.logger == "tensorboard"
    old = build_parser("images").parse_args(["images", "--losses", "nt_xent,macl", "--seeds",
                                             "0,1", "--num-threads", "2"])
    assert old.losses == ["infonce", "macl"] and old.seeds == [0, 1] and old.threads == 2
    assert "deprecated" in capsys.readouterr().err


def test_lightning_trainer_gets_device_precision_and_logger(tmp_path):
    from pytorch_lightning.loggers import TensorBoardLogger


    cfg = ImagesConfig(device="cpu", precision="bf16-mixed", logger="tensorboard").resolved()
    trainer = image_training.build_images_trainer(cfg, tmp_path, 1)
    assert trainer.accelerator.__class__.__name__ == "CPUAccelerator"
    assert trainer.precision == "bf16-mixed"
    assert isinstance(trainer.logger, TensorBoardLogger)
    assert image_training.build_images_trainer(ImagesConfig(device="cpu").resolved(), tmp_path, 1).logger is None


# ---------------------------------------------------------------------------------------------
# a tiny real run on CIFAR-10 npz images
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_tiny_real_run_writes_json_table_plot_and_tensorboard(shared_data, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    config = ImagesConfig(
        data_root=str(shared_data), output_dir=str(tmp_path), losses=["macl"],
        train_limit=320, test_limit=200, epochs=1, batch_size=64, width=0.125,
        hidden_dim=64, output_dim=32, linear_epochs=5, knn_every=1, progress=False,
        device="cpu", logger="tensorboard",
    )
    result = ImagesRecipe(config).run()
    for path in (result["outputs"]["json"], result["outputs"]["markdown"], result["plot"]):
        assert (tmp_path / path.split("/")[-1]).stat().st_size > 0
    saved = json.loads((tmp_path / "images_simclr_cpu.json").read_text())
    (run,) = saved["runs"]
    assert run["loss"] == "macl" and run["optimisation_steps"] == 320 // 64
    assert 0.0 <= run["metrics"]["knn_top1"] <= 1.0 and 0.0 <= run["metrics"]["linear_top1"] <= 1.0
    assert run["online_knn"] and 0.0 <= run["online_knn"][0]["knn_top1"] <= 1.0
    assert all("temperature" in h and h["temperature"] > 0 for h in run["history"])
    assert saved["data"]["train_size"] == 320 and "lossless" in saved["data"]["source"]
    assert saved["environment"]["frameworks"]["lightly"] and run["train_seconds"] > 0
    table = (tmp_path / "images_simclr_cpu.md").read_text()
    assert "| simclr (npz (lossless)" in table and "(n=1)" in table
    (events_dir,) = {p.parent for p in tmp_path.glob("logs/simclr/macl/seed0/**/events.*")}
    events = EventAccumulator(str(events_dir))
    events.Reload()
    assert {"train_loss", "train_temperature", "train_alignment", "val_knn_top1"} <= set(
        events.Tags()["scalars"])
