"""Vocabulary-parallel token embedding and LM head (vocab split over TP ranks, padded)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from nanocore.distributed import ParallelContext, tp_all_gather, tp_all_reduce
from nanocore.interfaces import set_weight_attrs

#: Padded vocab is a multiple of this per rank: friendlier GEMM shapes, and every rank gets equal rows.
VOCAB_PADDING = 64


class VocabParallelEmbedding(nn.Module):
    """Rank ``r`` holds rows ``[r * rows_per_rank, (r + 1) * rows_per_rank)`` of the padded table."""

    def __init__(self, num_embeddings: int, embedding_dim: int, *, parallel: ParallelContext,
                 params_dtype: torch.dtype):
        super().__init__()
        self.num_embeddings, self.embedding_dim, self.parallel = num_embeddings, embedding_dim, parallel
        padded = -(-num_embeddings // VOCAB_PADDING) * VOCAB_PADDING
        self.rows_per_rank = -(-padded // parallel.tp_size)
        self.vocab_start = parallel.tp_rank * self.rows_per_rank
        self.vocab_end = min(self.vocab_start + self.rows_per_rank, num_embeddings)
        # padding rows stay zero: they never match a token and give logits sliced off later
        self.weight = nn.Parameter(torch.zeros(self.rows_per_rank, embedding_dim, dtype=params_dtype),
                                   requires_grad=False)
        set_weight_attrs(self.weight, {"weight_loader": self.weight_loader, "output_dim": 0})

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id=None) -> None:
        if tuple(loaded_weight.shape) != (self.num_embeddings, self.embedding_dim):
            raise ValueError(f"embedding tensor has shape {tuple(loaded_weight.shape)}, the model expects "
                             f"{(self.num_embeddings, self.embedding_dim)} (vocab_size, hidden_size) from config.json")
        rows = max(self.vocab_end - self.vocab_start, 0)
        param.data[:rows].copy_(loaded_weight[self.vocab_start:self.vocab_start + rows])

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.parallel.tp_size == 1:
            return F.embedding(input_ids, self.weight)
        local = (input_ids >= self.vocab_start) & (input_ids < self.vocab_end)
        ids = torch.where(local, input_ids - self.vocab_start, 0)
        out = F.embedding(ids, self.weight) * local.unsqueeze(-1).to(self.weight.dtype)
        return tp_all_reduce(out, self.parallel)


class ParallelLMHead(VocabParallelEmbedding):
    """Projects hidden states to vocab logits; every rank receives the full vocab (all-gather)."""

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits in the model dtype: the samplers read them as they are (argmax and the fused kernel are exact on
        bf16; the torch path converts once), so a decode step writes no float32 copy of ``[rows, vocab]``."""
        logits = F.linear(hidden, self.weight)
        logits = tp_all_gather(logits, self.parallel, dim=-1)
        return logits[..., :self.num_embeddings]

    def tie_to(self, embedding: VocabParallelEmbedding) -> None:
        """Share the embedding's table (tie_word_embeddings)."""
        assert embedding.weight.shape == self.weight.shape, "tied embedding and LM head must be sharded alike"
        self.weight = embedding.weight
