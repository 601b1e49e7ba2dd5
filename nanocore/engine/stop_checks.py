"""When a sequence stops after its newest token: EOS / stop ids, stop strings, length (as vLLM)."""
from __future__ import annotations

from nanocore.engine.detokenizer import IncrementalDetokenizer
from nanocore.engine.sequence import Sequence


def check_finish(seq: Sequence, detokenizer: IncrementalDetokenizer | None, eos_token_ids,
                 max_model_len: int) -> bool:
    """Stop checks after a new token: EOS / stop ids (not in the text), stop strings, length; sets
    ``seq.finish_reason`` (and ``stop_reason``) and returns whether the sequence finished."""
    params, token_id = seq.sampling_params, seq.token_ids[-1]
    # most tokens are neither EOS nor a stop id and have no text to check: only the length test remains
    if detokenizer is not None or token_id in params.stop_token_ids or (
            not params.ignore_eos and token_id in eos_token_ids):
        _check_stop(seq, detokenizer, token_id, seq.num_output_tokens >= params.min_tokens, eos_token_ids)
    if seq.finish_reason is None and seq.reaches_length(seq.num_tokens, max_model_len):
        seq.finish_reason = "length"
    return seq.finish_reason is not None


def _check_stop(seq: Sequence, detokenizer: IncrementalDetokenizer | None, token_id: int, past_min: bool,
                eos_token_ids) -> None:
    params = seq.sampling_params
    if past_min and not params.ignore_eos and token_id in eos_token_ids:
        seq.finish_reason = "stop"
    elif past_min and token_id in params.stop_token_ids:
        seq.finish_reason, seq.stop_reason = "stop", token_id
    elif detokenizer is not None:
        new_text = detokenizer.add_tokens([token_id])
        stop = detokenizer.check_stop(len(new_text)) if past_min else None
        if stop is not None:
            seq.finish_reason, seq.stop_reason = "stop", stop
