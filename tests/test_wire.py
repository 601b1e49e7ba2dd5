"""Messages between ranks are typed data (JSON), never pickle: every plan survives them, anything else is refused
with a clear error; a launcher's environment is read in one place and a layout that does not fit it is refused."""
from __future__ import annotations

import json
import pickle
import struct
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests use --import-mode=importlib
from engine_fakes import recorded_plans  # noqa: E402

from nanocore.config import EngineConfig  # noqa: E402
from nanocore.distributed.launcher import LaunchedRank, launched_rank  # noqa: E402
from nanocore.engine.llm import LLM  # noqa: E402
from nanocore.engine.sampling_params import SamplingParams  # noqa: E402
from nanocore.runner.parallel_checks import check_world_size  # noqa: E402
from nanocore.runner.step_plan import decode_plan, encode_plan  # noqa: E402
from nanocore.runner.wire import (PROTOCOL, WORKER_CALLS, WORKER_REPLIES, MalformedMessage,  # noqa: E402
                                  decode_message, encode_message)


def some_plans():
    params = [SamplingParams(temperature=0.7, top_p=0.9, seed=5, max_tokens=12, min_tokens=3, stop_token_ids=[7]),
              SamplingParams(temperature=0, max_tokens=15, ignore_eos=True, logprobs=2)]
    return recorded_plans(["hello there", "abc"], params)


def test_every_plan_survives_the_wire_and_the_wire_holds_no_pickle():
    plans = some_plans()
    assert len(plans) > 5 and any(p.finished_seq_ids for p in plans)
    for plan in plans:
        data = encode_message("execute", encode_plan(plan))
        assert not data.startswith(b"\x80") and b"execute" in data[:64]  # a pickle opens with PROTO
        kind, args = decode_message(data, WORKER_CALLS)
        assert kind == "execute" and decode_plan(args[0]) == plan
    row = plans[0].rows[0]
    kind, args = decode_message(encode_message("prompt_logits", encode_plan(type(plans[0])([row])), True),
                                WORKER_CALLS)
    assert kind == "prompt_logits" and decode_plan(args[0]).rows == [row] and args[1] is True


def test_replies_carry_the_start_up_stages():
    kind, args = decode_message(encode_message("ready", 12, {"kv_codec": "int8"}), WORKER_REPLIES)
    assert (kind, args) == ("ready", [12, {"kv_codec": "int8"}])
    with pytest.raises(MalformedMessage, match="unknown kind 'ready'"):
        decode_message(encode_message("ready", 12, {}), WORKER_CALLS)  # a reply is no call


def good_columns():
    return encode_plan(some_plans()[0])


def frame(header, payload: bytes = b"") -> bytes:
    """A message built by hand: header length, header, payload."""
    header = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<I", len(header)) + header + payload


@pytest.mark.parametrize("data, match", [
    (pickle.dumps(("execute", ({},))), "shorter than its header says"),
    (b"\x01\x00", "shorter than its header says"),
    (frame(b"not json"), "its header is not JSON"),
    (frame([1, 2]), "not an object with keys v, m, a, r"),
    (frame({"v": 99, "m": "exit", "a": [], "r": None}), "protocol version 99.*same nanocore version"),
    (encode_message("__reduce__"), "unknown kind '__reduce__'"),
    (encode_message("exit", 1), "'exit' takes 0 argument"),
    (encode_message("exit") + b"\0" * 8, "'exit' carries no payload"),
    (encode_message("execute", "columns"), "a step plan must be an object of columns"),
    (encode_message("execute", {"rows": []}), "needs the row lengths"),
    (frame({"v": PROTOCOL, "m": "execute", "a": [{}], "r": [[-1], [1]]}), "lists of non-negative ints"),
])
def test_a_malformed_message_is_refused_with_a_clear_error(data, match):
    with pytest.raises(MalformedMessage, match=match):
        decode_message(data, WORKER_CALLS)


def test_a_payload_that_does_not_match_its_row_lengths_is_refused():
    data = encode_message("execute", good_columns())
    for cut in (data[:-8], data + b"\0" * 8):
        with pytest.raises(MalformedMessage, match="payload holds .* bytes, the row lengths need"):
            decode_message(cut, WORKER_CALLS)


@pytest.mark.parametrize("column, value, match", [
    ("seq_id", [True], "column 'seq_id' holds a value that is not int"),
    ("finished_seq_ids", None, "column 'finished_seq_ids' is not a list"),
    ("sampling", [[0.0, 1, 1.0]], "sampling setting needs 8 values"),
    ("sampling_index", ["0"], "column 'sampling_index' holds a value that is not int"),
    ("prompt_targets", ["abc"], "prompt_targets entry is null or a list of ints"),
    ("num_prompt_logprobs", [-1], "num_prompt_logprobs holds a value"),
    ("ahead_rows", {"x": 1}, "ahead_rows is null or a list"),
    ("reset_seq_ids", ["3"], "reset_seq_ids holds a value"),
    ("logit_bias", [[[1, "big"]]], "logit_bias row is a list of"),
])
def test_a_malformed_plan_in_a_message_is_refused(column, value, match):
    columns = good_columns()
    columns[column] = value
    with pytest.raises(MalformedMessage, match=match):
        decode_message(encode_message("execute", columns), WORKER_CALLS)


def test_columns_of_different_lengths_are_a_malformed_plan():
    columns = good_columns()
    columns["start"] = columns["start"] + [0]
    _, args = decode_message(encode_message("execute", columns), WORKER_CALLS)
    with pytest.raises(ValueError, match="malformed step plan"):
        decode_plan(args[0])


def test_the_launcher_environment_is_read_in_one_place():
    assert launched_rank({}) is None
    assert launched_rank({"RANK": "3", "WORLD_SIZE": "16", "LOCAL_RANK": "3"}) == LaunchedRank(3, 16, 3)
    with pytest.raises(ValueError, match="RANK set but WORLD_SIZE, LOCAL_RANK not: start nanocore with torchrun"):
        launched_rank({"RANK": "0"})
    with pytest.raises(ValueError, match="must be integers"):
        launched_rank({"RANK": "a", "WORLD_SIZE": "2", "LOCAL_RANK": "0"})
    with pytest.raises(ValueError, match="RANK 2 is not in 0..WORLD_SIZE-1"):
        launched_rank({"RANK": "2", "WORLD_SIZE": "2", "LOCAL_RANK": "0"})


def test_a_launcher_rank_runs_on_its_local_rank_gpu_only():
    import torch

    rank = LaunchedRank(1, 2, 1)
    assert rank.device(torch.device("cpu")) == torch.device("cpu")
    with pytest.raises(ValueError, match="each rank runs on cuda:LOCAL_RANK; pass --device cuda"):
        rank.device(torch.device("cuda", 0))


def test_a_layout_that_does_not_fill_the_launched_ranks_says_what_to_pass():
    check_world_size(EngineConfig(model="dummy:x", device="cpu", tensor_parallel_size=2, expert_parallel_size=2), 2)
    with pytest.raises(ValueError, match="started 16 rank.*tensor_parallel_size=8.*pass --tensor-parallel-size 16"):
        check_world_size(EngineConfig(model="dummy:x", device="cpu", tensor_parallel_size=8), 16)


def test_the_engine_refuses_a_mismatch_before_joining_any_group(monkeypatch, tmp_path):
    import torch.distributed as dist

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    with pytest.raises(ValueError, match="pass --tensor-parallel-size 2"):
        LLM("dummy:x", device="cpu", tensor_parallel_size=3)
    assert not dist.is_initialized()


def test_an_engine_of_one_rank_under_a_launcher_runs_on_its_own(monkeypatch):
    """Every rank its own engine (data-parallel evaluation under torchrun or accelerate): no group is joined."""
    import torch.distributed as dist

    from nanocore.runner.executor import LocalExecutor

    for name, value in (("RANK", "1"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "1")):
        monkeypatch.setenv(name, value)
    llm = LLM("dummy:tiny-qwen2", device="cpu", num_kv_blocks=16, block_size=16)
    assert isinstance(llm.engine.executor, LocalExecutor) and not dist.is_initialized()
    assert len(llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2, temperature=0))[0].outputs[0].token_ids) == 2
