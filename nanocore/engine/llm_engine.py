"""LLMEngine: requests in, one step at a time through scheduler -> model runner -> postprocess."""
from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass, field

import numpy as np
import torch

from nanocore.config import EngineConfig
from nanocore.engine.block_manager import BlockManager
from nanocore.engine.detokenizer import IncrementalDetokenizer, encode_prompt
from nanocore.runner.host_transfer import upload
from nanocore.engine.lookahead import Lookahead, allocate_lookahead, lookahead_rows
from nanocore.runner.model_runner import ModelRunner
from nanocore.engine.outputs import EngineStats, Logprob, RequestOutput, logprob_dict, request_output
from nanocore.engine.sampling_params import SamplingParams
from nanocore.engine.scheduler import Scheduler
from nanocore.engine.sequence import Sequence
from nanocore.engine.stop_checks import check_finish
from nanocore.plugins import build_backend

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
        """``loaded_model``: a ``LoadedModel`` already built (tests); by default ``load_model(config)``."""
        self.config = config
        self.device = resolve_device(config.device)
        self.workers = None  # WorkerGroup of ranks 1..N-1 when tensor / expert parallel
        if loaded_model is None:
            loaded_model = self._load(config)
        elif config.tensor_parallel_size > 1 or config.expert_parallel_size > 1:
            raise ValueError("a prebuilt loaded_model runs on one rank only; with tensor_parallel_size or "
                             "expert_parallel_size > 1 let the engine load the model (drop loaded_model)")
        self.loaded = loaded_model
        self.tokenizer = loaded_model.tokenizer
        self.eos_token_ids = set(loaded_model.eos_token_ids or [])
        self.max_model_len = config.max_model_len or loaded_model.max_model_len
        if loaded_model.max_model_len and self.max_model_len > loaded_model.max_model_len:
            raise ValueError(f"max_model_len {self.max_model_len} exceeds the model's {loaded_model.max_model_len}")
        if self.workers is None:
            codec = build_backend("kv_codec", config, self.device)
            self.runner = ModelRunner(config, loaded_model, self.device, codec, self.max_model_len)
        else:  # every rank builds its codec and runner; the KV block count is the minimum over ranks
            self.runner = self.workers.build_runner(loaded_model, self.max_model_len)
        prefix_cache = build_backend("prefix_cache", config, self.device, config.block_size, self.runner.num_blocks)
        self.block_manager = BlockManager(self.runner.num_blocks, config.block_size, prefix_cache)
        self.scheduler = Scheduler(build_backend("scheduler_policy", config, self.device), self.block_manager,
                                   config.max_num_seqs, config.max_num_batched_tokens, self.max_model_len)
        self.requests: dict[str, Request] = {}
        self.stats = EngineStats()
        self._seq_ids = itertools.count()
        self._request_ids = itertools.count()
        #: overlap decode steps (see lookahead.py): by default only on CUDA (on CPU the forward runs while it is
        #: launched, so there is nothing to overlap); tensor / expert parallel runs synchronously
        wanted = config.async_scheduling if config.async_scheduling is not None else self.device.type == "cuda"
        self.async_scheduling = wanted and self.workers is None
        self._lookahead: Lookahead | None = None

    def _load(self, config: EngineConfig):
        if config.tensor_parallel_size > 1 or config.expert_parallel_size > 1:
            from nanocore.runner.multiproc_executor import WorkerGroup
            self.workers = WorkerGroup(config, self.device)  # spawns ranks 1..N-1; this process is rank 0
            return self.workers.load_model()
        from nanocore.distributed.parallel import ParallelContext
        from nanocore.loader import load_model
        return load_model(config, self.device, ParallelContext())

    def close(self) -> None:
        """Stop the tensor / expert-parallel workers (also happens when the engine is collected or at exit)."""
        if self.workers is not None:
            self.workers.close()

    # ---- requests ------------------------------------------------------------------------
    def tokenize(self, prompt: str) -> list[int]:
        return encode_prompt(self.tokenizer, prompt)

    def add_request(self, prompt: str | list[int], sampling_params: SamplingParams | None = None,
                    request_id: str | None = None, stream: bool = False) -> Request:
        """Queue a prompt (text or token ids); raises ValueError if it can never run."""
        params = sampling_params or SamplingParams()
        if not isinstance(params, SamplingParams):
            raise ValueError(f"sampling_params must be a SamplingParams, got {type(params).__name__}")
        if params.stop_strings and self.tokenizer is None:  # they would be silently ignored
            raise ValueError(f"stop strings {params.stop_strings} need a tokenizer to match text, and this model has "
                             f"none; use stop_token_ids, or give the model a tokenizer (tokenizer=FOLDER)")
        text = prompt if isinstance(prompt, str) else None
        token_ids = self.tokenize(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        if not token_ids:
            raise ValueError("the prompt is empty; give at least one token")
        if text is None and self.loaded.hf_config is not None:
            vocab = getattr(self.loaded.hf_config, "vocab_size", None)
            if vocab and not all(0 <= t < vocab for t in token_ids):
                raise ValueError(f"prompt token ids must be in [0, {vocab}) for this model")
        vocab = getattr(self.loaded.hf_config, "vocab_size", None)
        if vocab and not all(t < vocab for t in params.stop_token_ids):  # min_tokens would index past the logits
            raise ValueError(f"stop_token_ids must be in [0, {vocab}) for this model, got {params.stop_token_ids}")
        max_tokens = params.max_tokens or self.max_model_len - len(token_ids)
        self.scheduler.check_fits(len(token_ids), max(max_tokens, 1))
        request_id = request_id if request_id is not None else str(next(self._request_ids))
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        request = Request(request_id, text, token_ids, params, [])
        for index in range(params.n):
            seq_id = next(self._seq_ids)  # ids grow with arrival, so they double as the arrival index
            seq = Sequence(seq_id, seq_id, token_ids, params, max_tokens, request_id, index)
            if params.seed is not None:
                seq.generator = torch.Generator(device=self.device)
                seq.generator.manual_seed(params.seed if index == 0 else hash((params.seed, index)) & (2**62 - 1))
            request.seqs.append(seq)
            incremental = stream or bool(params.stop_strings)
            request.detokenizers.append(
                IncrementalDetokenizer(self.tokenizer, token_ids, params.skip_special_tokens, params.stop_strings,
                                       params.include_stop_str_in_output)
                if incremental and self.tokenizer is not None else None)
            self.scheduler.add(seq)
        self.requests[request_id] = request
        self.stats.num_prompt_tokens += len(token_ids) * params.n  # each sample may hit the cache
        return request

    def abort_request(self, request_id: str) -> None:
        request = self.requests.pop(request_id, None)
        for seq in request.seqs if request else []:
            self.scheduler.abort(seq)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    # ---- the step ------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Schedule, run the model, append sampled tokens, check stops; return requests that finished.

        With ``async_scheduling`` a plain decode step also queues the next step's forward before reading
        its own tokens (``lookahead.py``); outputs are the synchronous engine's.
        """
        if not self.scheduler.has_unfinished():
            if self._lookahead is not None:  # every row finished or was aborted
                self._lookahead = self._discard_lookahead()
            return []
        lookahead, self._lookahead = self._lookahead, None
        if lookahead is not None and self.scheduler.waiting:
            lookahead.undo_blocks(self.block_manager)  # admissions see the synchronous engine's free blocks
            lookahead = self._discard_lookahead()
        batch = self.scheduler.schedule()
        if self.workers is not None:  # tensor / expert parallel: the workers run each step synchronously
            result = self.runner.execute(batch.seqs, batch.num_tokens)
        else:
            pending = self.runner.launch(batch.seqs, batch.num_tokens, self._lookahead_hidden(lookahead, batch))
            if self.async_scheduling:
                self._lookahead = self._launch_lookahead(batch, pending)
            result = pending.result()
        return self._postprocess(batch, result)

    def _lookahead_hidden(self, lookahead: Lookahead | None, batch) -> torch.Tensor | None:
        """The look-ahead's hidden states for ``batch`` if it computed exactly this batch, else None."""
        if lookahead is None:
            return None
        rows = lookahead.rows_for(batch)
        if rows is None:
            return self._discard_lookahead()
        self.stats.num_overlapped_steps += 1
        if len(rows) == len(lookahead.seqs):
            return lookahead.hidden
        return lookahead.hidden.index_select(0, upload(np.asarray(rows, dtype=np.int64), self.device))

    def _discard_lookahead(self) -> None:
        self.stats.num_discarded_lookaheads += 1
        return None

    def _launch_lookahead(self, batch, pending) -> Lookahead | None:
        rows = lookahead_rows(batch, self.scheduler, self.max_model_len)
        if rows is None:
            return None
        seqs = batch.seqs if len(rows) == len(batch.seqs) else [batch.seqs[i] for i in rows]
        grown = allocate_lookahead(self.block_manager, seqs)
        try:
            hidden = self.runner.launch_decode(seqs, pending.token_ids, None if seqs is batch.seqs else rows)
        except Exception:  # never lose this step to the optional one: give its blocks back, go synchronous
            logger.exception("async scheduling: queueing the next decode step failed; continuing synchronously")
            for seq, num_blocks in grown:
                self.block_manager.trim(seq, num_blocks)
            self.async_scheduling = False
            return None
        return Lookahead(seqs, [s.num_tokens for s in seqs], hidden, grown)

    def _postprocess(self, batch, result) -> list[RequestOutput]:
        block_size = self.block_manager.block_size
        for seq, num_tokens in zip(batch.seqs, batch.num_tokens):
            seq.num_computed_tokens += num_tokens
            if seq.num_computed_tokens // block_size > seq.num_published_blocks:  # only when a block filled up
                self.block_manager.publish(seq)
        finished: list[RequestOutput] = []
        requests, logprobs = self.requests, result.logprobs  # locals: this loop runs once per sequence
        for i, (seq, token_id) in enumerate(zip(result.seqs, result.token_ids)):
            seq.append_token(token_id)
            if logprobs is not None and seq.output_logprobs is not None:
                seq.output_logprobs.append(logprobs[i])
            request = requests[seq.request_id]
            try:
                done = check_finish(seq, request.detokenizers[seq.index], self.eos_token_ids, self.max_model_len)
            except Exception as exc:  # one request's detokenizer must not take the step down
                logger.exception("request %s: the stop check failed; finishing it with reason 'error'", seq.request_id)
                seq.finish_reason, seq.stop_reason, done = "error", f"{type(exc).__name__}: {exc}", True
            if done:
                self.scheduler.finish(seq)
                if request.finished:
                    finished.append(self.request_output(self.requests.pop(seq.request_id)))
        self._count(batch.total_tokens, len(result.token_ids), len(finished))
        return finished

    def _count(self, num_computed: int, num_generated: int, num_finished: int) -> None:
        s = self.stats
        s.num_steps += 1
        s.num_computed_tokens += num_computed
        s.num_generated_tokens += num_generated
        s.num_finished_requests += num_finished
        s.num_preemptions = self.scheduler.num_preemptions
        s.num_cached_tokens = self.scheduler.num_cached_tokens

    # ---- outputs -------------------------------------------------------------------------
    def request_output(self, request: Request) -> RequestOutput:
        return request_output(request.request_id, request.prompt, request.prompt_token_ids, request.seqs,
                              request.detokenizers, request.finished, self.tokenizer)

    def logprob_dict(self, entry: tuple[list[int], list[float], int]) -> dict[int, Logprob]:
        return logprob_dict(entry, self.tokenizer)

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
        seq = Sequence(-1, -1, token_ids, SamplingParams(max_tokens=1), max_tokens=1)
        if not token_ids or not self.block_manager.allocate(seq, len(token_ids)):
            raise ValueError(f"{len(token_ids)} tokens do not fit in the KV cache ({self.block_manager.num_blocks} "
                             f"blocks of {self.block_manager.block_size}); use a shorter window or more KV blocks")
        try:
            return self.runner.prompt_logits(seq, kv_from_cache)
        finally:
            self.block_manager.free(seq)

    def get_stats(self) -> EngineStats:
        self.stats.prefix_cache = self.block_manager.stats()
        return self.stats
