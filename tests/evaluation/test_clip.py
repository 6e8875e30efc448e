"""Zero-shot top-1 and image/text R@1 (adaptcl.evaluation.clip) on fake encoders whose answers
are known: a perfect one scores 100%, one that confuses a class loses exactly that class."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("open_clip")

from adaptcl.evaluation.clip import retrieval_r1, zero_shot_top1  # noqa: E402

CLASSES = ("cat", "dog", "ship", "frog")
TEMPLATES = ("a photo of a {}.", "a blurry photo of the {}.", "art of a {}.")


def fake_tokenizer(texts: list[str]) -> torch.Tensor:
    """A caption -> ``[class id, template id]`` (what the fake text tower reads)."""
    rows = []
    for text in texts:
        cls = next(i for i, name in enumerate(CLASSES) if f" {name}." in text)
        template = next(i for i, t in enumerate(TEMPLATES) if t.format(CLASSES[cls]) == text)
        rows.append([cls, template])
    return torch.tensor(rows)


class FakeClip(torch.nn.Module):
    """Images carry their class in pixel [0, 0, 0]; the image tower maps class ``c`` to the
    one-hot of ``confuse.get(c, c)``; the text tower maps a caption to its class's one-hot,
    tilted by ``tilt`` toward class ``(c + 1) % 4`` for template 0 only."""

    def __init__(self, confuse: dict[int, int] | None = None, tilt: float = 0.0) -> None:
        super().__init__()
        self.confuse, self.tilt = confuse or {}, tilt
        self.calls: list[bool] = []

    def encode_image(self, images, normalize=False):
        self.calls.append(self.training)
        seen = images[:, 0, 0, 0].long().tolist()
        x = F.one_hot(torch.tensor([self.confuse.get(c, c) for c in seen]), 8).float()
        return F.normalize(x, dim=-1) if normalize else x

    def encode_text(self, tokens, normalize=False):
        x = F.one_hot(tokens[:, 0], 8).float()
        x = x + self.tilt * (tokens[:, 1:2] == 0) * F.one_hot((tokens[:, 0] + 1) % 4, 8)
        return F.normalize(x, dim=-1) if normalize else x


def _images(labels: list[int]) -> torch.Tensor:
    images = torch.zeros(len(labels), 3, 4, 4)
    images[:, 0, 0, 0] = torch.tensor(labels, dtype=torch.float)
    return images


LABELS = [0, 1, 2, 3] * 5


def test_a_perfect_encoder_scores_100_percent_and_is_left_in_its_mode():
    model = FakeClip().train()
    top1 = zero_shot_top1(model, fake_tokenizer, _images(LABELS), LABELS, CLASSES, TEMPLATES,
                          batch_size=3)
    assert top1 == 1.0
    assert model.calls and not any(model.calls)  # scored in eval mode
    assert model.training  # and given back in training mode


def test_a_confused_class_costs_exactly_its_share():
    model = FakeClip(confuse={2: 3})  # every ship is seen as a frog
    assert zero_shot_top1(model, fake_tokenizer, _images(LABELS), LABELS, CLASSES,
                          TEMPLATES) == pytest.approx(0.75)


def test_the_class_embedding_averages_the_templates():
    # template 0 alone points each class's prompt more to the next class than to its own ...
    model = FakeClip(tilt=1.5)
    assert zero_shot_top1(model, fake_tokenizer, _images(LABELS), LABELS, CLASSES,
                          TEMPLATES[:1]) == 0.0
    # ... averaged with the two other templates the own class wins again
    assert zero_shot_top1(model, fake_tokenizer, _images(LABELS), LABELS, CLASSES,
                          TEMPLATES) == 1.0


def test_zero_shot_refuses_bad_labels_and_a_collapsed_tower():
    model = FakeClip()
    with pytest.raises(ValueError, match=r"labels must have shape \[20\]"):
        zero_shot_top1(model, fake_tokenizer, _images(LABELS), LABELS[:3], CLASSES, TEMPLATES)
    with pytest.raises(ValueError, match=r"class ids in \[0, 4\)"):
        zero_shot_top1(model, fake_tokenizer, _images([0, 4]), [0, 4], CLASSES, TEMPLATES)
    with pytest.raises(ValueError, match="same vector"):
        zero_shot_top1(FakeClip(confuse={c: 0 for c in range(4)}), fake_tokenizer,
                       _images(LABELS), LABELS, CLASSES, TEMPLATES)


def test_retrieval_counts_the_class_of_the_first_retrieved_item():
    classes = torch.tensor([0, 1, 2, 3, 0, 1])
    images = F.one_hot(classes, 4).float()
    assert retrieval_r1(images, images.clone(), classes) == {"i2t_r1": 1.0, "t2i_r1": 1.0}
    texts = images.clone()
    texts[2] = F.one_hot(torch.tensor(3), 4).float()  # caption 2 (class 2) looks like class 3
    r1 = retrieval_r1(images, texts, classes)
    # image 2 (class 2) finds no class-2 caption; image 3 ties captions 2 and 3 and the tie
    # goes to the first, caption 2 (class 2): both wrong
    assert r1["i2t_r1"] == pytest.approx(4 / 6)
    # caption 2 retrieves image 3 (class 3): wrong
    assert r1["t2i_r1"] == pytest.approx(5 / 6)
    with pytest.raises(ValueError, match=r"text_classes must have shape \[6\]"):
        retrieval_r1(images, texts, classes, classes[:2])
    with pytest.raises(ValueError, match="NaN or inf"):
        retrieval_r1(images * float("nan"), texts, classes)
