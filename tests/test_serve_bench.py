"""`nanocore bench serve`: the load generator's numbers and JSON, on a tiny in-process server."""
from __future__ import annotations

import json

from nanocore.bench.serve_load import RequestRecord, percentile, summarize
from nanocore.cli.main import main


def test_percentile_and_summary():
    assert percentile([], 50) is None
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5 and percentile([5.0], 99) == 5.0
    done = RequestRecord(10, 4, ok=True, output_tokens=4, latency_s=1.0, ttft_s=0.4, itls_s=[0.2, 0.2, 0.2])
    failed = RequestRecord(10, 4, error="HTTP 500")
    summary = summarize([done, failed], seconds=2.0)
    assert (summary["completed"], summary["failed"], summary["first_error"]) == (1, 1, "HTTP 500")
    assert summary["output_tokens_per_s"] == 2.0 and abs(summary["tpot_p50_ms"] - 200.0) < 1e-9
    assert summary["ttft_p99_ms"] == 400.0


def test_bench_serve_thread_server_writes_json(tmp_path, capsys):
    out = tmp_path / "serve.json"
    code = main(["bench", "serve", "--server", "thread", "--model", "dummy:tiny-qwen2", "--device", "cpu",
                 "--num-kv-blocks", "256", "--num-prompts", "12", "--min-len", "8", "--max-len", "24",
                 "--request-rate", "inf,200", "--concurrency", "6", "--warmup", "one", "--compare-offline",
                 "--threads", "1", "--json", str(out)])
    assert code == 0
    table = capsys.readouterr().out
    assert "output_tokens_per_s" in table and "served_over_offline" in table
    result = json.loads(out.read_text())
    assert [row["request_rate"] for row in result["rows"]] == ["inf", 200.0]
    for row in result["rows"]:
        assert row["completed"] == 12 and row["failed"] == 0 and row["concurrency"] == 6
        assert row["ttft_p99_ms"] > 0 and row["tpot_p50_ms"] > 0 and row["served_over_offline"] > 0
    assert result["offline"]["output_tokens"] == result["rows"][0]["output_tokens"]
    assert result["server_info"]["backends"]["kv_codec"] == "unquantized"


def test_arrival_offsets_are_a_seeded_poisson_schedule():
    from nanocore.bench.serve_load import arrival_offsets

    assert arrival_offsets(4, float("inf")) == [0.0] * 4
    offsets = arrival_offsets(2000, 50.0, seed=1)
    assert offsets == arrival_offsets(2000, 50.0, seed=1) and offsets[0] == 0.0
    gaps = [b - a for a, b in zip(offsets, offsets[1:])]
    assert min(gaps) > 0 and abs(sum(gaps) / len(gaps) - 1 / 50.0) < 0.002  # mean gap 1 / rate


def test_two_client_processes_share_one_run(tmp_path):
    """Requests are spread over the processes and come back in workload order with the right counts."""
    out = tmp_path / "serve.json"
    code = main(["bench", "serve", "--server", "thread", "--model", "dummy:tiny-qwen2", "--device", "cpu",
                 "--num-kv-blocks", "256", "--num-prompts", "7", "--min-len", "4", "--max-len", "12",
                 "--concurrency", "3", "--warmup", "none", "--client-processes", "2", "--threads", "1",
                 "--json", str(out)])
    assert code == 0
    result = json.loads(out.read_text())
    row = result["rows"][0]
    assert row["completed"] == 7 and row["failed"] == 0 and row["client_processes"] == 2
    assert result["client_processes"] == 2 and row["seconds"] > 0
    from nanocore.bench.throughput import make_workload

    expected = sum(n for _, n in make_workload(7, 4, 12, result["server_info"]["vocab_size"], 0))
    assert row["output_tokens"] == expected


def test_json_schema_requests_keep_fixed_lengths(tmp_path, monkeypatch):
    """``--json-schema``: every request carries it as its response_format; an array with a large minItems cannot
    close early, so each request still gets exactly its output length (the masked and plain runs compare)."""
    from nanocore.engine.structured import StructuredOutputs

    out, filled, fill = tmp_path / "serve.json", [], StructuredOutputs.fill
    monkeypatch.setattr(StructuredOutputs, "fill", lambda self, plan: filled.append(len(self.matchers)) or fill(
        self, plan))
    schema = {"type": "array", "items": {"type": "integer"}, "minItems": 1000}
    code = main(["bench", "serve", "--server", "thread", "--model", "default", "--device", "cpu",
                 "--num-kv-blocks", "128", "--num-prompts", "4", "--min-len", "6", "--max-len", "12",
                 "--concurrency", "4", "--warmup", "none", "--client-processes", "1", "--threads", "1",
                 "--json-schema", json.dumps(schema), "--json", str(out)])
    result = json.loads(out.read_text())
    assert code == 0 and result["rows"][0]["completed"] == 4 and result["rows"][0]["failed"] == 0
    assert result["workload"]["request_fields"]["response_format"]["json_schema"]["schema"] == schema
    assert filled and max(filled) >= 2  # the engine masked the requests' steps
