"""`nanocore.bench.greedy_match`: the verdict logic, and a CPU run against its own reference."""
import json

from nanocore.bench import greedy_match as gm


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
