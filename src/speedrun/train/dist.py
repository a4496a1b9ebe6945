"""Process-group set-up for 1..N processes launched by torchrun.

torchrun (and its multi-node rendezvous) sets RANK, WORLD_SIZE and
LOCAL_RANK; a plain `python -m speedrun.train` or `speedrun train` is one
process. NCCL on CUDA, gloo on CPU (the CPU tests use gloo).
"""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed(device: str = "auto") -> DistInfo:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = torch.cuda.is_available() if device == "auto" else device.startswith("cuda")
    dev = torch.device("cuda", local) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(dev)
    if world > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if use_cuda else "gloo", device_id=dev if use_cuda else None)
    return DistInfo(rank, world, local, dev)


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def all_ranks(flag: bool, device: torch.device) -> bool:
    """True when `flag` is True on every rank (one all-reduce; just `flag` in a single process)."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return flag
    t = torch.tensor(int(flag), device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(t.item())


def all_reduce_mean(t: torch.Tensor) -> torch.Tensor:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        t /= dist.get_world_size()
    return t


def shutdown(clean: bool = False) -> None:
    """Tear the process group down. `clean`: this rank finished without an error,
    as every rank then has: meet at a barrier first, so that no rank closes its
    connections while a peer is still finishing its last collective, and free
    unreachable collective handles (gloo's asynchronous work objects) while the
    interpreter is fully alive: both races can end a finished gloo run with
    SIGABRT ("terminate called without an active exception") at exit. After an
    error a barrier could wait forever for a rank that is gone, so none is made."""
    if dist.is_initialized():
        if clean:
            dist.barrier()
        gc.collect()
        dist.destroy_process_group()
