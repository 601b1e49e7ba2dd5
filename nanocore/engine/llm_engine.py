"""LLMEngine: requests in, one step at a time: the scheduler plans, the executor runs, the scheduler updates."""
from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass, field

import torch

from nanocore.config import EngineConfig
from nanocore.distributed.launcher import launched_rank
from nanocore.engine.block_manager import BlockManager
from nanocore.engine.detokenizer import IncrementalDetokenizer, encode_prompt
from nanocore.engine.output_processor import OutputProcessor, Stop
from nanocore.engine.outputs import EngineStats, Logprob, RequestOutput
from nanocore.engine.sampling_params import SamplingParams
from nanocore.engine.scheduler import Scheduler
from nanocore.engine.sequence import Sequence, row_sampling
from nanocore.engine.structured import StructuredOutputs
from nanocore.plugins import build_backend
from nanocore.runner.executor import Executor, LocalExecutor
from nanocore.runner.model_runner import PendingOutput
from nanocore.runner.parallel_checks import world_size_of
from nanocore.runner.step_plan import StepOutput, StepPlan

logger = logging.getLogger("nanocore")


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} asked for but CUDA is not available here; use --device cpu")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(f"device {name!r} does not exist: this machine has {torch.cuda.device_count()} CUDA "
                         f"device(s), cuda:0 .. cuda:{torch.cuda.device_count() - 1}")
    return device


@dataclass
class Request:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    seqs: list[Sequence]
    detokenizers: list[IncrementalDetokenizer | None] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return all(s.is_finished for s in self.seqs)


class LLMEngine:
    def __init__(self, config: EngineConfig, loaded_model=None):
        """``loaded_model``: a ``LoadedModel`` already built (tests); by default the executor loads it."""
        self.config = config
        self.device = resolve_device(config.device)
        self.executor = self._executor(config, loaded_model is not None)
        self.device = self.executor.device  # a launcher rank runs on its LOCAL_RANK GPU
        self.loaded = loaded_model = loaded_model or self.executor.load_model()
        self.tokenizer = loaded_model.tokenizer
        self.eos_token_ids = set(loaded_model.eos_token_ids or [])
        self.max_model_len = config.max_model_len or loaded_model.max_model_len
        if loaded_model.max_model_len and self.max_model_len > loaded_model.max_model_len:
            raise ValueError(f"max_model_len {self.max_model_len} exceeds the model's {loaded_model.max_model_len}")
        self.executor.start(loaded_model, self.max_model_len)
        self.runner = self.executor.runner  # rank 0's ModelRunner
        num_blocks = self.executor.num_blocks
        prefix_cache = build_backend("prefix_cache", config, self.device, config.block_size, num_blocks)
        self.block_manager = BlockManager(num_blocks, config.block_size, prefix_cache)
        self.scheduler = Scheduler(build_backend("scheduler_policy", config, self.device), self.block_manager,
                                   config.max_num_seqs, config.max_num_batched_tokens, self.max_model_len)
        self.requests: dict[str, Request] = {}
        self.outputs = OutputProcessor(self.tokenizer, self.eos_token_ids, self.max_model_len, self.requests)
        self.vocab_size = getattr(loaded_model.hf_config, "vocab_size", None)
        self.structured = StructuredOutputs(config, self.device, self.tokenizer, self.vocab_size, self.eos_token_ids)
        self.stats = EngineStats()
        self._seq_ids = itertools.count()
        self._request_ids = itertools.count()
        #: plan each decode step ahead (see lookahead.py): by default only on CUDA (on CPU the forward runs while it
        #: is launched, so there is nothing to overlap), and only where the executor can queue steps
        wanted = config.async_scheduling if config.async_scheduling is not None else self.device.type == "cuda"
        self.async_scheduling = wanted and self.executor.overlaps_steps

    def _executor(self, config: EngineConfig, prebuilt: bool) -> Executor:
        launch = launched_rank()
        if launch is not None and world_size_of(config) == 1:  # one engine per rank (data parallel), on its GPU
            return LocalExecutor(config, launch.device(self.device))
        if launch is not None:
            if prebuilt:
                raise ValueError("a prebuilt loaded_model runs on one rank only; under torchrun let the engine load "
                                 "the model (drop loaded_model)")
            from nanocore.runner.launcher_executor import launcher_executor
            return launcher_executor(config, self.device, launch)  # ranks > 0 serve rank 0 there, then exit
        if config.tensor_parallel_size == config.expert_parallel_size == config.pipeline_parallel_size == 1:
            return LocalExecutor(config, self.device)
        if prebuilt:
            raise ValueError("a prebuilt loaded_model runs on one rank only; with tensor_parallel_size, "
                             "expert_parallel_size or pipeline_parallel_size > 1 let the engine load the model "
                             "(drop loaded_model)")
        from nanocore.runner.multiproc_executor import MultiprocExecutor
        return MultiprocExecutor(config, self.device)  # spawns ranks 1..N-1; this process is rank 0

    def close(self) -> None:
        """Stop the tensor / expert-parallel workers (also happens when the engine is collected or at exit)."""
        self.executor.close()

    # ---- requests ------------------------------------------------------------------------
    def tokenize(self, prompt: str) -> list[int]:
        return encode_prompt(self.tokenizer, prompt)

    def add_request(self, prompt: str | list[int], sampling_params: SamplingParams | None = None,
                    request_id: str | None = None, stream: bool = False) -> Request:
        """Queue a prompt (text or token ids); raises ValueError if it can never run."""
        params = sampling_params or SamplingParams()
        token_ids = self._check_request(prompt, params)
        max_tokens = self.max_model_len - len(token_ids) if params.max_tokens is None else params.max_tokens
        self.scheduler.check_fits(len(token_ids), max(max_tokens, 1))
        # compiled here, once per distinct constraint, never inside a step
        compiled = None if params.structured_output is None else self.structured.compile(params.structured_output)
        request_id = request_id if request_id is not None else str(next(self._request_ids))
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        request = Request(request_id, prompt if isinstance(prompt, str) else None, token_ids, params, [])
        for index in range(params.n):
            seq_id = next(self._seq_ids)  # ids grow with arrival, so they double as the arrival index
            seed = None if params.seed is None else (
                params.seed if index == 0 else hash((params.seed, index)) & (2**62 - 1))
            request.seqs.append(Sequence(seq_id, seq_id, token_ids, params, max_tokens, request_id, index,
                                         row_sampling(params, self.eos_token_ids, seed)))
            request.detokenizers.append(self.outputs.detokenizer(token_ids, params, stream))
        if compiled is not None:  # before the scheduler sees them: a backend that raises here leaves nothing behind
            self.structured.add([seq.seq_id for seq in request.seqs], compiled)
        for seq in request.seqs:
            self.scheduler.add(seq)
        self.requests[request_id] = request
        self.stats.num_prompt_tokens += len(token_ids) * params.n  # each sample may hit the cache
        return request

    def _check_request(self, prompt: str | list[int], params: SamplingParams) -> list[int]:
        """The prompt's token ids, or a ValueError saying what is wrong with the request."""
        if not isinstance(params, SamplingParams):
            raise ValueError(f"sampling_params must be a SamplingParams, got {type(params).__name__}")
        if params.stop_strings and self.tokenizer is None:  # they would be silently ignored
            raise ValueError(f"stop strings {params.stop_strings} need a tokenizer to match text, and this model has "
                             f"none; use stop_token_ids, or give the model a tokenizer (tokenizer=FOLDER)")
        token_ids = self.tokenize(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        if not token_ids:
            raise ValueError("the prompt is empty; give at least one token")
        vocab = self.vocab_size
        if vocab and not isinstance(prompt, str) and not all(0 <= t < vocab for t in token_ids):
            raise ValueError(f"prompt token ids must be in [0, {vocab}) for this model")
        if vocab and not all(t < vocab for t in params.stop_token_ids):  # min_tokens would index past the logits
            raise ValueError(f"stop_token_ids must be in [0, {vocab}) for this model, got {params.stop_token_ids}")
        if params.structured_output is not None and self.config.pipeline_parallel_size > 1:
            raise ValueError("structured output does not run with pipeline_parallel_size > 1: the last stage samples "
                             "and the token masks are filled on rank 0; serve constrained requests from an engine "
                             "without pipeline stages (tensor_parallel_size can split the model instead)")
        outside = [t for t in params.logit_bias or () if vocab and t >= vocab]
        if outside:
            raise ValueError(f"logit_bias token id {outside[0]} is outside this model's vocabulary of {vocab} tokens; "
                             f"use ids in [0, {vocab})")
        return token_ids

    def abort_request(self, request_id: str) -> None:
        request = self.requests.pop(request_id, None)
        for seq in request.seqs if request else []:
            self.scheduler.abort(seq)
        if request is not None:
            self.structured.drop(request.seqs)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    # ---- the step ------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Schedule, execute, update; return the requests that finished.

        With ``async_scheduling`` the scheduler also plans the next decode step and the executor queues it
        before this step's tokens are read (``lookahead.py``); outputs are the synchronous engine's.
        """
        if not self.scheduler.has_unfinished():
            self.scheduler.discard_lookahead()  # every row of a planned step finished or was aborted
            self._copy_counters()
            return []
        plan = self.scheduler.schedule()
        constrained = bool(self.structured.matchers)
        if constrained:
            self.structured.fill(plan)  # masks of this step's constrained rows, from their accepted tokens
        pending = self.executor.launch(plan)
        if self.async_scheduling:
            self._launch_ahead(pending)
        output = pending.result()
        finished = self.scheduler.update(plan, output, self._stop_of if constrained else self.outputs.stop_of)
        if constrained:
            self.structured.drop(finished)
        return self._finished_outputs(plan, output, finished)

    def _stop_of(self, seq: Sequence) -> Stop | None:
        """The stop check of a step with constrained rows: each sampled token advances its matcher first."""
        verdict = self.structured.advance(seq)
        if verdict is not None and verdict[0] == "error":
            return verdict
        return self.outputs.stop_of(seq) or verdict  # a complete constraint ends the row even with ignore_eos

    def _launch_ahead(self, pending: PendingOutput) -> None:
        ahead = self.scheduler.plan_ahead()
        if ahead is None:
            return
        try:
            self.executor.launch_ahead(ahead, pending)
        except Exception:  # never lose this step to the optional one: give its blocks back, go synchronous
            logger.exception("async scheduling: queueing the next decode step failed; continuing synchronously")
            self.scheduler.cancel_lookahead()
            self.async_scheduling = False

    def _finished_outputs(self, plan: StepPlan, output: StepOutput, finished: list[Sequence]) -> list[RequestOutput]:
        outputs = []
        for seq in finished:
            request = self.requests.get(seq.request_id)
            if request is not None and request.finished:
                outputs.append(self.outputs.request_output(self.requests.pop(seq.request_id)))
        self.stats.num_steps += 1
        self.stats.num_computed_tokens += plan.num_tokens
        self.stats.num_generated_tokens += len(output.token_ids)
        self.stats.num_finished_requests += len(outputs)
        self._copy_counters()
        return outputs

    def _copy_counters(self) -> None:
        """The scheduler's counters into the stats (it owns them)."""
        scheduler = self.scheduler
        self.stats.num_preemptions, self.stats.num_cached_tokens = scheduler.num_preemptions, scheduler.num_cached_tokens
        self.stats.num_overlapped_steps = scheduler.num_overlapped_steps
        self.stats.num_discarded_lookaheads = scheduler.num_discarded_lookaheads

    # ---- outputs -------------------------------------------------------------------------
    def request_output(self, request: Request) -> RequestOutput:
        return self.outputs.request_output(request)

    def logprob_dict(self, entry: tuple[list[int], list[float], int]) -> dict[int, Logprob]:
        return self.outputs.logprob_dict(entry)

    def prompt_logits(self, token_ids: list[int], kv_from_cache: bool = False) -> torch.Tensor:
        """Teacher-forced logits ``[len(token_ids), vocab]`` through the paged cache and configured codec.

        Runs on an idle engine (evaluation); the blocks are borrowed and given back. ``kv_from_cache``: every
        token attends to the others through the quantized cache (perplexity measures the codec); else as a
        prefill does (a chunk attends to its own K/V in the model dtype).
        """
        if self.has_unfinished_requests():
            raise RuntimeError("prompt_logits needs an idle engine; finish or abort the running requests first")
        if len(token_ids) > self.max_model_len:
            raise ValueError(f"{len(token_ids)} tokens exceed max_model_len {self.max_model_len}; use a shorter window")
        with self.scheduler.borrowed_row(token_ids) as row:
            return self.executor.prompt_logits(row, kv_from_cache)

    def get_stats(self) -> EngineStats:
        self.stats.prefix_cache = self.block_manager.stats()
        return self.stats
