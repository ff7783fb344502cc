"""Vision transformers through the generic capture: parity with HF eager attention on the same
pixels for tiny seeded ViT, DeiT and DINOv2-with-registers classifiers; image corpora."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnbase.extract import capture_batches, corpus_windows, load_model
from attnbase.extract import vision

ATOL = 1e-5
#: alias -> (tokens per image, sink positions, the names of the first tokens)
FAMILIES = {
    "tiny-vit": (17, (0,), ["[CLS]", "p(0,0)"]),
    "tiny-deit": (18, (0, 1), ["[CLS]", "[DIST]", "p(0,0)"]),
    "tiny-dinov2-reg": (21, (0, 1, 2, 3, 4), ["[CLS]", "reg0", "reg1", "reg2", "reg3", "p(0,0)"]),
}


def _record_keys():
    """An attention function that records the keys it receives, then attends with sdpa."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    seen: list[torch.Tensor] = []

    def fn(module, query, key, value, attention_mask, **kw):
        seen.append(key.detach().clone())
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kw)

    AttentionInterface.register("attnbase_test_keys", fn)
    return seen


@pytest.fixture(scope="module", params=list(FAMILIES))
def captured(request):
    name = request.param
    lm = load_model(name, device="cpu")
    ref = load_model(name, device="cpu", attn_implementation="eager")
    win = corpus_windows(lm, vision.SAMPLE, n_seqs=3, seq_len=None, seed=0)
    (cb,) = list(capture_batches(lm, win.tokens, 3, ("keys", "queries", "logits", "hidden"),
                                 pixels=win.pixels))
    px = torch.as_tensor(win.pixels)
    with torch.no_grad():
        eager = ref.model(pixel_values=px, output_attentions=True, output_hidden_states=True)
    return name, lm, ref, win, cb, eager


def test_layout_and_sink_set(captured):
    name, lm, _, win, cb, _ = captured
    T, sink, first = FAMILIES[name]
    assert win.tokens.shape == (3, T) and cb.arrays["attn_logits"].shape[-1] == T
    assert lm.info.sink_positions == sink and lm.info.causal is False
    names = vision.token_names(lm.model.config)
    assert len(names) == T and names[: len(first)] == first and names[-1] == "p(3,3)"
    assert lm.info.n_params == sum(p.numel() for p in lm.model.parameters())


def test_softmax_of_stored_logits_equals_eager_attentions(captured):
    _, lm, ref, _, cb, eager = captured
    z = torch.as_tensor(cb.arrays["attn_logits"])  # (layer, head, seq, query, key)
    for layer, a in enumerate(eager.attentions):  # (seq, head, query, key)
        got = torch.softmax(z[layer].transpose(0, 1).double(), -1)
        np.testing.assert_allclose(got.numpy(), a.double().numpy(), atol=ATOL)
    for layer, h in enumerate(eager.hidden_states):
        np.testing.assert_allclose(cb.arrays["hidden"][layer], h.numpy(), atol=ATOL)
    # the sink set's mass in row_stats is the eager rows' mass on it
    sink = list(lm.info.sink_positions)
    mass = torch.stack([a[..., sink].sum(-1) for a in eager.attentions])  # (layer, seq, head, q)
    np.testing.assert_allclose(cb.row_stats["sink_mass"],
                               mass.transpose(1, 2).reshape(-1).numpy(), atol=ATOL)


def test_keys_equal_what_the_attention_function_receives(captured):
    _, _, ref, win, cb, _ = captured
    seen = _record_keys()
    ref.model.set_attn_implementation("attnbase_test_keys")
    try:
        with torch.no_grad():
            ref.model(pixel_values=torch.as_tensor(win.pixels))
    finally:
        ref.model.set_attn_implementation("eager")
    assert len(seen) == cb.arrays["keys"].shape[0]
    for layer, k in enumerate(seen):  # (seq, kv_head, pos, d_head)
        np.testing.assert_allclose(cb.arrays["keys"][layer], k.transpose(0, 1).numpy(),
                                   atol=ATOL)


def test_negative_control_other_pixels_do_not_match(captured):
    name, lm, ref, _, cb, _ = captured
    other = corpus_windows(lm, vision.SAMPLE, n_seqs=3, seq_len=None, seed=1)
    with torch.no_grad():
        eager = ref.model(pixel_values=torch.as_tensor(other.pixels), output_attentions=True)
    z = torch.as_tensor(cb.arrays["attn_logits"])
    worst = max(float((torch.softmax(z[l].transpose(0, 1).double(), -1)
                       - a.double()).abs().max()) for l, a in enumerate(eager.attentions))
    assert worst > 100 * ATOL, name


def test_derived_logits_of_a_run_equal_eager(tmp_path):
    """The default capture stores queries and keys and derives the logits on read."""
    from attnbase import extract_run
    from attnbase.extract import ExtractConfig
    from attnbase.warehouse import Database
    from attnbase.warehouse.runs.store import RunStore

    db = Database(tmp_path / "db")
    extract_run(db, "d", ExtractConfig(model="tiny-dinov2-reg", corpus=vision.SAMPLE, n_seqs=2,
                                       batch_size=2, device="cpu"), progress=False)
    store = RunStore(db.store_path("d"), "d")
    assert "attn_logits" in store.derived()
    z = torch.as_tensor(store.read("attn_logits"))
    ref = load_model("tiny-dinov2-reg", device="cpu", attn_implementation="eager")
    lm = load_model("tiny-dinov2-reg", device="cpu")
    win = corpus_windows(lm, vision.SAMPLE, n_seqs=2, seq_len=None, seed=0)
    with torch.no_grad():
        eager = ref.model(pixel_values=torch.as_tensor(win.pixels), output_attentions=True)
    for layer, a in enumerate(eager.attentions):
        np.testing.assert_allclose(torch.softmax(z[layer].transpose(0, 1).double(), -1).numpy(),
                                   a.double().numpy(), atol=ATOL)
    info = db.run_info("d")
    assert info["seq_len"] == 21 and list(info["sink_positions"]) == [0, 1, 2, 3, 4]
    with db.connect(read_only=True) as con:
        rows = con.execute("SELECT seq, source, x0, y0, x1, y1 FROM seq_sources "
                           "WHERE run_id = 'd' ORDER BY seq").fetchall()
    assert rows == [(i, s.file, *s.box) for i, s in enumerate(win.sources)]


def test_image_corpora(tmp_path):
    from PIL import Image

    from attnbase.errors import CorpusError, ExtractError
    from attnbase.extract import ExtractConfig

    lm = load_model("tiny-vit", device="cpu")
    a = corpus_windows(lm, vision.SAMPLE, n_seqs=8, seq_len=None, seed=0)
    assert len(set(a.sources)) == 8  # N distinct windows
    assert not np.array_equal(a.pixels[0], a.pixels[2])
    b = corpus_windows(lm, vision.SAMPLE, n_seqs=8, seq_len=None, seed=0)
    assert b.sources == a.sources and np.array_equal(a.pixels, b.pixels)  # seeded
    # a directory: PNG and JPEG in name order, whole images
    d = tmp_path / "imgs"
    d.mkdir()
    rng = np.random.default_rng(0)
    for name in ("b.png", "a.jpg", "c.png"):
        Image.fromarray(rng.integers(0, 255, (40, 30, 3), dtype=np.uint8)).save(d / name)
    w = corpus_windows(lm, str(d), n_seqs=3, seq_len=None, seed=0)
    assert [s.file for s in w.sources] == ["a.jpg", "b.png", "c.png"]
    assert w.sources[0].box == (0, 0, 30, 40) and w.pixels.shape == (3, 3, 64, 64)
    with pytest.raises(CorpusError, match="holds 3 images but 4"):
        corpus_windows(lm, str(d), n_seqs=4, seq_len=None, seed=0)
    with pytest.raises(ExtractError, match="--seq-len does not apply"):
        ExtractConfig(model="tiny-vit", corpus=vision.SAMPLE, seq_len=17)
    with pytest.raises(CorpusError, match="reads images but corpus"):
        corpus_windows(lm, "default", n_seqs=2, seq_len=16, seed=0)
    text = load_model("tiny-gpt2", device="cpu")
    with pytest.raises(CorpusError, match="reads text"):
        corpus_windows(text, vision.SAMPLE, n_seqs=2, seq_len=None, seed=0)
    assert ExtractConfig(model="tiny-gpt2").seq_len == 64  # text keeps its default


def test_the_flows_path_writes_an_image_run(tmp_path):
    """prepare_run / run_batch / finish_run (what the flows' tasks call): the image run has the
    model's token count, its sources and its sink set, batch by batch."""
    from attnbase.extract import ExtractConfig
    from attnbase.runner import finish_run, prepare_run, run_batch
    from attnbase.warehouse import Database

    db = Database(tmp_path / "db")
    cfg = ExtractConfig(model="tiny-deit", corpus=vision.SAMPLE, n_seqs=3, batch_size=2,
                        device="cpu")
    plan = prepare_run(db, "f", cfg)
    for b in plan.pending:
        run_batch(plan, b)
    row = finish_run(plan)
    assert row["status"] == "complete" and row["seq_len"] == 18
    assert list(row["sink_positions"]) == [0, 1]
    with db.connect(read_only=True) as con:
        n = con.execute("SELECT count(*) FROM seq_sources WHERE run_id = 'f'").fetchone()[0]
        rows = con.execute("SELECT count(*) FROM row_stats WHERE run_id = 'f'").fetchone()[0]
    assert n == 3 and rows == 3 * 4 * 3 * 18  # layers x heads x windows x queries


def test_token_count_follows_the_processed_pixels():
    """DINOv2 checkpoints declare image_size 518 and crop 224: the windows' token count is the
    processed image's patches (here a 32 px processor on the 64 px tiny config: 5 + 2 x 2)."""
    from dataclasses import replace

    from transformers import ViTImageProcessorPil

    lm = load_model("tiny-dinov2-reg", device="cpu")
    small = replace(lm, processor=ViTImageProcessorPil(size={"height": 32, "width": 32}))
    win = corpus_windows(small, vision.SAMPLE, n_seqs=2, seq_len=None, seed=0)
    assert win.pixels.shape == (2, 3, 32, 32) and win.tokens.shape == (2, 9)
    (cb,) = list(capture_batches(small, win.tokens, 2, ("logits",), pixels=win.pixels))
    assert cb.arrays["attn_logits"].shape[-2:] == (9, 9)


def test_a_local_checkpoint_directory_loads_with_its_own_processor(tmp_path):
    """The hub path offline: a saved classifier and its preprocessor_config.json load as the
    classifier, with that processor, and capture the same attention as the alias."""
    src = load_model("tiny-deit", device="cpu")
    src.model.save_pretrained(tmp_path)
    src.processor.save_pretrained(tmp_path)
    lm = load_model(str(tmp_path), device="cpu")
    assert type(lm.model).__name__ == "DeiTForImageClassification"
    assert lm.processor.to_dict()["size"] == src.processor.to_dict()["size"]
    assert lm.info.sink_positions == (0, 1) and lm.info.n_params == src.info.n_params
    a = corpus_windows(lm, vision.SAMPLE, n_seqs=2, seq_len=None, seed=0)
    b = corpus_windows(src, vision.SAMPLE, n_seqs=2, seq_len=None, seed=0)
    (ca,) = list(capture_batches(lm, a.tokens, 2, ("logits",), pixels=a.pixels))
    (cb,) = list(capture_batches(src, b.tokens, 2, ("logits",), pixels=b.pixels))
    np.testing.assert_allclose(ca.arrays["attn_logits"], cb.arrays["attn_logits"], atol=1e-6)
