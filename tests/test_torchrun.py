"""Ranks from a launcher: two torchrun "nodes" on localhost (gloo) give TP=1's greedy tokens, a killed rank ends the
other with a clear error, and the messages between ranks are typed data whose malformed forms are refused."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests use --import-mode=importlib
from thread_fixtures import one_thread  # noqa: E402,F401 (autouse)
from model_fixtures import make_checkpoint  # noqa: E402
from spawn_helpers import free_port  # noqa: E402
from test_moe_models import make_moe_checkpoint  # noqa: E402
from torchrun_generate import PROMPTS  # noqa: E402

from nanocore.engine.llm import LLM  # noqa: E402
from nanocore.engine.sampling_params import SamplingParams  # noqa: E402

SCRIPT = Path(__file__).parent / "torchrun_generate.py"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
GREEDY = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)


def two_nodes(args: list[str], tmp_path: Path, env: dict | None = None,
              node1_args: list[str] | None = None) -> list[subprocess.Popen]:
    """One torchrun per "node" (static rendezvous on a free port), one rank each; node 0's rank is rank 0."""
    port, procs = free_port(), []
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    for node in range(2):
        cmd = [*TORCHRUN, "--nnodes", "2", "--nproc-per-node", "1", "--node-rank", str(node),
               "--master-addr", "127.0.0.1", "--master-port", str(port), *(node1_args if node and node1_args else args)]
        log = open(tmp_path / f"node{node}.log", "w")
        procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tmp_path,
                                      start_new_session=True))  # a process group of its own: killed whole below
    return procs


def finish(procs: list[subprocess.Popen], timeout_s: float) -> list[int]:
    try:
        return [p.wait(timeout=timeout_s) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def reference_tokens(model: Path) -> list[list[int]]:
    llm = LLM(str(model), device="cpu", block_size=4, num_kv_blocks=96)
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


@pytest.mark.slow
@pytest.mark.parametrize("kind, tp, ep", [("qwen2", 2, 1), ("qwen2_moe", 1, 2)])
def test_two_nodes_give_one_rank_greedy_tokens(tmp_path, kind, tp, ep):
    model = (make_moe_checkpoint if ep > 1 else make_checkpoint)(tmp_path / kind, kind)
    procs = two_nodes([str(SCRIPT), str(model), str(tmp_path / "out.json"), str(tp), str(ep)], tmp_path)
    codes = finish(procs, timeout_s=150)
    logs = "".join((tmp_path / f"node{n}.log").read_text() for n in range(2))
    assert codes == [0, 0], logs
    result = json.loads((tmp_path / "out.json").read_text())
    assert result["tokens"] == reference_tokens(model)
    assert "each launch runs one engine" in result["second_engine"]


@pytest.mark.slow
def test_two_nodes_as_two_pipeline_stages_give_one_rank_greedy_tokens(tmp_path):
    model = make_checkpoint(tmp_path / "qwen2", "qwen2", num_hidden_layers=3)
    procs = two_nodes([str(SCRIPT), str(model), str(tmp_path / "out.json"), "1", "1"], tmp_path,
                      {"PIPELINE_STAGES": "2"})
    codes = finish(procs, timeout_s=150)
    logs = "".join((tmp_path / f"node{n}.log").read_text() for n in range(2))
    assert codes == [0, 0], logs
    assert json.loads((tmp_path / "out.json").read_text())["tokens"] == reference_tokens(model)


def test_a_pipeline_that_does_not_fill_the_launched_ranks_says_what_to_pass(monkeypatch):
    from nanocore.config import EngineConfig
    from nanocore.runner.parallel_checks import check_world_size

    config = EngineConfig(model="dummy:x", device="cpu", tensor_parallel_size=8, pipeline_parallel_size=2)
    check_world_size(config, 16)
    with pytest.raises(ValueError, match="started 8 rank.*pipeline_parallel_size=2 make an engine of 16.*pass "
                                         "--tensor-parallel-size 4 with --pipeline-parallel-size 2"):
        check_world_size(config, 8)


@pytest.mark.slow
@pytest.mark.parametrize("victim, rank0, heartbeat_s, says", [
    ("worker", "steps", "10", "WorkerError: rank 1 (host {host}, pid {pid}) sent no heartbeat for 10 s"),
    ("worker", "idle", "4", "nanocore rank 0: WorkerError: rank 1 (host {host}, pid {pid}) sent no heartbeat"),
    ("rank0", "idle", "4", "nanocore rank 1 failed: RuntimeError: lost rank 0 while waiting for its next call"),
])
def test_a_killed_rank_ends_the_other_with_a_clear_error_within_30_s(tmp_path, victim, rank0, heartbeat_s, says):
    model = make_checkpoint(tmp_path / "qwen2", "qwen2")
    out = tmp_path / "out.json"
    hold = ["--hold", "120"] + (["--idle"] if rank0 == "idle" else [])
    procs = two_nodes([str(SCRIPT), str(model), str(out), "2", "1", *hold], tmp_path, {"HEARTBEAT_S": heartbeat_s})
    survivor = procs[0] if victim == "worker" else procs[1]
    try:
        deadline = time.monotonic() + 120
        while not out.exists() and time.monotonic() < deadline and procs[0].poll() is None:
            time.sleep(0.2)
        assert out.exists(), (tmp_path / "node0.log").read_text()
        pid = worker_pid(procs[1].pid) if victim == "worker" else json.loads(out.read_text())["pid"]
        time.sleep(1.0)
        os.kill(pid, signal.SIGKILL)
        killed_at = time.monotonic()
        assert survivor.wait(timeout=40) != 0
        took = time.monotonic() - killed_at
    finally:
        finish(procs, timeout_s=5)
    log = (tmp_path / f"node{procs.index(survivor)}.log").read_text()
    assert says.format(host=socket.gethostname(), pid=pid) in log, log
    assert took < 30, took


@pytest.mark.slow
def test_a_rank_whose_host_lacks_the_checkpoint_ends_every_rank_with_its_error(tmp_path):
    model = make_checkpoint(tmp_path / "qwen2", "qwen2")
    args = [str(SCRIPT), str(model), str(tmp_path / "out.json"), "2", "1"]
    procs = two_nodes(args, tmp_path, node1_args=[args[0], str(tmp_path / "elsewhere"), *args[2:]])
    assert finish(procs, timeout_s=120) == [1, 1]
    log = (tmp_path / "node0.log").read_text()
    assert "WorkerError: rank 1 (host" in log and "failed: FileNotFoundError: model" in log, log


def worker_pid(torchrun_pid: int) -> int:
    """The one rank a torchrun agent started (its child running the script)."""
    for _ in range(100):
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    stat = (entry / "stat").read_text()
                    cmdline = (entry / "cmdline").read_bytes()
                except OSError:
                    continue
                ppid = int(stat.rsplit(")", 1)[1].split()[1])
                agent = ppid == torchrun_pid or _parent(ppid) == torchrun_pid
                if agent and SCRIPT.name.encode() in cmdline and b"torch.distributed.run" not in cmdline:
                    return int(entry.name)
        time.sleep(0.1)
    raise AssertionError(f"no rank under torchrun {torchrun_pid}")


def _parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except OSError:
        return -1
