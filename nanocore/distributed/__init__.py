"""TP / EP process groups on torch.distributed (NCCL on GPU, gloo on CPU)."""
from nanocore.distributed.parallel import (
    ParallelContext,
    abandon_process_group,
    destroy_distributed,
    divide,
    exit_worker_process,
    init_distributed,
    tp_all_gather,
    tp_all_reduce,
)

__all__ = ["ParallelContext", "abandon_process_group", "destroy_distributed", "divide", "exit_worker_process",
           "init_distributed", "tp_all_gather", "tp_all_reduce"]
