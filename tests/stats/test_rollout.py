"""Attention rollout (Abnar & Zuidema 2020; docs/metrics.md §6c): a 2-layer example computed by
hand, the identity-attention and uniform-attention controls, and the [CLS] row."""

from __future__ import annotations

import numpy as np
import pytest

from attnbase.stats.rollout import attention_rollout, cls_rollout


def test_two_layer_example_computed_by_hand():
    # layer 0: two heads, every token attends to token 0; layer 1: two heads averaging to
    # every query attending to tokens 0 and 1 equally
    a0 = np.array([[[1, 0, 0], [1, 0, 0], [1, 0, 0]]] * 2, dtype=float)
    a1 = np.array([[[1, 0, 0], [1, 0, 0], [1, 0, 0]],
                   [[0, 1, 0], [0, 1, 0], [0, 1, 0]]], dtype=float)
    # Ã0 = 0.5 A0 + 0.5 I = [[1, 0, 0], [.5, .5, 0], [.5, 0, .5]]
    # Ã1 = 0.5 mean(A1) + 0.5 I = [[.75, .25, 0], [.25, .75, 0], [.25, .25, .5]]
    # R = Ã1 Ã0: row 0 = .75 [1,0,0] + .25 [.5,.5,0] = [.875, .125, 0]
    #            row 1 = .25 [1,0,0] + .75 [.5,.5,0] = [.625, .375, 0]
    #            row 2 = .25 [1,0,0] + .25 [.5,.5,0] + .5 [.5,0,.5] = [.625, .125, .25]
    want = np.array([[0.875, 0.125, 0.0], [0.625, 0.375, 0.0], [0.625, 0.125, 0.25]])
    np.testing.assert_allclose(attention_rollout(np.stack([a0, a1])), want, atol=1e-15)
    np.testing.assert_allclose(cls_rollout(np.stack([a0, a1]), 1), [0.125, 0.0], atol=1e-15)
    # the order matters: layer 0 acts first (Ã0 Ã1 differs)
    assert not np.allclose(attention_rollout(np.stack([a1, a0])), want)


def test_identity_attention_rolls_out_to_the_identity():
    """Control: every token attending to itself only; nothing flows between tokens, so the
    [CLS] row over the patches is zero."""
    eye = np.broadcast_to(np.eye(17), (4, 3, 17, 17))
    np.testing.assert_array_equal(attention_rollout(eye), np.eye(17))
    assert (cls_rollout(eye, 1) == 0).all()


def test_uniform_attention_spreads_evenly_and_rows_sum_to_one():
    T = 10
    uni = np.full((5, 2, T, T), 1.0 / T)
    r = attention_rollout(uni)
    np.testing.assert_allclose(r.sum(-1), 1.0, rtol=1e-12)
    patches = cls_rollout(uni, 1)
    np.testing.assert_allclose(patches, patches[0], rtol=1e-12)  # no patch is preferred
    a = np.random.default_rng(0).dirichlet(np.ones(T), size=(3, 4, T))
    np.testing.assert_allclose(attention_rollout(a).sum(-1), 1.0, rtol=1e-12)


def test_bad_shape_is_one_clear_error():
    with pytest.raises(ValueError, match=r"\(layer, head, T, T\)"):
        attention_rollout(np.ones((2, 3, 3)))
