"""Falcon on both sides of transformers 5.25: the hand-written adapter where the installed
modeling file keeps the attention outside the attention interface (<= 5.24), the generic capture
where it goes through the interface (5.25 on), chosen from the modeling file's source.

The side that the installed transformers is on runs here for real (parity with eager for every
Falcon layout); the other side runs with ``make test-falcon-5.24`` (docs/toolchain.md).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnbase.errors import UnsupportedArchitectureError
from attnbase.extract import capture_batches
from attnbase.extract.families import FAMILIES, hand_written
from attnbase.extract.families import generic
from test_families_parity import ATOL, build, eager_oracle


def _installed_routes_through_interface() -> bool:
    from transformers.models.falcon import modeling_falcon as mf

    return hasattr(mf, "eager_attention_forward") and "ALL_ATTENTION_FUNCTIONS" in vars(mf)


def test_the_side_follows_the_modeling_source(monkeypatch):
    facts = generic.modeling_source_facts("falcon")
    assert facts["interface"] == _installed_routes_through_interface()
    want = None if facts["interface"] else FAMILIES["falcon"]
    assert hand_written("falcon") is want
    # the other side, as the source would read there: the choice flips with it
    real = generic.modeling_source_facts
    monkeypatch.setattr(generic, "modeling_source_facts",
                        lambda mt: dict(real(mt), interface=not facts["interface"]))
    assert hand_written("falcon") is (FAMILIES["falcon"] if facts["interface"] else None)


def test_the_registry_row_names_the_side():
    from attnbase.extract.registry import model_rows

    (row,) = [r for r in model_rows() if r.model_type == "falcon"]
    assert row.served == ("generic" if _installed_routes_through_interface() else "adapter:falcon")
    assert row.proven


@pytest.mark.parametrize("layout", [
    dict(multi_query=True),
    dict(multi_query=False),
    dict(new_decoder_architecture=True, num_kv_heads=2),
], ids=["multi-query", "multi-head", "grouped"])
def test_every_falcon_layout_equals_eager(layout):
    lm, eager, tokens = build("falcon", **layout)
    (cb,) = list(capture_batches(lm, tokens, 2, ("keys", "queries", "logits")))
    attentions, calls = eager_oracle(eager, tokens)
    z = torch.from_numpy(cb.arrays["attn_logits"])
    assert len(attentions) == len(calls) == lm.info.n_layers == 2
    for layer, att in enumerate(attentions):
        p = torch.softmax(z[layer].double(), -1).permute(1, 0, 2, 3)
        torch.testing.assert_close(p.float(), att, atol=ATOL, rtol=0)
        pre, post = calls[layer]["rope"]
        assert not torch.allclose(pre, post)  # rotary Falcons: the keys were rotated
    assert np.isneginf(cb.arrays["attn_logits"][..., 0, 1:]).all()  # causal


def test_alibi_falcon_stops_in_one_line():
    with pytest.raises(UnsupportedArchitectureError, match="alibi") as err:
        lm, _, tokens = build("falcon", alibi=True)
        lm.info.logits_recipe  # noqa: B018 - the adapter side refuses when the recipe is formed
    assert "\n" not in str(err.value)
