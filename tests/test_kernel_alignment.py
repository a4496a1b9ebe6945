"""scripts/kernel_alignment.py: the scan for generated Triton kernels compiled without 16-byte
alignment hints, on kernel sources written as Inductor writes them (torch 2.11's `triton_meta`)."""

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "kernel_alignment.py"


def _module():
    spec = importlib.util.spec_from_file_location("kernel_alignment", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _kernel(name, divisible):
    """A kernel's source as Inductor emits it: q, k, v, a float32 scalar pointer and a size."""
    cfg = ", ".join(f"({i},): [['tt.divisibility', 16]]" for i in divisible)
    return (f"@triton_heuristics.template(\n    num_stages=3,\n    triton_meta={{'signature': {{'arg_Q': '*bf16', "
            f"'arg_K': '*bf16', 'arg_V': '*bf16', 'in_ptr3': '*fp32', 'ks0': 'i32'}}, 'device': "
            f"DeviceProperties(type='cuda', index=0, multi_processor_count=132), 'constants': {{}}, "
            f"'configs': [{{{cfg}}}]}},\n)\n@triton.jit\ndef {name}(arg_Q, arg_K, arg_V, in_ptr3, ks0):\n"
            f"    pass\n")


def test_lists_pointer_arguments_without_the_hint(tmp_path):
    ka = _module()
    (tmp_path / "ab").mkdir()
    # one kernel file per kernel, and the output code holding the same kernels inline (counted once)
    good, bad = _kernel("triton_tem_fused_6", [0, 1, 2, 3, 4]), _kernel("triton_tem_fused_10", [3])
    (tmp_path / "ab" / "k6.py").write_text(good)
    (tmp_path / "ab" / "k10.py").write_text(bad)
    (tmp_path / "out.py").write_text(f"async_compile.triton('a', '''\n{good}''')\nasync_compile.triton('b', '''\n{bad}''')\n")
    (tmp_path / "notes.txt").write_text(bad)  # not a .py file: not read
    found, total = ka.scan(tmp_path)
    assert total == 2
    assert found == {"triton_tem_fused_10": ["arg_K", "arg_Q", "arg_V"]}  # ks0 is no pointer


def test_empty_configs_and_the_command_line(tmp_path, capsys):
    ka = _module()
    (tmp_path / "k.py").write_text(_kernel("triton_poi_fused_add_0", []))
    out = tmp_path / "r.json"
    ka.main([str(tmp_path), "--json", str(out)])
    assert "1 distinct kernels, 1 with a pointer argument" in capsys.readouterr().out
    assert json.loads(out.read_text()) == {
        "kernels": 1, "unaligned": {"triton_poi_fused_add_0": ["arg_K", "arg_Q", "arg_V", "in_ptr3"]}}
    with pytest.raises(SystemExit, match="not a folder"):
        ka.main([str(tmp_path / "missing")])
