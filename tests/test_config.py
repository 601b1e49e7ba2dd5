"""EngineConfig: sources and their precedence, backend names checked against the registry, bounds."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from nanocore.config import ConfigError, EngineConfig, env_values
from nanocore.interfaces import KINDS


def write_toml(tmp_path, text: str):
    path = tmp_path / "engine.toml"
    path.write_text(text)
    return path


def test_defaults_are_auto_backends():
    config = EngineConfig()
    assert all(config.backend(kind) == ("auto", {}) for kind in KINDS)


def test_keyword_arguments():
    config = EngineConfig(max_num_seqs=8, linear_method="unquantized", scheduler_policy_options={"chunk_size": 32},
                          dtype="float32")
    assert (config.max_num_seqs, config.linear_method, config.dtype) == (8, "unquantized", "float32")
    assert config.backend("scheduler_policy") == ("auto", {"chunk_size": 32})


@pytest.mark.parametrize("text", [
    '[engine]\nmax_num_seqs = 12\nscheduler_policy = "prefill_first"\nscheduler_policy_options = { chunk_size = 64 }\n',
    'max_num_seqs = 12\nscheduler_policy = "prefill_first"\n[scheduler_policy_options]\nchunk_size = 64\n',
])  # an [engine] table, or top-level keys
def test_toml_file(tmp_path, text):
    path = write_toml(tmp_path, text)
    config = EngineConfig.load(path, environ={})
    assert config.max_num_seqs == 12
    assert config.backend("scheduler_policy") == ("prefill_first", {"chunk_size": 64})
    assert EngineConfig.from_toml(path, max_num_seqs=3).max_num_seqs == 3


def test_environment_variables():
    environ = {"NANOCORE_MAX_NUM_SEQS": "7", "NANOCORE_ENFORCE_EAGER": "true", "NANOCORE_KV_CODEC": "unquantized",
               "NANOCORE_SCHEDULER_POLICY_OPTIONS": '{"chunk_size": 2}', "NANOCORE_PLUGINS": "x",
               "NANOCORE_NOT_A_FIELD": "1", "OTHER_MAX_NUM_SEQS": "9"}
    config = EngineConfig.load(environ=environ)
    assert (config.max_num_seqs, config.enforce_eager, config.kv_codec) == (7, True, "unquantized")
    assert config.scheduler_policy_options == {"chunk_size": 2}
    assert "plugins" not in env_values(environ)


def test_precedence_defaults_toml_env_kwargs(tmp_path):
    path = write_toml(tmp_path, "max_num_seqs = 10\nblock_size = 32\nseed = 5\n")
    environ = {"NANOCORE_MAX_NUM_SEQS": "20", "NANOCORE_BLOCK_SIZE": "64"}
    config = EngineConfig.load(path, environ=environ, max_num_seqs=30)
    assert config.max_num_seqs == 30  # kwargs beat env and TOML
    assert config.block_size == 64  # env beats TOML
    assert config.seed == 5  # TOML beats defaults
    assert config.max_num_batched_tokens == EngineConfig().max_num_batched_tokens
    assert EngineConfig.load(path, environ=environ, max_num_seqs=None).max_num_seqs == 20  # None = not given


def test_environment_is_read_by_default(monkeypatch):
    monkeypatch.setenv("NANOCORE_SEED", "42")
    assert EngineConfig.load().seed == 42


def test_unknown_backend_lists_installed_names_and_suggests_closest():
    with pytest.raises(ValidationError) as info:
        EngineConfig(linear_method="unquantised")
    message = str(info.value)
    assert "unknown linear_method 'unquantised'" in message
    assert "'unquantized'" in message and "did you mean 'unquantized'?" in message
    assert "nanocore plugins" in message


def test_unknown_backend_from_env_and_toml_is_rejected_too(tmp_path):
    with pytest.raises(ConfigError, match="did you mean 'prefill_first'.* \\(set by NANOCORE_SCHEDULER_POLICY\\)"):
        EngineConfig.load(environ={"NANOCORE_SCHEDULER_POLICY": "prefil_first"})
    with pytest.raises(ConfigError, match="installed prefix_cache backends.*in .*engine.toml"):
        EngineConfig.load(write_toml(tmp_path, 'prefix_cache = "zzz"\n'), environ={})


def test_qualified_backend_name_is_accepted():
    assert EngineConfig(moe_executor="nanocore:eager").moe_executor == "nanocore:eager"


@pytest.mark.parametrize("field, value, message", [
    ("max_num_seqs", 0, "greater than or equal to 1"),
    ("max_num_seqs", 5000, "less than or equal to 4096"),
    ("gpu_memory_utilization", 1.5, "less than or equal to 1"),
    ("gpu_memory_utilization", 0, "greater than 0"),
    ("block_size", 24, "block_size must be a power of two"),
    ("tensor_parallel_size", 0, "greater than or equal to 1"),
    ("device", "gpu", "device must be 'auto', 'cpu', 'cuda' or 'cuda:N'"),
    ("dtype", "fp8", "'auto', 'float32', 'bfloat16' or 'float16'"),
])
def test_bounds_say_what_is_allowed(field, value, message):
    with pytest.raises(ValidationError) as info:
        EngineConfig(**{field: value})
    assert message in str(info.value) and field in str(info.value)


def test_env_numbers_are_validated_with_the_same_messages():
    with pytest.raises(ConfigError, match="greater than or equal to 1, got '0' \\(set by NANOCORE_MAX_NUM_SEQS\\)"):
        EngineConfig.load(environ={"NANOCORE_MAX_NUM_SEQS": "0"})


def test_bad_json_options_in_env_say_what_to_write():
    with pytest.raises(ConfigError, match="moe_executor_options: must be a JSON object.*NANOCORE_MOE_EXECUTOR_OPTIONS"):
        EngineConfig.load(environ={"NANOCORE_MOE_EXECUTOR_OPTIONS": "{chunk: 1"})


def test_unknown_field_and_missing_file_are_errors(tmp_path):
    with pytest.raises(ValidationError, match="max_num_seq"):
        EngineConfig(max_num_seq=4)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        EngineConfig.load(tmp_path / "missing.toml")


def test_assignment_is_validated():
    config = EngineConfig()
    with pytest.raises(ValidationError, match="did you mean"):
        config.kv_codec = "unquantizd"
