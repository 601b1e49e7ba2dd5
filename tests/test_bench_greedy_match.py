"""`benchmarks.greedy_match`: the verdict logic, and a CPU run against its own reference."""
import json

from benchmarks import greedy_match as gm


def test_verdicts():
    ref = [{"prompt": "a", "token_ids": [1, 2, 3], "top2_gaps": [1.0, 0.01, 2.0]},
           {"prompt": "b", "token_ids": [4, 5], "top2_gaps": [0.5, None]}]
    assert gm.compare(ref, [{"token_ids": [1, 2, 3]}, {"token_ids": [4, 5]}])["verdict"] == "identical"
    near = gm.compare(ref, [{"token_ids": [1, 9, 9]}, {"token_ids": [4, 5]}])
    assert near["ok"] and near["verdict"].startswith("identical up to near-ties")
    assert near["prompts"][0] == {"prompt": "a", "first_difference": 1, "reference_gap": 0.01}
    bad = gm.compare(ref, [{"token_ids": [1, 2, 3]}, {"token_ids": [7, 5]}])
    assert not bad["ok"] and bad["verdict"].startswith("DIFFERENT")
    assert not gm.compare(ref, [{"token_ids": [1, 2, 3]}, {"token_ids": [4, 6]}])["ok"]  # no second candidate


def test_cpu_run_matches_its_reference(tmp_path):
    ref, out = tmp_path / "ref.json", tmp_path / "out.json"
    args = ["--model", "default", "--device", "cpu", "--max-tokens", "4"]  # SmolLM2, as the GPU check runs it
    assert gm.main(args + ["--write-reference", str(ref)]) == 0
    assert gm.main(args + ["--reference", str(ref), "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["verdict"] == "identical" and len(result["prompts"]) == len(gm.PROMPTS)


def test_near_tie_follows_the_coarsest_dtype():
    assert gm.near_tie_for("float32") == gm.NEAR_TIE
    assert gm.near_tie_for("float32", "bfloat16") == gm.near_tie_for("float16") == gm.HALF_PRECISION_NEAR_TIE


def test_stored_runs_compare_without_a_model(tmp_path):
    ref = {"model": "m", "dtype": "bfloat16", "max_tokens": 3,
           "rows": [{"prompt": "a", "token_ids": [1, 2, 3], "top2_gaps": [1.0, 0.125, 2.0]}]}
    run = {**ref, "device": "cuda", "rows": [{"prompt": "a", "token_ids": [1, 7, 3], "top2_gaps": [1.0, 0.1, 2.0]}]}
    (tmp_path / "ref.json").write_text(json.dumps(ref))
    (tmp_path / "run.json").write_text(json.dumps(run))
    args = ["--reference", str(tmp_path / "ref.json"), "--run-file", str(tmp_path / "run.json")]
    assert gm.main(args + ["--json", str(tmp_path / "out.json")]) == 0  # 0.125 < 0.25: a bf16 near-tie
    assert json.loads((tmp_path / "out.json").read_text())["near_tie"] == gm.HALF_PRECISION_NEAR_TIE
    assert gm.main(args + ["--near-tie", "0.05"]) == 1
