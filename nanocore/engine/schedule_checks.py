"""What the scheduler checks before it runs anything: a request that can never fit, a policy's bad decision."""
from __future__ import annotations

from nanocore.engine.block_manager import BlockManager
from nanocore.engine.sequence import Sequence
from nanocore.interfaces import ScheduleDecision, StepBudget


class PolicyError(RuntimeError):
    """A scheduler policy returned a decision the core cannot run."""


def check_fits(num_prompt_tokens: int, max_tokens: int, max_model_len: int, block_manager: BlockManager) -> None:
    """Reject a request that can never run, instead of letting it wait forever. As in vLLM, output that
    would pass max_model_len is not an error: generation stops there with finish reason "length"."""
    if num_prompt_tokens >= max_model_len:
        raise ValueError(
            f"the prompt has {num_prompt_tokens} tokens but max_model_len is {max_model_len} (prompt and "
            f"output together); shorten the prompt or raise max_model_len")
    total = min(num_prompt_tokens + max_tokens, max_model_len)
    bm = block_manager
    blocks = -(-total // bm.block_size)
    if blocks > bm.num_blocks:
        raise ValueError(
            f"prompt + max_tokens = {total} tokens needs {blocks} KV blocks of {bm.block_size} tokens but the "
            f"whole KV cache has {bm.num_blocks}; raise num_kv_blocks (or cpu_kv_cache_gib / "
            f"gpu_memory_utilization) or lower max_tokens")


def validate_decision(decision: ScheduleDecision, budget: StepBudget, waiting: list[Sequence],
                      running: list[Sequence], policy_name: str) -> None:
    """A ``PolicyError`` naming the policy unless every item is a known sequence, once, within its uncomputed
    tokens, and the decision keeps to the budget."""
    def fail(why: str) -> None:
        raise PolicyError(f"scheduler policy {policy_name!r} returned an invalid decision: {why}")

    if not isinstance(decision, ScheduleDecision):
        fail(f"expected a ScheduleDecision, got {type(decision).__name__}")
    known = set(map(id, running))
    known.update(map(id, waiting))
    seen: set[int] = set()
    total = 0  # recounted: a policy may have built ``items`` without ``add``
    for item in decision.items:
        seq, n = item.seq, item.num_tokens
        key = id(seq)
        if key not in known:
            fail(f"sequence {getattr(seq, 'seq_id', seq)!r} is neither waiting nor running")
        if key in seen:
            fail(f"sequence {seq.seq_id} is scheduled twice")
        seen.add(key)
        uncomputed = seq.num_tokens - seq.num_computed_tokens
        if not isinstance(n, int) or not 1 <= n <= uncomputed:
            fail(f"sequence {seq.seq_id} scheduled for {n!r} tokens; allowed 1..{uncomputed} (its uncomputed tokens)")
        total += n
    if len(decision.items) > budget.max_num_seqs:
        fail(f"{len(decision.items)} sequences exceed max_num_seqs {budget.max_num_seqs}")
    if total > budget.max_num_batched_tokens:
        fail(f"{total} tokens exceed max_num_batched_tokens {budget.max_num_batched_tokens}")
