"""ModelRunner: owns the model and the paged KV cache of one rank; runs a ``StepPlan`` and samples.

Per step: build the inputs (``inputs.InputBuilder``), run the model (a CUDA graph where one was captured),
compute logits only for rows that sample (a prefill chunk that does not reach the end of its prompt samples
nothing), and sample on the device. ``launch`` / ``launch_ahead`` only queue work, so the engine can overlap it
with host work.
"""
from __future__ import annotations

import dataclasses
import logging

import numpy as np
import torch

from nanocore.config import EngineConfig
from nanocore.interfaces import KVCodec
from nanocore.kernels.attention_config import decode_order_mode
from nanocore.layers.sampler import Sampler, SamplerOutput
from nanocore.runner.cuda_graphs import capture_graphs
from nanocore.runner.host_transfer import HostCopy, upload
from nanocore.runner.inputs import InputBuilder, StepInputs
from nanocore.runner.kv_sizing import choose_num_kv_blocks, kv_bytes_per_block
from nanocore.runner.prompt_logprobs import PendingPromptLogprobs, PromptRows, score_prompts
from nanocore.runner.sampling_inputs import SamplingInputs
from nanocore.runner.step_plan import AheadPlan, ScheduledRow, StepOutput, StepPlan

logger = logging.getLogger("nanocore")


class PendingOutput:
    """A step's sampling queued on the device; ``result()`` waits for the sampled ids (pinned copies)."""

    def __init__(self, rows: list[ScheduledRow], out: SamplerOutput | None = None,
                 prompt: PendingPromptLogprobs | None = None):
        self.rows, self.out, self.prompt = rows, out, prompt
        self.host_ids = HostCopy(out.token_ids) if out is not None else None
        # logprobs too: a pageable copy would wait for the look-ahead forward queued after this step
        self.host_logprobs = None if out is None or out.logprobs is None else tuple(
            HostCopy(t) for t in (out.logprob_token_ids, out.logprobs, out.sampled_ranks))

    @property
    def token_ids(self) -> torch.Tensor:
        """The sampled ids on the device, one per sampled row: the next look-ahead step's input ids."""
        return self.out.token_ids

    def result(self) -> StepOutput:
        prompt = None if self.prompt is None else self.prompt.result()
        if self.out is None:  # nothing sampled, or a rank that does not sample
            return StepOutput([], [], prompt_logprobs=prompt)
        output = StepOutput([r.seq_id for r in self.rows], self.host_ids.tolist(), prompt_logprobs=prompt)
        if self.host_logprobs is not None:
            ids, lps, ranks = (copy.tolist() for copy in self.host_logprobs)
            keep = [1 + (r.sampling.logprobs or 0) for r in self.rows]
            output.logprobs = [(ids[i][:k], lps[i][:k], ranks[i]) for i, k in enumerate(keep)]
        return output


class ModelRunner:
    #: False on ranks other than 0: they run every forward (its collectives need them); rank 0 samples
    samples = True

    def __init__(self, config: EngineConfig, loaded, device: torch.device, codec: KVCodec, max_model_len: int):
        """``loaded``: the LoadedModel (model, dtype) of this rank."""
        self.model = model = loaded.model
        self.device = device
        self.dtype = dtype = loaded.dtype
        self.codec = codec
        self.block_size = config.block_size
        self.decode_order = decode_order_mode(device.type, config.attention_decode_order)  # graphs follow it
        num_layers, num_kv_heads, head_dim = kv_cache_spec = model.kv_cache_spec
        self.bytes_per_block = bytes_per_block = kv_bytes_per_block(codec, kv_cache_spec, dtype, self.block_size)
        self.num_blocks = choose_num_kv_blocks(config, model, max_model_len, bytes_per_block, device)
        logger.info("KV cache: %d blocks of %d tokens = %d tokens (%.2f GiB, codec %r)", self.num_blocks,
                    self.block_size, self.num_blocks * self.block_size, self.num_blocks * bytes_per_block / 2**30,
                    codec.name)
        self.kv_caches = [codec.allocate(self.num_blocks, self.block_size, num_kv_heads, head_dim, dtype, device)
                          for _ in range(num_layers)]
        generator = torch.Generator(device=device)
        generator.manual_seed(config.seed)
        self.sampler = Sampler(generator)
        self.inputs = InputBuilder(self.block_size, -(-max_model_len // self.block_size), device, self.decode_order)
        self.sampling = SamplingInputs(device)
        self._ahead_hidden: torch.Tensor | None = None  # the last AheadPlan's hidden states, until a plan uses them
        if device.type == "cuda" and config.kernel_warmup:  # before graph capture: eager steps' kernels too
            from nanocore.runner.warmup import ServingLimits, run_warmup
            run_warmup(self, ServingLimits(config.max_num_batched_tokens, config.max_num_seqs, max_model_len))
        self.decode_graphs, self.mixed_graphs = capture_graphs(config, model, self.kv_caches, codec, max_model_len,
                                                               device, dtype, self.decode_order)

    @property
    def capacity_tokens(self) -> int:
        """KV-cache capacity in tokens (all sequences together)."""
        return self.num_blocks * self.block_size

    def prepare(self, plan: StepPlan, all_logits: bool = False) -> StepInputs:
        return self.inputs.prepare(plan, self.kv_caches, self.codec, all_logits)

    def prepare_ahead(self, ahead: AheadPlan, token_ids: torch.Tensor) -> StepInputs:
        return self.inputs.prepare_ahead(ahead, token_ids, self.kv_caches, self.codec)

    def _forward(self, inputs: StepInputs) -> torch.Tensor:
        if self.decode_graphs is not None and self.decode_graphs.can_run(inputs.meta, inputs.meta.num_seqs):
            return self.decode_graphs.run(inputs.input_ids, inputs.positions, inputs.meta)
        if self.mixed_graphs is not None and self.mixed_graphs.can_run(inputs.meta, inputs.input_ids.shape[0]):
            return self.mixed_graphs.run(inputs.input_ids, inputs.positions, inputs.meta)
        return self.model.forward(inputs.input_ids, inputs.positions, inputs.meta)

    @torch.inference_mode()
    def execute(self, plan: StepPlan) -> StepOutput:
        """Run one step of ``plan`` and sample for the rows that reach their sequence's end."""
        return self.launch(plan).result()

    @torch.inference_mode()
    def launch(self, plan: StepPlan) -> PendingOutput:
        """Forward, logits and sampling of one step, queued on the device; ``.result()`` waits for the ids.
        A plan that repeats the last ``AheadPlan`` (``plan.ahead_rows``) queues only logits and sampling."""
        self.sampling.drop(plan.finished_seq_ids)
        if plan.reset_seq_ids:
            self.inputs.tables.forget(plan.reset_seq_ids)
        ahead, self._ahead_hidden = self._ahead_hidden, None
        rows, prompt = plan.rows, None
        if plan.ahead_rows is not None and ahead is not None:
            hidden = ahead if len(plan.ahead_rows) == ahead.shape[0] else ahead.index_select(
                0, upload(np.asarray(plan.ahead_rows, dtype=np.int64), self.device))
            sampled = rows
        else:
            inputs = self.prepare(plan)
            hidden = self._forward(inputs)
            if inputs.prompt is not None:
                prompt = self._score_prompts(hidden, inputs.prompt, rows)
            sampled = [rows[i] for i in inputs.sample_rows]
            if len(sampled) < len(rows) or inputs.meta.max_query_len > 1:
                hidden = hidden[inputs.logits_indices]
        if not sampled:
            return PendingOutput([], prompt=prompt)
        logits = self.model.compute_logits(hidden)
        if not self.samples:
            return PendingOutput([])
        sampling = self.sampling.tensors(sampled, plan.token_bitmask, plan.bitmask_rows)
        return PendingOutput(sampled, self.sampler(logits, sampling), prompt)

    def _score_prompts(self, hidden: torch.Tensor, prompt: PromptRows,
                       rows: list[ScheduledRow]) -> PendingPromptLogprobs | None:
        """Prompt logprobs of the positions rows score, queued (every rank computes the logits; rank 0 keeps them)."""
        scored = score_prompts(self.model, hidden, prompt, self.samples)
        return None if scored is None else PendingPromptLogprobs([rows[i] for i in prompt.rows], scored)

    @torch.inference_mode()
    def launch_ahead(self, ahead: AheadPlan, token_ids: torch.Tensor) -> None:
        """Queue the forward of the decode step after the one whose samples ``token_ids`` are still on the
        device; the next plan that repeats it (``ahead_rows``) samples from its hidden states."""
        self._ahead_hidden = self._forward(self.prepare_ahead(ahead, token_ids))

    @torch.inference_mode()
    def prompt_logits(self, row: ScheduledRow, kv_from_cache: bool = False) -> torch.Tensor:
        """Logits ``[len(row.token_ids), vocab]`` of a whole sequence whose blocks are allocated (teacher forcing).

        ``kv_from_cache``: the tokens attend to each other through the quantized cache (stored, then read back
        through the codec), so a perplexity measures the codec; False scores them as a prefill runs.
        """
        inputs = self.prepare(StepPlan([row]), all_logits=True)
        meta = dataclasses.replace(inputs.meta, kv_from_cache=kv_from_cache, launch_choices={})  # a fresh memo
        hidden = self.model.forward(inputs.input_ids, inputs.positions, meta)
        return self.model.compute_logits(hidden).float()  # evaluation scores in float32
