"""The engine loop's per-request bookkeeping: which deltas leave, and when."""
from __future__ import annotations

from types import SimpleNamespace

from nanocore.engine.sampling_params import SamplingParams
from nanocore.serve.request_state import NewRequest, TrackedRequest


def sample(index: int, prompt: list[int], outputs: list[int], scored: list | None):
    return SimpleNamespace(index=index, num_prompt_tokens=len(prompt), token_ids=[*prompt, *outputs],
                           num_output_tokens=len(outputs), finish_reason=None, stop_reason=None, is_finished=False,
                           output_logprobs=None, prompt_logprobs=scored,
                           scores_prompt=scored is not None and len(scored) < len(prompt) - 1)


def test_a_sibling_sample_waits_for_the_prompt_logprobs_its_first_delta_carries():
    """n=2 with prompt logprobs, streamed: sample 1 (a prefix-cache hit) samples while sample 0 still scores the
    prompt; its first delta is held until the prompt's logprobs are complete, then sent whole."""
    prompt = [5, 6, 7, 8]
    tracked = TrackedRequest(NewRequest("r", prompt, SamplingParams(n=2, prompt_logprobs=1), True, 0.0))
    first, sibling = sample(0, prompt, [], ["lp6"]), sample(1, prompt, [9], None)
    detokenizer = SimpleNamespace(stream_delta=lambda finished: "x")
    tracked.engine_request = SimpleNamespace(seqs=[first, sibling], detokenizers=[detokenizer, detokenizer])
    engine = SimpleNamespace(logprob_dict=lambda entry: {"entry": entry})
    update = tracked.collect(engine, None)
    assert update is not None and update.deltas == []  # it grew, but its first delta waits
    assert tracked.collect(engine, None) is None  # nothing new, nothing ready
    first.prompt_logprobs, first.scores_prompt = ["lp6", "lp7", "lp8"], False  # scored; sample 0 not sampled yet
    update = tracked.collect(engine, None)
    assert [d.index for d in update.deltas] == [1]
    assert update.deltas[0].prompt_logprobs == [None, {"entry": "lp6"}, {"entry": "lp7"}, {"entry": "lp8"}]
    assert update.deltas[0].token_ids == [9]
    first.token_ids, first.num_output_tokens = [*prompt, 4], 1
    assert [d.index for d in tracked.collect(engine, None).deltas] == [0]
