"""Which rounding the positive logit takes (issue 24, item 5).

Against a memory bank of unit rows (the Lightly drop-in case) the positive logit is the scaled
anchor times the positive key, rounded as the bank's logits are, as Lightly computes it; every
other path keeps ``cos / t`` so it computes bit for bit what the published runs computed.
"""

from __future__ import annotations

import torch

from adaptcl.plugins import FORMS, build_candidates
from adaptcl.plugins.candidates import scaled_anchors


def _views(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(64, 32, generator=g), torch.randn(64, 32, generator=g),
            torch.nn.functional.normalize(torch.randn(16, 32, generator=g), dim=1))


def test_positive_logit_is_cos_over_t_bit_for_bit_without_a_unit_bank():
    z0, z1, neg = _views()
    for form in FORMS:
        for cands in build_candidates(z0, z1, form, neg):
            assert not cands.unit_keys
            _, positive = scaled_anchors(cands, 0.1)
            assert torch.equal(positive, cands.positive_sim / 0.1), form


def test_positive_logit_rounds_like_the_negatives_against_a_unit_bank():
    z0, z1, neg = _views()
    (cands,) = build_candidates(z0, z1, "queue", neg, unit_negatives=True)
    assert cands.unit_keys and torch.equal(cands.keys, neg)  # the bank's rows as given
    anchors, positive = scaled_anchors(cands, 0.1)
    assert torch.equal(positive, (anchors * cands.positive_keys).sum(dim=1))
    assert not torch.equal(positive, cands.positive_sim / 0.1)  # the two roundings differ here
    # a bank entry that is the positive key gives the positive logit up to the order in which
    # the matrix product and the row sum add the 32 terms: bit for bit where they add alike
    # (ATen's AVX2 / AVX-512 kernels here), a few ulps apart on ATen's scalar path
    (same,) = build_candidates(z0[:1], z1[:1], "queue", cands.positive_keys[:1],
                               unit_negatives=True)
    anchors, positive = scaled_anchors(same, 0.1)
    ulp = torch.finfo(torch.float32).eps * positive.abs()
    assert ((anchors @ same.keys.T)[:, 0] - positive).abs().le(4 * ulp).all()
    assert same.rows(0, 1).unit_keys  # carried into the tiled engine's row blocks
