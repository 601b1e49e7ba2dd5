"""Drive a policy through the engine's real Scheduler and BlockManager with a fake model step.

The fake model keeps a simulated KV cache (slot -> token id written there) and samples a token that
is a function of the context it *reads back from the cache* through the block table. So a chunk at
the wrong position, a block shared by two sequences, or a preempted sequence restored with stale or
missing KV changes the outputs, which are compared with the same function applied without any
scheduling. Every step also checks the budget, ``max_num_seqs``, contiguity and block accounting.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

from nanocore.engine.block_manager import BlockManager
from nanocore.engine.sampling_params import SamplingParams
from nanocore.engine.scheduler import Scheduler
from nanocore.engine.sequence import Sequence, SequenceStatus
from nanocore.plugins import BackendEntry, get_registry
from nanocore.runner.step_plan import StepOutput

VOCAB = 97


def fake_next_token(context: list[int]) -> int:
    """Deterministic next token of a context (depends on order, length and recent tokens)."""
    return (sum(context[-3:]) * 31 + 7 * len(context) + context[0]) % VOCAB


def expected_outputs(prompt: list[int], num_outputs: int) -> list[int]:
    tokens = list(prompt)
    for _ in range(num_outputs):
        tokens.append(fake_next_token(tokens))
    return tokens[len(prompt):]


def make_prompt(seq_id: int, length: int) -> list[int]:
    return [(seq_id * 13 + 5 * j + 1) % VOCAB for j in range(length)]


@dataclass
class DriveResult:
    steps: int
    num_preemptions: int
    outputs: dict[int, list[int]]
    first_admitted: dict[int, int] = field(default_factory=dict)  # seq id -> step of its first tokens
    max_batch_tokens: int = 0


class DecisionChecker:
    """Stands between the Scheduler and the policy: every decision (re-asks too) names only sequences of the state it
    got, once, for 1..uncomputed tokens, within the token and sequence budgets; one naming a sequence that was
    aborted or finished fails naming it and where it was."""

    def __init__(self, policy):
        self.policy, self.name = policy, policy.name or type(policy).__name__
        self.gone: dict[int, tuple[int, str]] = {}  # id(seq) -> (seq id, how it left)

    def schedule(self, state, budget):
        decision = self.policy.schedule(state, budget)
        known, seen = {id(s) for s in (*state.waiting, *state.running)}, set()
        for item in decision.items:
            key = id(item.seq)
            if key in self.gone:
                seq_id, how = self.gone[key]
                raise AssertionError(f"policy scheduled sequence {seq_id}, which was {how}; a decision names only "
                                     f"sequences in state.waiting or state.running now: forget one once it leaves them")
            assert key in known and key not in seen, (
                f"policy scheduled sequence {item.seq.seq_id} {'twice' if key in seen else 'which it was not given'}")
            seen.add(key)
            assert 1 <= item.num_tokens <= item.seq.num_uncomputed_tokens, (
                f"sequence {item.seq.seq_id}: {item.num_tokens} tokens of {item.seq.num_uncomputed_tokens} uncomputed")
        assert sum(i.num_tokens for i in decision.items) <= budget.max_num_batched_tokens, "over the token budget"
        assert len(decision.items) <= budget.max_num_seqs, "over max_num_seqs"
        return decision


#: Where a sequence may be when it is aborted (given the sequence and whether it ran before).
ABORT_PHASES = {
    "mid-prefill": lambda seq, ran: seq.status is SequenceStatus.RUNNING and seq.num_output_tokens == 0,
    "mid-decode": lambda seq, ran: seq.status is SequenceStatus.RUNNING and seq.num_output_tokens > 0,
    "preempted": lambda seq, ran: seq.status is SequenceStatus.WAITING and ran,
}


class SchedulerDriver:
    """The engine's step loop with a fake model: schedule -> write KV -> read context -> sample -> finish."""

    def __init__(self, policy, max_num_batched_tokens: int, max_num_seqs: int, block_size: int, num_blocks: int,
                 max_model_len: int = 1 << 20):
        registry = get_registry()
        prefix_cache = registry.instantiate(registry.get("prefix_cache", "none"), None, block_size, num_blocks)
        self.block_manager = BlockManager(num_blocks, block_size, prefix_cache)
        self.checker = DecisionChecker(policy)
        self.scheduler = Scheduler(self.checker, self.block_manager, max_num_seqs, max_num_batched_tokens,
                                   max_model_len)
        self.kv: list[int | None] = [None] * (num_blocks * block_size)
        self.progress: dict[int, int] = {}  # seq id -> tokens it has computed, as this driver saw them

    def preempting(self, action):
        """Run ``action`` (a step's schedule, or a forced preemption) and check every sequence it preempted:
        seen from outside, a running sequence that came back waiting."""
        running, before = list(self.scheduler.running), self.scheduler.num_preemptions
        result = action()
        num_preempted = self.scheduler.num_preemptions - before
        front = set(map(id, list(self.scheduler.waiting)[:num_preempted]))
        for seq in running:
            if seq.status is SequenceStatus.WAITING:
                assert seq.num_blocks == 0 and seq.num_computed_tokens == 0, f"preempted {seq} still holds KV"
                assert id(seq) in front, "a preempted sequence must wait at the front of the queue"
            if seq.status is SequenceStatus.WAITING or (num_preempted and seq.num_computed_tokens == 0):
                self.progress.pop(seq.seq_id, None)  # preempted (and maybe re-admitted): restarts at position 0
        return result

    def slot(self, seq: Sequence, position: int) -> int:
        bs = self.block_manager.block_size
        return seq.block_table[position // bs] * bs + position % bs

    def run(self, arrivals: list[tuple[int, int, int]], preempt_at: frozenset[int] = frozenset(),
            aborts: tuple[str, ...] = ()) -> DriveResult:
        """``arrivals`` [(step, prompt_len, output_len)]; runs to completion, checking every step. Before the
        steps in ``preempt_at`` the latest running arrival is preempted, as KV pressure from outside would. Each
        phase in ``aborts`` aborts the first sequence found in it (``ABORT_PHASES``)."""
        pending = list(aborts)
        seqs = [Sequence(i, i, make_prompt(i, p), SamplingParams(max_tokens=o, ignore_eos=True), o)
                for i, (_, p, o) in enumerate(arrivals)]
        result = DriveResult(0, 0, {})
        # liveness: a new output token (never lost to preemption) at least every `stall_limit` steps; between two
        # of them the worst legal case recomputes every sequence from position 0 at one token per step
        stall_limit = sum(p + o for _, p, o in arrivals) * (1 + len(arrivals)) + max(a for a, _, _ in arrivals) + 1
        step, last_progress, tokens_seen = 0, 0, sum(s.num_tokens for s in seqs)
        while step <= max(a for a, _, _ in arrivals) or self.scheduler.has_unfinished():
            tokens_now = sum(s.num_tokens for s in seqs)
            if tokens_now != tokens_seen:
                last_progress, tokens_seen = step, tokens_now
            assert step - last_progress <= stall_limit, (
                f"no progress for {step - last_progress} steps (no new token; step {step}): "
                f"{self.scheduler.waiting} {self.scheduler.running}")
            for seq, (arrive, _, _) in zip(seqs, arrivals):
                if arrive == step:
                    self.scheduler.add(seq)
            step += 1
            if step in preempt_at and self.scheduler.running:
                self.preempting(self.scheduler.preempt_latest)  # the core's own path, forced at any state
            pending = [phase for phase in pending if not self.abort_first(phase, seqs, result, step)]
            if self.scheduler.has_unfinished():
                self.step(step, result)
        assert not pending, f"the run never had a sequence to abort {pending}"
        assert self.block_manager.num_free_blocks == self.block_manager.num_blocks, "blocks leaked after the run"
        result.steps, result.num_preemptions = step, self.scheduler.num_preemptions
        result.outputs = {s.seq_id: s.output_token_ids for s in seqs}
        return result

    def step(self, step: int, result: DriveResult) -> None:
        plan = self.preempting(self.scheduler.schedule)
        batch = self.scheduler.batch
        self.check_batch(batch)
        self.check_preempted_and_blocks()
        result.max_batch_tokens = max(result.max_batch_tokens, batch.total_tokens)
        for seq, row in zip(batch.seqs, plan.rows):
            result.first_admitted.setdefault(seq.seq_id, step)
            assert row.start == self.progress.get(seq.seq_id, 0), (
                f"sequence {seq.seq_id} resumes at position {row.start}, but {self.progress.get(seq.seq_id, 0)} "
                f"tokens were computed before: chunks must be contiguous")
            for position, token in enumerate(row.token_ids, start=row.start):
                self.kv[self.slot(seq, position)] = token
        sampled = []
        for seq, row in zip(batch.seqs, plan.rows):
            self.progress[seq.seq_id] = row.start + len(row.token_ids)
            if row.samples:
                context = [self.kv[self.slot(seq, p)] for p in range(seq.num_tokens)]
                assert context == seq.token_ids, f"sequence {seq.seq_id} reads KV of other tokens from its blocks"
                sampled.append(fake_next_token(context))
        output = StepOutput([r.seq_id for r in plan.rows if r.samples], sampled)
        for seq in self.scheduler.update(plan, output, stop_at_max_tokens):
            self.progress.pop(seq.seq_id, None)
            self.checker.gone[id(seq)] = (seq.seq_id, f"finished at step {step}")

    def abort_first(self, phase: str, seqs: list[Sequence], result: DriveResult, step: int) -> bool:
        """Abort the first sequence in ``phase``, as a client disconnect does; whether there was one."""
        for seq in seqs:
            if ABORT_PHASES[phase](seq, seq.seq_id in result.first_admitted):
                self.scheduler.abort(seq)
                self.progress.pop(seq.seq_id, None)
                self.checker.gone[id(seq)] = (seq.seq_id, f"aborted {phase} at step {step}")
                return True
        return False

    def check_batch(self, batch) -> None:
        s = self.scheduler
        assert batch.seqs, "the scheduler returned an empty batch with work left"
        assert len(batch.seqs) <= s.max_num_seqs, f"{len(batch.seqs)} sequences exceed max_num_seqs {s.max_num_seqs}"
        assert batch.total_tokens <= s.max_num_batched_tokens, (
            f"{batch.total_tokens} tokens exceed max_num_batched_tokens {s.max_num_batched_tokens}")
        assert len({id(q) for q in batch.seqs}) == len(batch.seqs), "a sequence runs twice in one step"
        bs = self.block_manager.block_size
        for seq, n in zip(batch.seqs, batch.num_tokens):
            assert seq.status is SequenceStatus.RUNNING, f"scheduled sequence {seq.seq_id} is {seq.status.value}"
            assert 1 <= n <= seq.num_uncomputed_tokens, f"sequence {seq.seq_id}: {n} tokens of {seq.num_uncomputed_tokens}"
            assert seq.num_blocks * bs >= seq.num_computed_tokens + n, f"sequence {seq.seq_id} lacks KV blocks"

    def check_preempted_and_blocks(self) -> None:
        """A preempted sequence holds no blocks and restarts at 0; every block has exactly one owner."""
        for seq in self.scheduler.waiting:
            assert seq.num_blocks == 0 and seq.num_computed_tokens == 0, f"waiting {seq} still holds KV"
        bs = self.block_manager.block_size
        for block_id in self.block_manager.free_blocks:  # poison free blocks: reading them without a rewrite fails
            self.kv[block_id * bs:(block_id + 1) * bs] = [None] * bs
        owned = [b for seq in self.scheduler.running for b in seq.block_table]
        assert len(owned) == len(set(owned)), "a KV block is owned by two running sequences"
        bm = self.block_manager
        assert len(owned) + bm.num_free_blocks == bm.num_blocks, (
            f"{len(owned)} owned + {bm.num_free_blocks} free blocks != {bm.num_blocks}: blocks leaked")


def stop_at_max_tokens(seq: Sequence) -> tuple[str, None] | None:
    return ("length", None) if seq.num_output_tokens >= seq.max_tokens else None


def check_arrival_order(arrivals: list[tuple[int, int, int]], first_admitted: dict[int, int]) -> None:
    """No request gets its first tokens before one that arrived earlier (FIFO admission)."""
    order = sorted(range(len(arrivals)), key=lambda i: (arrivals[i][0], i))
    for earlier, later in zip(order, order[1:]):
        assert first_admitted[earlier] <= first_admitted[later], (
            f"request {later} (arrival step {arrivals[later][0]}) was admitted at step {first_admitted[later]}, "
            f"before request {earlier} (arrival step {arrivals[earlier][0]}) at step {first_admitted[earlier]}; "
            f"a policy that overtakes must declare conformance_requirements = {{'admission_order': None}}")


@contextmanager
def registered(kind: str, cls: type):
    """``cls`` registered under its class name while the block runs, so an engine config can name a class
    bound with ``nanocore_conformance.bind`` (not installed through an entry point)."""
    entries = get_registry().entries[kind]
    assert cls.__name__ not in entries, f"{kind} {cls.__name__!r} is already registered"
    entries[cls.__name__] = [BackendEntry(kind, cls.__name__, cls, "nanocore-conformance", "bound", "bound")]
    try:
        yield cls.__name__
    finally:
        del entries[cls.__name__]


TINY_MODEL = "dummy:tiny-qwen2"
_loaded_models: dict[str, object] = {}


def tiny_loaded_model(device: str = "cpu"):
    """The tiny random Qwen2 preset (float32), built once per process and device (engines share it; each
    has its own KV cache)."""
    if device not in _loaded_models:
        from nanocore.config import EngineConfig
        from nanocore.loader import load_model
        _loaded_models[device] = load_model(EngineConfig(model=TINY_MODEL, device=device, dtype="float32"), device)
    return _loaded_models[device]


def engine_greedy_outputs(policy: str, options: dict, arrivals: list[tuple[int, list[int], int]],
                          device: str = "cpu", **config_fields) -> list[list[int]]:
    """Greedy outputs of ``arrivals`` [(step, prompt ids, max tokens)] through a real LLMEngine on the tiny
    model, each request added at its step."""
    from nanocore.config import EngineConfig
    from nanocore.engine.llm_engine import LLMEngine

    config = EngineConfig(model=TINY_MODEL, device=device, dtype="float32", prefix_cache="none",
                          kv_codec="unquantized", scheduler_policy=policy, scheduler_policy_options=options,
                          **config_fields)
    engine = LLMEngine(config, loaded_model=tiny_loaded_model(device))
    outputs: dict[str, list[int]] = {}
    step = 0
    while step <= max(a for a, _, _ in arrivals) or engine.has_unfinished_requests():
        for i, (arrive, prompt, max_tokens) in enumerate(arrivals):
            if arrive == step:
                engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True),
                                   request_id=str(i))
        for out in engine.step():
            outputs[out.request_id] = out.outputs[0].token_ids
        step += 1
    return [outputs[str(i)] for i in range(len(arrivals))]
