"""Export of the 2026-07 record's model to a Hugging Face folder (`speedrun.tools.export_record_hf`).

A tiny RecordGPT with every parameter moved off its init (the zero tables and gates included) is
exported, loaded back with `AutoModelForCausalLM.from_pretrained(..., trust_remote_code=True)`, and
its soft-capped logits are held to RecordGPT's own float32 forward + logits on the same document:
at the record's final-validation windows (768, 2560) on a document longer than the short window,
and at small windows where both bind, two documents in one batch. The config's defaults are held
to the spec's numbers (the YaRN scale chain, the parameter count), and the folder's contents to
what was exported (no world-size pads, the sign table as a buffer, the windows and rotary values).
"""

from __future__ import annotations

import ast
import importlib.util
import json
from pathlib import Path

import pytest
import torch

from speedrun.errors import ConfigError
from speedrun.model import record_parts
from speedrun.model.record import RecordGPT, RecordModelConfig
from speedrun.tools.export_record_hf import MODELING_FILE, export, hf_config

HAVE_TRANSFORMERS = importlib.util.find_spec("transformers") is not None
needs_transformers = pytest.mark.skipif(not HAVE_TRANSFORMERS, reason="transformers is not installed "
                                        "(pip install -e '.[test]' installs it)")
TINY = RecordModelConfig.tiny()
FINAL_WINDOWS = (768, 2560)  # spec "Validation and timing": the final validation's short and long windows
MODELING_PATH = Path(__file__).parents[1] / "src" / "speedrun" / "tools" / "hf_modeling" / MODELING_FILE
# float32 sums in another order (the reference attends in query chunks, the export over whole rows):
# ulp-level residual differences, amplified by the random model to ~1e-4 of logits in (0, 23)
ATOL, RTOL = 3e-4, 1e-5


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One intra-op thread: the matrices are tiny and the machine is shared."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def spec_rotary(pairs: int) -> tuple[torch.Tensor, float]:
    """The record's YaRN steps 384 → 896 → 1408 → 1664 from the initial frequencies and scale 0.1."""
    f, scale = record_parts.rope_freqs(pairs), 0.1
    for old, new in ((384, 896), (896, 1408), (1408, 1664)):
        f, scale = record_parts.yarn(f, scale, old, new)
    return f, scale


@pytest.fixture(scope="module")
def model() -> RecordGPT:
    """World size 8, so that the qk/vo pads exist and the export must drop them. Every parameter but
    γ moved: bf16 matrices and tables by N(0, 1/last dim), generator biases by N(0, 1), fp32 scalars
    and lambdas by N(0, 0.2²)."""
    m = RecordGPT(TINY, world_size=8, generator=torch.Generator().manual_seed(1))
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name == "mudd_gate_scale":
                continue
            std = 1.0 if name.endswith("_b2") else 0.2 if p.dtype == torch.float32 else p.shape[-1] ** -0.5
            p.add_((torch.randn(p.shape, generator=g) * std).to(p.dtype))
    return m.eval()


def documents(rows: int, n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, TINY.vocab, (rows, n), generator=torch.Generator().manual_seed(seed))


def training_logits(model: RecordGPT, doc: torch.Tensor, windows, scale: float, freqs) -> torch.Tensor:
    """RecordGPT's float32 forward + head + softcap on one document (cu_seqlens [0, n])."""
    cu = torch.tensor([0, doc.numel()], dtype=torch.int32)
    with torch.no_grad():
        return record_parts.softcap(model.logits(model(doc, cu, windows, scale, freqs, dtype=torch.float32)))


def load(folder: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(folder), trust_remote_code=True).eval()


@needs_transformers
@pytest.mark.parametrize("windows, rows, n", [(FINAL_WINDOWS, 1, 800), ((40, 150), 2, 260)],
                         ids=["final-768-2560", "small-windows-two-rows"])
def test_exported_logits_equal_the_training_forward(tmp_path, model, windows, rows, n):
    """800 tokens > 769: the short window binds on plain layers (on paired ones from 385 tokens);
    the small windows bind everywhere, and two rows are two independent documents."""
    freqs, scale = spec_rotary(TINY.rope_pairs)
    hf = load(export(model, TINY, windows, scale, freqs, tmp_path / "hf"))
    docs = documents(rows, n, seed=3)
    with torch.no_grad():
        out = hf(docs).logits
    assert out.dtype == torch.float32 and out.shape == (rows, n, TINY.vocab)
    for r in range(rows):
        torch.testing.assert_close(out[r], training_logits(model, docs[r], windows, scale, freqs),
                                   atol=ATOL, rtol=RTOL)


@needs_transformers
def test_windows_and_rotary_are_the_exported_ones(tmp_path, model):
    """A window one token narrower, or the un-YaRNed frequencies, change the reference's logits by
    far more than the tolerance: the comparison above can see the exported values."""
    freqs, scale = spec_rotary(TINY.rope_pairs)
    hf = load(export(model, TINY, (40, 150), scale, freqs, tmp_path / "hf"))
    doc = documents(1, 200, seed=4)
    with torch.no_grad():
        out = hf(doc).logits[0]
    for windows, f in (((39, 150), freqs), ((40, 149), freqs), ((40, 150), record_parts.rope_freqs(TINY.rope_pairs))):
        assert (out - training_logits(model, doc[0], windows, scale, f)).abs().max() > 100 * ATOL


@needs_transformers
def test_folder_holds_the_native_tensors_without_pads(tmp_path, model):
    from safetensors.torch import load_file

    freqs, scale = spec_rotary(TINY.rope_pairs)
    out = export(model, TINY, FINAL_WINDOWS, scale, freqs, tmp_path / "hf")
    assert {"config.json", "model.safetensors", MODELING_FILE, "vocab.json", "merges.txt"} <= {
        p.name for p in out.iterdir()}
    state, native = load_file(str(out / "model.safetensors")), model.state_dict()
    assert set(state) == set(native) and "bigram_signs" in state
    for name, t in state.items():
        real = {"qk_bank": TINY.qk_matrices, "vo_bank": TINY.vo_matrices}
        expected = native[name][: real[name]] if name in real else native[name]
        assert t.dtype == expected.dtype and torch.equal(t, expected), name
    assert state["qk_bank"].shape[0] == 60 and state["vo_bank"].shape[0] == 20  # the 4 + 4 pads are gone
    assert set(state["bigram_signs"].unique().tolist()) == {-1.0, 1.0}
    conf = json.loads((out / "config.json").read_text())
    assert (conf["short_window"], conf["long_window"]) == FINAL_WINDOWS and conf["attn_scale"] == scale
    assert torch.equal(torch.tensor(conf["rope_freqs"], dtype=torch.float32), freqs)
    assert conf["auto_map"]["AutoModelForCausalLM"] == "record_modeling.RecordForCausalLM"
    hf = load(out)
    assert hf.bigram_signs.dtype == torch.float32 and torch.equal(hf.bigram_signs, model.bigram_signs.float())


@needs_transformers
def test_default_config_is_the_record():
    """RecordConfig() is what the exporter writes for the record-size model at its final validation:
    YaRN left the scale at 0.131778 (spec: 0.1 → 0.116946 → 0.127518 → 0.131778), and the model has
    the spec's 640,605,607 parameters (no pads)."""
    spec = importlib.util.spec_from_file_location("record_modeling_under_test", MODELING_PATH)
    modeling = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(modeling)
    freqs, scale = spec_rotary(32)
    assert round(scale, 6) == 0.131778
    default, written = modeling.RecordConfig(), hf_config(RecordModelConfig(), FINAL_WINDOWS, scale, freqs)
    for key, value in written.items():
        if key not in ("auto_map", "architectures", "dtype", "model_type"):
            assert getattr(default, key) == value, key
    with torch.device("meta"):
        net = modeling.RecordForCausalLM(default)
    assert sum(p.numel() for p in net.parameters()) == 640_605_607


def test_modeling_file_imports_only_torch_and_transformers():
    """It travels inside the exported folder, where speedrun may not be installed."""
    tree = ast.parse(MODELING_PATH.read_text())
    roots = {a.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names}
    roots |= {node.module.split(".")[0] for node in ast.walk(tree)
              if isinstance(node, ast.ImportFrom) and node.module and not node.level}
    assert roots <= {"math", "torch", "transformers"}
    assert not any(isinstance(node, ast.ImportFrom) and node.level for node in ast.walk(tree))


def test_export_refuses_a_wrong_config_or_a_busy_folder(tmp_path, model):
    freqs, scale = spec_rotary(TINY.rope_pairs)
    with pytest.raises(ConfigError, match="cfg"):
        export(model, RecordModelConfig(), FINAL_WINDOWS, scale, freqs, tmp_path / "a")
    with pytest.raises(ConfigError, match="rotary"):
        export(model, TINY, FINAL_WINDOWS, scale, freqs[:-1], tmp_path / "b")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x").write_text("x")
    with pytest.raises(ConfigError, match="not empty"):
        export(model, TINY, FINAL_WINDOWS, scale, freqs, tmp_path / "busy")


def test_a_model_with_a_technique_switched_off_is_refused(tmp_path):
    import dataclasses

    cfg = dataclasses.replace(TINY, dc=False, smear=False)
    model = RecordGPT(cfg, generator=torch.Generator().manual_seed(0))
    freqs = record_parts.rope_freqs(cfg.rope_pairs, cfg.rope_base)
    with pytest.raises(ConfigError, match="this model has smear, dc switched off"):
        export(model, cfg, FINAL_WINDOWS, 0.1, freqs, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()
