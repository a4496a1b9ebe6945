"""The precompile child: started only where it helps, stopped cleanly, and its caches are the trainer's.

The property that matters is the last test's: after the child ran, the
trainer's own evaluation graph is a hit in torch's local caches (so
the child compiled exactly the graph the trainer needs, under the same cache
key). It runs on the CPU with a tiny model, each process fresh, sharing one
cache folder as the trainer and its child do.
"""

import json
import os
import subprocess
import sys
import textwrap
import time

import torch

from speedrun.compile import precompile
from speedrun.config import apply_overrides
from speedrun.train.dist import DistInfo
from speedrun.recipes.presets import demo_2025_08 as demo


def _popen(code: str, tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", code])
    cfg_file = tmp_path / "cfg.json"
    cfg_file.write_text("{}")
    proc.t0, proc.cfg_path = time.time(), str(cfg_file)
    return proc, cfg_file


def test_started_only_on_gpu_ranks_and_when_wanted():
    cfg = demo()
    assert cfg.train.warmup_steps == 0 and not precompile.wanted(cfg, DistInfo(0, 1, 0, torch.device("cuda", 0)))
    cfg.train.warmup_steps = 3
    cpu = DistInfo(0, 1, 0, torch.device("cpu"))
    gpu0, gpu1 = DistInfo(0, 2, 0, torch.device("cuda", 0)), DistInfo(1, 2, 1, torch.device("cuda", 1))
    assert not precompile.wanted(cfg, cpu) and precompile.start(cfg, cpu, None) is None
    assert precompile.wanted(cfg, gpu0) and precompile.wanted(cfg, gpu1)
    assert precompile.start(cfg, gpu0, None, warm=True) is None  # warm caches: nothing for a child to do
    cfg.train.precompile = False
    assert not precompile.wanted(cfg, gpu0) and not precompile.wanted(cfg, gpu1)


def test_wait_reports_a_failed_child_and_removes_its_config(tmp_path):
    proc, cfg_file = _popen("import sys; sys.exit(3)", tmp_path)
    assert precompile.wait(proc).startswith("failed (exit 3")
    assert not cfg_file.exists()


def test_wait_stops_a_child_that_runs_too_long(tmp_path):
    proc, cfg_file = _popen("import time; time.sleep(60)", tmp_path)
    t0 = time.time()
    note = precompile.wait(proc, limit_s=1.0)
    assert "stopped" in note and time.time() - t0 < 30
    assert proc.poll() is not None and not cfg_file.exists()
    precompile.stop(proc)  # stopping twice is harmless
    precompile.stop(None)


_TRAINER = textwrap.dedent(r'''
    import json, sys
    from pathlib import Path
    from torch._dynamo.utils import counters
    from speedrun.config import from_dict
    from speedrun.train.dist import init_distributed
    from speedrun.train.loop import Trainer

    cfg = from_dict(json.loads(Path(sys.argv[1]).read_text()))
    trainer = Trainer(cfg, init_distributed("cpu"), Path(sys.argv[2]), progress=False)
    trainer.warm_up()  # one compiled training step
    before = counters["inductor"]["fxgraph_cache_hit"] + counters["aot_autograd"]["autograd_cache_hit"]
    trainer.evaluate(0)  # the first validation: the evaluation graph
    after = counters["inductor"]["fxgraph_cache_hit"] + counters["aot_autograd"]["autograd_cache_hit"]
    print("EVALHITS", after - before)
''')


def test_child_compiles_the_evaluation_graph_the_trainer_then_hits(tmp_path):
    cfg = apply_overrides(demo(), [
        "model.num_layers=1", "model.value_embeds=0", "model.model_dim=32", "model.num_heads=2", "model.head_dim=16",
        "model.mlp_hidden=64", "model.long_layers=0", "train.compile=on", "train.warmup_steps=1",
        "train.seq_len=256", "train.batch_seqs=1", "train.val_seq_len=512", "train.val_tokens=512",
        "train.precompile=false"])
    cfg_file = tmp_path / "config.json"
    cfg_file.write_text(json.dumps(cfg.to_dict()))
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"), TORCHINDUCTOR_FX_GRAPH_CACHE="1",
               TORCHINDUCTOR_AUTOGRAD_CACHE="1")
    child = subprocess.run([sys.executable, "-m", "speedrun.compile.precompile", "--config", str(cfg_file), "--device", "cpu"],
                           env=env, capture_output=True, text=True, timeout=600)
    assert child.returncode == 0 and "precompile: evaluation graph in" in child.stdout, child.stderr[-3000:]
    run = subprocess.run([sys.executable, "-c", _TRAINER, str(cfg_file), str(tmp_path / "run")],
                         env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    hits = int(run.stdout.split("EVALHITS")[1].split()[0])
    # the training step's graphs are new (misses); the evaluation graph is the child's: a cache hit
    # (AOTAutograd's bundled entry when Dynamo's package cache is on, else Inductor's FX graph)
    assert hits >= 1, run.stdout[-2000:]
