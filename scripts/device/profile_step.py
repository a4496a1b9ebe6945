"""Profile a few training steps of a preset on the GPU: top kernels and step gaps.

usage: python3 scripts/device/profile_step.py PRESET DATA_DIR OUT_FILE
"""

import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from speedrun.dist import init_distributed
from speedrun.presets import get_preset
from speedrun.train import Trainer


def main(preset: str, data_dir: str, out: str) -> None:
    cfg = get_preset(preset)
    cfg.data.data_dir = data_dir
    cfg.train.val_tokens = 0
    trainer = Trainer(cfg, init_distributed(), Path("/tmp/runs/profile"), overwrite=True, progress=False)
    t0 = time.time()
    for step in range(4):
        trainer.train_step(step)
    torch.cuda.synchronize()
    print(f"compile + 4 steps: {time.time() - t0:.1f}s", flush=True)
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    ev[0].record()
    for step in range(4, 9):
        trainer.train_step(step)
    ev[1].record()
    torch.cuda.synchronize()
    print(f"ms/step (5 steps): {ev[0].elapsed_time(ev[1]) / 5:.1f}", flush=True)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for step in range(9, 11):
            trainer.train_step(step)
        torch.cuda.synchronize()
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=40, max_name_column_width=90)
    Path(out).write_text(table)
    prof.export_chrome_trace(str(Path(out).with_suffix(".json")))
    print(table[:6000])


if __name__ == "__main__":
    main(*sys.argv[1:4])
