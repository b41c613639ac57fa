"""Process group and device of this rank: gloo on CPU, NCCL on GPU, nothing at all when WORLD_SIZE is 1."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Dist:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def initialized(self) -> bool:
        return self.world_size > 1


def pick_device(preference: str, local_rank: int) -> torch.device:
    """`auto` = this rank's GPU when CUDA is available, else the CPU."""
    if preference == "cuda" or (preference == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise RuntimeError("device: cuda was asked for but torch.cuda.is_available() is False")
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def setup(device_preference: str) -> Dist:
    """Read torchrun's RANK/LOCAL_RANK/WORLD_SIZE, pick the device, join the process group when world > 1."""
    rank = int(os.environ.get("RANK", 0))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    device = pick_device(device_preference, local_rank)
    if world > 1 and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        kwargs = {"device_id": device} if device.type == "cuda" else {}
        dist.init_process_group(backend, rank=rank, world_size=world, timeout=timedelta(minutes=10), **kwargs)
    return Dist(rank, local_rank, world, device)


def all_reduce_sum(t: torch.Tensor, d: Dist) -> torch.Tensor:
    """In-place sum over ranks (asynchronous on the GPU stream: no host sync)."""
    if d.initialized:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def teardown() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
