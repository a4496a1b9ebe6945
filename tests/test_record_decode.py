"""Key-value-cached decoding of the 2026-07 record's model (`speedrun.tools.record_decode`).

Every check holds the decoder to `RecordGPT`'s own full forward over the whole document (one
document, cu_seqlens [0, n]) followed by the eval path's head (`logits` then the softcap): prefill of
the first k tokens (k = 1 and 2 exercise the bigram hash's position-0/1 sentinel rules on the step
path) then one step per token, with windows that bite (smaller than the document, and a DC key count
smaller than the document) and windows larger than the document. Then that the cache holds no more
rows than a later query can see. Tiny config, float32, every parameter moved off its init (the zero
tables and gates included) so that every cached path carries signal; one thread. A last check runs
the record's bf16 at bf16 tolerance.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from test_record_model import randomize

from speedrun.model import record_parts
from speedrun.model.record import RecordGPT, RecordModelConfig
from speedrun.tools.record_decode import RecordDecoder

TINY = RecordModelConfig.tiny()
SHORT_DC = dataclasses.replace(TINY, dc_keys=20)  # the DC's 20 keys bite inside a 70-token document
N = 70
SCALE = 0.12
F32 = torch.float32
TIGHT = {"rtol": 1e-5, "atol": 0.0}  # float32 tolerance, purely relative (the logits lie in (0, 23))
BITE = (5, 13)  # paired layers: 5 rows ≈ 2.5 tokens; plain: 5 and 13 tokens, all < 70
WIDE = (200, 150)  # larger than the document in tokens and in paired rows (140)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One intra-op thread: tiny matrices, and a shared 2-core machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@torch.no_grad()
def build(cfg: RecordModelConfig) -> RecordGPT:
    return randomize(RecordGPT(cfg, generator=torch.Generator().manual_seed(3)), 4)


@pytest.fixture(scope="module")
def models() -> dict[str, RecordGPT]:
    return {"tiny": build(TINY), "short_dc": build(SHORT_DC)}


@pytest.fixture(scope="module")
def doc() -> torch.Tensor:
    return torch.randint(0, TINY.vocab, (N,), generator=torch.Generator().manual_seed(5), dtype=torch.int32)


@pytest.fixture(scope="module")
def freqs() -> torch.Tensor:
    """YaRN-moved frequencies, as a decoder after training would take them (not the initial ones)."""
    f0 = record_parts.rope_freqs(TINY.rope_pairs, TINY.rope_base)
    return record_parts.yarn(f0, SCALE, 8, 24)[0]


def full_logits(model: RecordGPT, tokens: torch.Tensor, windows, freqs, dtype: torch.dtype = F32) -> torch.Tensor:
    """The forward over the one document, then the eval head: softcap(h·lm_head), float32."""
    cu = torch.tensor([0, tokens.numel()], dtype=torch.int32)
    with torch.no_grad():
        h = model(tokens, cu, windows, SCALE, freqs, dtype=dtype)
        return record_parts.softcap(model.logits(h))


@pytest.mark.parametrize("which, windows", [("short_dc", BITE), ("tiny", WIDE)], ids=["window-bites", "wide"])
@pytest.mark.parametrize("k", [1, 2, 37])
def test_prefill_then_steps_match_the_full_forward_at_every_position(models, doc, freqs, which, windows, k):
    model = models[which]
    want = full_logits(model, doc, windows, freqs)
    dec = RecordDecoder(model, windows, SCALE, freqs, dtype=F32)
    got = [dec.extend(doc[:k])]
    got += [dec.step(int(t))[None] for t in doc[k:]]
    got = torch.cat(got)
    assert got.shape == (N, TINY.vocab) and got.dtype == F32
    torch.testing.assert_close(got, want, **TIGHT)


def test_prefill_all_but_the_last_then_one_step_is_the_last_row(models, doc, freqs):
    model = models["short_dc"]
    want = full_logits(model, doc, BITE, freqs)
    dec = RecordDecoder(model, BITE, SCALE, freqs, dtype=F32)
    torch.testing.assert_close(dec.prefill(doc[:-1]), want[-2], **TIGHT)
    torch.testing.assert_close(dec.step(doc[-1]), want[-1], **TIGHT)


def test_bfloat16_decoding_follows_the_bfloat16_forward(models, doc, freqs):
    """The record's activation dtype: the logits stay within bf16 rounding of the bf16 forward's."""
    model = models["short_dc"]
    want = full_logits(model, doc, BITE, freqs, dtype=torch.bfloat16)
    dec = RecordDecoder(model, BITE, SCALE, freqs, dtype=torch.bfloat16)
    got = torch.cat([dec.extend(doc[:9])] + [dec.step(int(t))[None] for t in doc[9:]])
    assert got.dtype == F32
    torch.testing.assert_close(got, want, rtol=1e-2, atol=0.0)


def test_the_windows_bite_on_this_document(models, doc, freqs):
    """Without this the matching tests above could pass with a cache that never drops a row: the
    last logits move when either window grows by one, and when the DC counts 112 keys, not 20
    (the two models have the same parameters; only dc_keys differs)."""
    short_dc, tiny = models["short_dc"], models["tiny"]
    assert all(torch.equal(a, b) for a, b in zip(short_dc.parameters(), tiny.parameters()))
    base = full_logits(short_dc, doc, BITE, freqs)[-1]
    for model, windows in ((short_dc, (BITE[0] + 1, BITE[1])), (short_dc, (BITE[0], BITE[1] + 1)), (tiny, BITE)):
        assert (full_logits(model, doc, windows, freqs)[-1] - base).abs().max() > 1e-3, windows


def test_cache_stays_bounded_by_the_window(models, doc, freqs):
    """Per layer the cache holds min(keep, rows fed) rows (keep: the window in rows, paired layers two
    rows per token; layer 10 at least dc_keys − 1), and the bytes held stop growing once full."""
    model, cfg = models["short_dc"], SHORT_DC
    dec = RecordDecoder(model, BITE, SCALE, freqs, dtype=F32)
    window = {i: BITE[1] if i in cfg.long_layers else BITE[0] for i in cfg.attention_layers}
    keep = {i: max(w, cfg.dc_keys - 1) if i == cfg.dc_layer else w for i, w in window.items()}
    assert keep[10] == 19 and keep[3] == 13 and keep[0] == 5
    held = []
    for n, t in enumerate(doc[:40], start=1):
        dec.step(int(t))
        for i, layer in dec.layers.items():
            rows = 2 * n if i in cfg.paired_layers else n
            assert layer.rows == min(keep[i], rows), (i, n)
        held.append(dec.nbytes())
    # once every layer is full (layer 10's 19 keys: from token 19 on) the bytes held stop moving,
    # and they are exactly K and V of the kept rows + the key-offset dims + the last embedding and id
    assert len(set(held[18:])) == 1
    H, D, lo = cfg.num_heads, cfg.head_dim, 2 * cfg.rope_pairs
    kv = sum(2 * keep[i] * (H // 2 if i in cfg.paired_layers else H) * D * 4 for i in keep)
    extra = len(cfg.key_offset_layers) * H * (D - lo) * 4 + cfg.model_dim * 4 + 8
    assert held[-1] == kv + extra


def test_prefill_refuses_a_second_document(models, doc, freqs):
    dec = RecordDecoder(models["tiny"], WIDE, SCALE, freqs, dtype=F32)
    dec.prefill(doc[:3])
    with pytest.raises(Exception, match="prefill"):
        dec.prefill(doc[:3])


@pytest.mark.parametrize("switch", ["smear", "bigram", "x0_inject", "skip", "dc", "mudd"])
def test_a_switched_off_technique_changes_the_model_and_the_decoder_follows(models, doc, freqs, switch):
    """Each technique switch (RecordModelConfig) removes its term from the forward, and the decoder,
    which writes the same math incrementally, removes it too."""
    off = dataclasses.replace(SHORT_DC, **{switch: False})
    model = build(off)
    want = full_logits(model, doc, BITE, freqs)
    assert not torch.allclose(want, full_logits(models["short_dc"], doc, BITE, freqs))
    dec = RecordDecoder(model, BITE, SCALE, freqs, dtype=F32)
    got = torch.cat([dec.extend(doc[:3])] + [dec.step(int(t))[None] for t in doc[3:]])
    torch.testing.assert_close(got, want, **TIGHT)
