"""The step plan is plain data: what the scheduler plans travels to other ranks as columns of numbers and back."""
from __future__ import annotations

import pickle
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests use --import-mode=importlib
from engine_fakes import fake_loaded_model, recorded_plans  # noqa: E402

from nanocore.engine.llm import LLM  # noqa: E402
from nanocore.engine.sampling_params import SamplingParams  # noqa: E402
from nanocore.runner.step_plan import decode_plan, encode_plan  # noqa: E402


def plain(value) -> bool:
    if isinstance(value, (list, tuple)):
        return all(plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and plain(v) for k, v in value.items())
    return value is None or type(value) in (int, float, bool, str)


def test_every_plan_of_a_run_is_plain_data_and_survives_the_wire():
    params = [SamplingParams(temperature=0.8, seed=3, max_tokens=20, min_tokens=4, logprobs=1, stop_token_ids=[7],
                             logit_bias={3: 1.5}),
              SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, n=2),
              SamplingParams(max_tokens=0, prompt_logprobs=2)]
    plans = recorded_plans(["hello there", "abc", "a prompt scored in chunks"], params)
    assert any(r.prompt_targets for p in plans for r in p.rows)
    assert len(plans) > 10 and any(p.finished_seq_ids for p in plans) and any(len(p.rows) > 1 for p in plans)
    for plan in plans:
        columns = encode_plan(plan)
        assert plain(columns)
        assert decode_plan(pickle.loads(pickle.dumps(columns))) == plan


def test_a_malformed_plan_is_a_clear_error_not_a_smaller_batch():
    llm = LLM("fake", loaded_model=fake_loaded_model(), device="cpu", block_size=4, num_kv_blocks=24,
              prefix_cache="none", kv_codec="unquantized")
    llm.engine.add_request([1, 2, 3], SamplingParams(max_tokens=2))
    llm.engine.add_request([4, 5], SamplingParams(max_tokens=2))
    columns = encode_plan(llm.engine.scheduler.schedule())
    lost_row = dict(columns, sampling_index=columns["sampling_index"][:1])  # zip would drop a row
    with pytest.raises(ValueError, match="malformed step plan"):
        decode_plan(lost_row)
    out_of_range = dict(columns, sampling_index=[len(columns["sampling"])] * len(columns["sampling_index"]))
    with pytest.raises(ValueError, match="sampling index is outside"):
        decode_plan(out_of_range)


def test_rows_that_sample_alike_share_one_sampling_setting():
    params = [SamplingParams(temperature=0.7, max_tokens=4), SamplingParams(temperature=0.7, max_tokens=9),
              SamplingParams(temperature=0.0, max_tokens=4, logit_bias={5: -2.0})]
    plan = next(p for p in recorded_plans(["ab", "cd", "ef"], params) if len(p.rows) == 3)
    columns = encode_plan(plan)
    assert len(columns["sampling"]) == len(columns["logit_bias"]) == 2
    assert columns["sampling_index"] == [0, 0, 1]
    assert decode_plan(columns) == plan


def test_keywords_on_a_config_keep_its_model():
    from nanocore.config import EngineConfig

    config = EngineConfig(model="dummy:tiny-qwen2", device="cpu", num_kv_blocks=64, block_size=16)
    llm = LLM(config=config, max_num_seqs=3)
    assert llm.config.model == "dummy:tiny-qwen2" and llm.config.max_num_seqs == 3
