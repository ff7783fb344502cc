"""BERT-style encoders (BERT, MiniLM): bidirectional, absolute positions, ``attention.self.key``."""

from __future__ import annotations

from attnbase.extract.families.base import FamilyAdapter


class BertAdapter(FamilyAdapter):
    def n_kv_heads(self, config) -> int:
        return self.n_heads(config)

    def d_head(self, config) -> int:
        return self.d_model(config) // self.n_heads(config)


ADAPTER = BertAdapter(
    name="bert",
    model_types=("bert",),
    layers="encoder.layer",
    attention="attention.self",
    key_source="attention.self.key",
    rotary=False,
    causal=False,
    derivable_logits=True,
)
