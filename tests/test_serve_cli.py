"""`nanocore serve` as a user starts it (a subprocess: flags, TOML, env, SIGTERM) and the CLI errors it shares."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

from nanocore.cli.main import main
from nanocore.serve.server import free_port

CLI = [sys.executable, "-m", "nanocore.cli.main"]
TINY = ["--model", "dummy:tiny-qwen2", "--device", "cpu"]


def wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read()
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise AssertionError("the server did not become healthy")


def read_stream(url: str, max_tokens: int, results: list) -> None:
    body = {"prompt": [1, 2, 3], "max_tokens": max_tokens, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    try:
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as response:
            results.extend(line[6:] for line in response.iter_lines() if line.startswith("data: "))
    except httpx.HTTPError as exc:  # the aborted stream may end without its terminating chunk
        results.append(f"closed: {type(exc).__name__}")


@pytest.mark.parametrize("engine_process", ["off", "on"])
def test_serve_backends_from_flag_toml_env_and_sigterm_drains(tmp_path, engine_process):
    """--kv-codec int8 (flag), scheduler_policy (TOML), prefix_cache (env) reach /version. On SIGTERM a short stream
    finishes, one longer than --drain-timeout ends with an error event, and the process ends (uvicorn re-raises
    the signal after its graceful shutdown); with --engine-process on the SIGTERM goes to the whole process group,
    as a terminal's Ctrl-C or systemd would send it, and the engine child leaves the drain to the HTTP process."""
    config = tmp_path / "engine.toml"
    config.write_text('scheduler_policy = "decode_first"\nnum_kv_blocks = 512\n')
    port = free_port()
    env = {**os.environ, "NANOCORE_PREFIX_CACHE": "radix"}
    proc = subprocess.Popen([*CLI, "serve", *TINY, "--kv-codec", "int8", "--config", str(config), "--port", str(port),
                             "--drain-timeout", "4", "--log-level", "warning", "--engine-process", engine_process],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc)
        backends = httpx.get(f"{url}/version").json()["backends"]
        assert backends == {"linear_method": "unquantized", "kv_codec": "int8", "moe_executor": None,
                            "prefix_cache": "radix", "scheduler_policy": "decode_first"}
        short, long = [], []
        readers = [threading.Thread(target=read_stream, args=(url, n, out)) for n, out in ((100, short), (4000, long))]
        for reader in readers:
            reader.start()
        assert wait_until(lambda: short and long)
        os.killpg(proc.pid, signal.SIGTERM)  # the server and, with --engine-process on, its engine child
        for reader in readers:
            reader.join(timeout=60)
        assert short[-1] == "[DONE]" and json.loads(short[-2])["usage"]["completion_tokens"] == 100
        assert json.loads(long[-2])["error"]["message"] == "the server is shutting down"  # cut at the drain timeout
        assert long[-1] == "[DONE]" and len(long) < 4000
        assert proc.wait(timeout=60) in (0, -signal.SIGTERM)
        assert "Traceback" not in proc.stdout.read()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def wait_until(condition, timeout_s: float = 60) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)
    return bool(condition())


def test_config_errors_print_one_clean_line_per_problem(capsys):
    assert main(["generate", "--prompt", "x", "--block-size", "7", "--max-num-seqs", "0"]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2 and all(line.startswith("error: ") for line in lines)
    assert "block_size must be a power of two" in lines[1] and "--block-size" in lines[1]
    assert "max_num_seqs" in lines[0] and "got '0'" in lines[0]
    assert "pydantic" not in "".join(lines)


def test_serve_config_error_before_loading(capsys):
    assert main(["serve", "--block-size", "7"]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: block_size: block_size must be a power of two (16, 32, 64 are typical), got 7 "
        "(set by --block-size)"]


def test_plugins_into_a_closed_pipe_exits_quietly(monkeypatch, capsys):
    """Like `nanocore plugins | head` when head has left: no BrokenPipeError traceback, exit code 141."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    with os.fdopen(write_end, "w") as closed_pipe:
        monkeypatch.setattr(sys, "stdout", closed_pipe)
        assert main(["plugins", "--json"]) == 141
        monkeypatch.undo()
    assert "Traceback" not in capsys.readouterr().err


def test_text_prompt_without_tokenizer_is_clean_at_tp2():
    result = subprocess.run([*CLI, "generate", *TINY, "--num-kv-blocks", "16", "--tensor-parallel-size", "2",
                             "--prompt", "hello"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 1
    assert "no tokenizer" in result.stderr and "Traceback" not in result.stderr, result.stderr


def test_serve_bad_chat_template_is_one_line_before_loading(capsys):
    assert main(["serve", "--chat-template", "no/such/template.jinja"]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: --chat-template 'no/such/template.jinja' is neither a file nor a Jinja template; give the path of "
        "a template file or the template text"]
    with pytest.raises(SystemExit):
        main(["serve", "--tool-call-parser", "mistral"])
    assert "invalid choice: 'mistral'" in capsys.readouterr().err
