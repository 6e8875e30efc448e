"""The captions of ``adaptcl clip``: a template drawn per image from a seeded generator, the
caption tokens of open_clip's tokenizer (no download), the settings' refusals."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("open_clip")

from adaptcl.recipes.clip.config import ClipConfig, column_name, parse_column  # noqa: E402
from adaptcl.recipes.clip.data import (  # noqa: E402
    CaptionTokens,
    captions,
    draw_templates,
    load_clip_data,
    pair_datasets,
    templates_of,
)
from adaptcl.recipes.common.cifar import CIFAR10_CLASSES, CIFAR10_TEMPLATES  # noqa: E402


def test_templates_are_drawn_per_image_from_the_seed():
    first = draw_templates(5000, 18, seed=3)
    assert first.shape == (5000,) and first.min() == 0 and first.max() == 17
    assert np.array_equal(first, draw_templates(5000, 18, seed=3))  # the same seed, the same
    assert not np.array_equal(first, draw_templates(5000, 18, seed=4))
    counts = np.bincount(first, minlength=18)
    assert counts.min() > 5000 / 18 * 0.7  # every template is used, about equally
    assert set(draw_templates(100, 1, seed=0)) == {0}
    with pytest.raises(ValueError, match="num_templates must be >= 1"):
        draw_templates(3, 0, seed=0)


def test_captions_fill_the_drawn_template_with_the_class_name():
    labels, ids = np.array([0, 3, 9]), np.array([0, 2, 17])
    assert captions(labels, ids, CIFAR10_CLASSES, CIFAR10_TEMPLATES) == [
        "a photo of a airplane.", "a black and white photo of a cat.",
        "a photo of the big truck."]


def test_caption_tokens_are_open_clips_and_refuse_a_short_context():
    from open_clip.tokenizer import SimpleTokenizer

    tokens = CaptionTokens(CIFAR10_CLASSES, CIFAR10_TEMPLATES[:4], context_length=20)
    assert tuple(tokens.table.shape) == (10, 4, 20)
    expected = SimpleTokenizer(context_length=20)(["a low contrast photo of a dog."])[0]
    assert tokens([5], [3])[0].tolist() == expected.tolist()
    assert tokens.tokenizer.eot_token_id in tokens.table[5, 3].tolist()
    with pytest.raises(ValueError, match=r"context_length \(8\) is shorter than the longest "
                                         r"caption \(11 tokens"):
        CaptionTokens(CIFAR10_CLASSES, CIFAR10_TEMPLATES, context_length=8)


def test_pairs_hold_each_images_caption_and_class(shared_data):
    cfg = ClipConfig(train_limit=200, test_limit=100, retrieval_limit=30, templates=3,
                     caption_seed=7)
    data = load_clip_data(shared_data, cfg)
    tokens = CaptionTokens(data.classnames, templates_of(cfg), cfg.context_length)
    train, test = pair_datasets(data, tokens, cfg)
    assert (len(train), len(test)) == (200, 30)
    assert np.bincount(data.train_labels, minlength=10).tolist() == [20] * 10
    drawn = draw_templates(200, 3, seed=7)
    for i in (0, 57, 199):
        image, caption, label = train[i]
        assert tuple(image.shape) == (3, 32, 32) and int(label) == data.train_labels[i]
        assert caption.tolist() == tokens([label], [drawn[i]])[0].tolist()
    again, _ = pair_datasets(data, tokens, cfg)  # the captions do not depend on the cell
    assert again.tokens.equal(train.tokens)


@pytest.mark.parametrize("kwargs, message", [
    ({"templates": 19}, "templates must be at most 18"),
    ({"patch_size": 5}, "patch_size must divide the 32-pixel"),
    ({"vision_width": 48}, r"vision_width \(48\) must be a multiple of head_width \(32\)"),
    ({"init_temperature": 0.005}, "init_temperature must be at least 0.01"),
    ({"targets": ["pairs", "soft"]}, "unknown targets 'soft'"),
    ({"losses": ["ascl"]}, "ascl"),
])
def test_bad_settings_name_themselves(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ClipConfig(**kwargs)


def test_columns_are_each_loss_with_each_target():
    cfg = ClipConfig(losses=["infonce", "macl"], targets=["pairs", "labels", "pairs"])
    assert cfg.columns() == ["infonce", "macl", "infonce+labels", "macl+labels"]
    assert [parse_column(c) for c in cfg.columns()] == [
        ("infonce", "pairs"), ("macl", "pairs"), ("infonce", "labels"), ("macl", "labels")]
    assert column_name("dystress", "labels") == "dystress+labels"
