"""Async scheduling behind the engine's entry points: post-processed and streamed outputs, ``generate``, the
CLI flag and the default, the fallback after a failed look-ahead launch, the host-overhead bench."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests use --import-mode=importlib
# one_thread: the autouse fixture (one torch thread), imported so that it applies here
from engine_async_fixtures import drive, make_llm, mixed_params, one_thread, prompts  # noqa: E402, F401
from engine_fakes import VOCAB  # noqa: E402

from nanocore.engine.sampling_params import SamplingParams  # noqa: E402


def split_logprobs(outputs: dict) -> tuple[dict, list[float]]:
    """Outputs with each logprob's value moved to a flat list, so values compare with a tolerance and the rest
    exactly: a row that ends one step later in the async engine changes the batch size of the last steps, and the
    CPU GEMM's summation order with it (seen: 5e-7 apart on one machine)."""
    values = []
    exact = {rid: [(*c[:4], c[4] and [{t: (lp.rank, lp.decoded_token) for t, lp in step.items()} for step in c[4]])
                   for c in completions] for rid, completions in outputs.items()}
    for rid in sorted(outputs):
        values += [lp.logprob for c in outputs[rid] for step in (c[4] or []) for lp in step.values()]
    return exact, values


@pytest.mark.parametrize("stream", [False, True])
def test_requests_that_need_the_host_every_step_still_overlap(stream):
    """Logprobs, stop strings and streamed text are post-processed while the next forward runs; a stop
    string ends its row one wasted token later, like EOS, and outputs stay the synchronous engine's."""
    stop_text = "".join(VOCAB[4:6])
    params = [SamplingParams(temperature=0, max_tokens=10, logprobs=2, ignore_eos=True),
              SamplingParams(temperature=1.0, seed=2, max_tokens=24, stop=[stop_text, VOCAB[7]], ignore_eos=True),
              SamplingParams(temperature=0.8, max_tokens=16, logprobs=1, n=2)]
    waves = {0: [("hello", p) for p in params] + [("abc", SamplingParams(temperature=0, max_tokens=10))]}
    results = []
    for async_scheduling in (False, True):
        llm = make_llm(async_scheduling)
        engine, done, streamed = llm.engine, {}, {}
        for prompt, p in waves[0]:
            request = engine.add_request(prompt, p, stream=stream)
            streamed[request.request_id] = request
        while engine.has_unfinished_requests():
            for out in engine.step():
                done[out.request_id] = [(c.token_ids, c.finish_reason, c.stop_reason, c.text, c.logprobs)
                                        for c in out.outputs]
        results.append((done, llm.stats()))
    (expected, sync_stats), (got, async_stats) = results
    (got_exact, got_values), (expected_exact, expected_values) = split_logprobs(got), split_logprobs(expected)
    assert got_exact == expected_exact and got_values == pytest.approx(expected_values, abs=1e-5)
    assert any(isinstance(c[2], str) for outs in got.values() for c in outs)  # a row stopped on a stop string
    assert async_stats.num_overlapped_steps > 0 and sync_stats.num_overlapped_steps == 0


def test_generate_equals_sync_and_switch_off():
    params = mixed_params(5)
    sync_out = make_llm(False).generate(prompts(12, 5), params, use_tqdm=False)
    llm = make_llm(True)
    assert llm.generate(prompts(12, 5), params, use_tqdm=False) == sync_out
    assert llm.stats().num_overlapped_steps > 0
    llm.engine.async_scheduling = False  # the switch benchmarks flip
    before = llm.stats().num_overlapped_steps
    llm.generate(prompts(4, 6), SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)
    assert llm.stats().num_overlapped_steps == before


def test_host_overhead_bench_runs_the_async_path(capsys):
    from benchmarks.host_overhead import main

    assert main(["--num-seqs", "8", "--steps", "3", "--repeats", "1", "--prompt-len", "20", "--max-tokens", "8",
                 "--async-scheduling"]) == 0
    assert "async=True" in capsys.readouterr().out


def test_cli_flag_switches_async_scheduling():
    import argparse

    from nanocore.cli.common import add_engine_args, engine_config_from_args

    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    flags = {(): None, ("--no-async-scheduling",): False, ("--async-scheduling",): True}
    for extra, expected in flags.items():
        assert engine_config_from_args(parser.parse_args(["--device", "cpu", *extra])).async_scheduling is expected


def test_default_is_on_for_cuda_only():
    """None (the default) means on where there is something to overlap: a CUDA device, not a CPU."""
    assert make_llm(None).engine.async_scheduling is False
    assert make_llm(True).engine.async_scheduling is True


def test_a_failing_lookahead_launch_falls_back_to_synchronous_steps():
    expected = drive(make_llm(False, eos_boost=0.0), {0: [([5, 6, 7, 8], SamplingParams(temperature=0, max_tokens=12,
                                                                                            ignore_eos=True))]})
    llm = make_llm(True, eos_boost=0.0)

    def broken(*args, **kwargs):
        raise RuntimeError("simulated launch failure")
    llm.engine.runner.launch_ahead = broken
    got = drive(llm, {0: [([5, 6, 7, 8], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))]})
    assert got == expected and llm.engine.async_scheduling is False
    bm = llm.engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks  # the blocks allocated for the failed look-ahead came back
