"""Ranks started by a launcher (``torchrun``): detected from its environment, joined through ``env://``."""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from nanocore.distributed.parallel import ParallelContext, init_distributed

#: what torchrun (and other env:// launchers) set for every rank it starts
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
RENDEZVOUS_VARS = ("MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class LaunchedRank:
    rank: int
    world_size: int
    local_rank: int  # this rank's index on its node: its GPU

    def device(self, device: torch.device) -> torch.device:
        """``cuda:LOCAL_RANK`` for a CUDA engine (one GPU per rank; a rank that sees one GPU uses it), else
        ``device``."""
        if device.type != "cuda":
            return device
        if device.index is not None:
            raise ValueError(f"device {str(device)!r}: under torchrun each rank runs on cuda:LOCAL_RANK; pass "
                             f"--device cuda (or set CUDA_VISIBLE_DEVICES per node)")
        if torch.cuda.device_count() == 1:  # the launcher gave each rank its own CUDA_VISIBLE_DEVICES
            return torch.device("cuda", 0)
        if self.local_rank >= torch.cuda.device_count():
            raise ValueError(f"rank {self.rank} has LOCAL_RANK {self.local_rank} but this node has "
                             f"{torch.cuda.device_count()} visible GPU(s); lower --nproc-per-node to at most that")
        return torch.device("cuda", self.local_rank)


def launched_rank(environ: Mapping[str, str] = os.environ) -> LaunchedRank | None:
    """This process's rank when a launcher started it (RANK, WORLD_SIZE and LOCAL_RANK set), else None."""
    present = [name for name in LAUNCHER_VARS if name in environ]
    if not present:
        return None
    if len(present) < len(LAUNCHER_VARS):
        missing = [name for name in LAUNCHER_VARS if name not in environ]
        raise ValueError(f"{', '.join(present)} set but {', '.join(missing)} not: start nanocore with torchrun "
                         f"(which sets {', '.join(LAUNCHER_VARS + RENDEZVOUS_VARS)}) or unset {', '.join(present)}")
    try:
        rank, world_size, local_rank = (int(environ[name]) for name in LAUNCHER_VARS)
    except ValueError:
        raise ValueError(f"RANK, WORLD_SIZE and LOCAL_RANK must be integers, got "
                         f"{[environ[name] for name in LAUNCHER_VARS]}") from None
    if not (0 <= rank < world_size and local_rank >= 0):
        raise ValueError(f"RANK {rank} is not in 0..WORLD_SIZE-1 ({world_size}) or LOCAL_RANK {local_rank} < 0")
    return LaunchedRank(rank, world_size, local_rank)


def join_launched_group(launch: LaunchedRank, tp_size: int, ep_size: int, device: torch.device,
                        timeout: timedelta, pp_size: int = 1) -> tuple[ParallelContext, bool]:
    """The launcher's process group (or a new one through ``env://``) with the TP / EP groups carved from it;
    True when this call created the group (so this rank leaves it at the end)."""
    created = not dist.is_initialized()
    if created:
        missing = [name for name in RENDEZVOUS_VARS if name not in os.environ]
        if missing:
            raise ValueError(f"{', '.join(missing)} unset: env:// needs the address of rank 0's store; start "
                             f"nanocore with torchrun (--rdzv-endpoint or --master-addr / --master-port)")
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", init_method="env://",
                                rank=launch.rank, world_size=launch.world_size, timeout=timeout)
    elif (dist.get_rank(), dist.get_world_size()) != (launch.rank, launch.world_size):
        raise ValueError(f"the process group in this process is rank {dist.get_rank()} of {dist.get_world_size()} "
                         f"but the launcher says RANK {launch.rank} of WORLD_SIZE {launch.world_size}")
    parallel = init_distributed(launch.rank, launch.world_size, tp_size=tp_size, ep_size=ep_size, pp_size=pp_size,
                                device=device, init_method="env://")
    return parallel, created
