"""One config surface: CLI flags generated from EngineConfig's fields, and the same one-line errors from flags,
the TOML file, NANOCORE_* variables and LLM(...) keywords."""
from __future__ import annotations

import argparse
import ast
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Literal

import pytest
from pydantic import Field

from nanocore.cli import common
from nanocore.cli.common import CLI_ONLY_FLAGS, add_engine_args, engine_config_from_args, engine_flag
from nanocore.cli.main import build_parser, main
from nanocore.config import ConfigError, EngineConfig, declared_env_vars, env_values
from nanocore.hookspecs import hookimpl
from nanocore.plugins import get_registry

NANOCORE = Path(common.__file__).parents[1]


def engine_parsers():
    """(command, parser) of every subcommand that takes the engine flags."""
    found = []

    def walk(parser, path):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, f"{path} {name}".strip())
        if "--config" in parser._option_string_actions:
            found.append((path, parser))
    walk(build_parser(), "")
    return found


def test_every_engine_command_has_one_generated_flag_per_field():
    parsers = engine_parsers()
    assert {"generate", "chat", "serve", "eval ppl", "eval compare", "bench throughput"} <= {p for p, _ in parsers}
    for command, parser in parsers:
        for name, field in EngineConfig.model_fields.items():
            actions = [a for a in parser._actions if a.dest == name]
            assert len(actions) == 1, f"{command}: {len(actions)} flags set {name}"
            assert engine_flag(name) in actions[0].option_strings and actions[0].default is None
            assert (field.description or name.replace("_", " ")).replace("%", "%%") in actions[0].help
        field_flags = {engine_flag(name) for name in EngineConfig.model_fields}
        for group in parser._action_groups:
            if group.title.startswith(("engine", "backends")):
                flags = {s for a in group._group_actions for s in a.option_strings if not s.startswith("--no-")}
                assert flags == (field_flags | set(CLI_ONLY_FLAGS)) & flags, f"{command}: hand-made engine flags"


def test_a_new_field_gets_its_flag_type_and_help_without_cli_code(monkeypatch):
    class Extended(EngineConfig):
        new_knob: int = Field(3, ge=1, description="a knob")
        new_switch: bool = Field(True, description="a switch")
        new_mode: Literal["a", "b"] = Field("a", description="a mode")
        new_options: dict[str, Any] = Field(default_factory=dict, description="some options")
    monkeypatch.setattr(common, "EngineConfig", Extended)
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    args = parser.parse_args(["--new-knob", "7", "--no-new-switch", "--new-mode", "b", "--new-options", '{"x": 1}'])
    config = common.engine_config_from_args(args)
    assert isinstance(config, Extended)
    assert (config.new_knob, config.new_switch, config.new_mode, config.new_options) == (7, False, "b", {"x": 1})
    assert "a knob (default: 3)" in parser.format_help() and "--new-mode {a,b}" in parser.format_help()
    with pytest.raises(ConfigError, match=r"^new_mode: Input should be 'a' or 'b', got 'c' \(set by --new-mode\)"):
        common.engine_config_from_args(parser.parse_args(["--new-mode", "c"]))
    assert parser.parse_args([]).new_knob is None  # absent: left to the file, the environment or the default


def test_no_module_declares_an_engine_field_flag_by_hand():
    """Only commands without an engine (plugins' support table, quantize, tune moe, the kernel microbenchmarks)
    spell a field's flag, with a meaning of their own."""
    own_flags = {"cli/plugins_cmd.py", "cli/quantize_cmd.py", "cli/tune_cmd.py", "bench/moe.py", "bench/linear.py"}
    field_flags = {engine_flag(name) for name in EngineConfig.model_fields}
    for path in sorted(NANOCORE.rglob("*.py")):
        if path.relative_to(NANOCORE).as_posix() in own_flags:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
                literals = {a.value for a in node.args if isinstance(a, ast.Constant)}
                assert not literals & field_flags, f"{path}: declares {literals & field_flags} by hand"


def test_todays_flag_spellings_still_parse():
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    args = parser.parse_args(["--linear-method", "unquantized", "--kv-codec", "unquantized", "--max-model-len", "64",
                              "--scheduler-policy-options", '{"chunk_size": 8}', "--enforce-eager",
                              "--no-kernel-warmup", "--cpu-kv-cache-gib", "0.5", "--dtype", "float32"])
    config = engine_config_from_args(args)
    assert (config.linear_method, config.kv_codec, config.max_model_len, config.enforce_eager) == (
        "unquantized", "unquantized", 64, True)
    assert (config.scheduler_policy_options, config.kernel_warmup, config.cpu_kv_cache_gib) == (
        {"chunk_size": 8}, False, 0.5)


# ---- the same errors from every source ----------------------------------------------------------------------------
def one_line(exc: ConfigError) -> str:
    assert len(exc.lines) == 1 and "\n" not in str(exc) and "pydantic" not in str(exc)
    return str(exc)


def test_a_misspelled_keyword_is_one_line_with_did_you_mean():
    from nanocore.engine.llm import LLM
    with pytest.raises(ConfigError) as info:
        LLM(kv_codc="int8")
    assert one_line(info.value).startswith("kv_codc: not an engine field; did you mean 'kv_codec'? "
                                           "(set by keyword argument kv_codc)")
    with pytest.raises(ConfigError, match="did you mean 'kv_codec'"):
        LLM(config=EngineConfig(model="dummy:tiny-qwen2"), kv_codc="int8")  # keywords next to a config too


def test_each_source_is_named_in_the_error(tmp_path):
    with pytest.raises(ConfigError) as info:
        EngineConfig.load(environ={}, origin="flag", max_num_seqs=0)
    assert one_line(info.value) == ("max_num_seqs: Input should be greater than or equal to 1, got 0 "
                                    "(set by --max-num-seqs)")
    toml = tmp_path / "engine.toml"
    toml.write_text("[engine]\nmax_num_seq = 4\n")
    with pytest.raises(ConfigError) as info:
        EngineConfig.load(toml, environ={})
    assert one_line(info.value).startswith(f"max_num_seq: not an engine field; did you mean 'max_num_seqs'? (set by "
                                           f"'max_num_seq' in {toml})")


@pytest.mark.parametrize("field, text, message", [
    ("max_num_seqs", "many", "max_num_seqs: Input should be a valid integer, unable to parse string as an integer, "
                             "got 'many'"),
    ("kv_codec_options", "{bits: 8", "kv_codec_options: must be a JSON object, e.g. '{\"chunk_size\": 128}' "
                                     "(Expecting property name enclosed in double quotes"),
    ("prefix_cache_options", "[1]", "prefix_cache_options: must be a JSON object like '{\"key\": 1}', got [1]"),
])
def test_a_flag_and_a_variable_give_the_same_error(field, text, message, monkeypatch):
    errors = []
    for argv, environ in (([engine_flag(field), text], {}), ([], {f"NANOCORE_{field.upper()}": text})):
        parser = argparse.ArgumentParser()
        add_engine_args(parser)
        monkeypatch.setattr("os.environ", environ)
        with pytest.raises(ConfigError) as info:
            engine_config_from_args(parser.parse_args(argv))
        errors.append(one_line(info.value))
    assert errors[0].startswith(message) and errors[0].endswith(f"(set by {engine_flag(field)})")
    assert errors[1] == errors[0].replace(f"(set by {engine_flag(field)})", f"(set by NANOCORE_{field.upper()})")


def test_a_toml_syntax_error_names_the_file_and_line(tmp_path):
    toml = tmp_path / "engine.toml"
    toml.write_text('[engine]\nkv_codec = "unquantized"\nmax_num_seqs = \n')
    with pytest.raises(ConfigError) as info:
        EngineConfig.load(toml, environ={})
    assert one_line(info.value).startswith(f"{toml}: not valid TOML: ") and "line 3" in str(info.value)


def test_fields_outside_the_engine_table_are_an_error_not_ignored(tmp_path):
    toml = tmp_path / "engine.toml"
    toml.write_text('seed = 3\n[engine]\nmax_num_seqs = 4\n')
    with pytest.raises(ConfigError, match=r"inside the \[engine\] table \(found \['seed'\] outside it\)"):
        EngineConfig.load(toml, environ={})


def test_cli_prints_the_config_error_lines(tmp_path, capsys):
    toml = tmp_path / "bad.toml"
    toml.write_text("block_size = 16\nseed = = 1\n")
    assert main(["generate", "--prompt", "x", "--config", str(toml)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {toml}: not valid TOML") and "line 2" in err and "Traceback" not in err


# ---- backend options are checked before the model loads ------------------------------------------------------------
@pytest.mark.parametrize("kind, name", [("kv_codec", "unquantized"), ("kv_codec", "auto"), ("prefix_cache", "radix"),
                                        ("prefix_cache", "auto"), ("scheduler_policy", "prefill_first"),
                                        ("scheduler_policy", "auto"), ("moe_executor", "eager")])
def test_unknown_backend_options_fail_when_the_config_is_made(kind, name):
    with pytest.raises(ConfigError, match=rf"^{kind}_options: backend '\w+' got unknown option\(s\) \['bogus'\]"):
        EngineConfig.load(environ={}, device="cpu", **{kind: name, f"{kind}_options": {"bogus": 1}})


def test_bad_options_are_reported_before_the_model_is_read(capsys):
    """The model path does not exist: the options error comes first, with no load attempted."""
    code = main(["generate", "--prompt", "x", "--model", "/no/such/checkpoint", "--device", "cpu",
                 "--scheduler-policy", "prefill_first", "--scheduler-policy-options", '{"chunk_sze": 8}'])
    err = capsys.readouterr().err
    assert code == 1 and "/no/such/checkpoint" not in err
    assert ("error: scheduler_policy_options: backend 'prefill_first' got unknown option(s) ['chunk_sze']; allowed "
            "options: ['chunk_size'] (set by --scheduler-policy-options)") in err


def test_good_options_pass_and_reach_the_engine():
    config = EngineConfig.load(environ={"NANOCORE_SCHEDULER_POLICY_OPTIONS": '{"chunk_size": 8}'}, device="cpu",
                               scheduler_policy="prefill_first")
    assert config.backend("scheduler_policy") == ("prefill_first", {"chunk_size": 8})


# ---- NANOCORE_* variables that are not fields ----------------------------------------------------------------------
def test_a_misspelled_variable_warns_with_did_you_mean(caplog):
    with caplog.at_level(logging.WARNING, logger="nanocore"):
        config = EngineConfig.load(environ={"NANOCORE_KV_CODDEC": "unquantized"})
    assert config.kv_codec == "auto"
    assert "NANOCORE_KV_CODDEC is not an engine field and is ignored; did you mean NANOCORE_KV_CODEC?" in caplog.text


def test_declared_and_unrelated_variables_are_never_warned_about(caplog):
    environ = {name: "1" for name in declared_env_vars()} | {"NANOCORE_SOMETHING_ELSE": "1"}
    with caplog.at_level(logging.WARNING, logger="nanocore"):
        assert env_values(environ) == {}
    assert caplog.text == ""
    assert {"NANOCORE_PLUGINS", "NANOCORE_CACHE_DIR", "NANOCORE_DIST_TIMEOUT_S"} <= declared_env_vars()


def test_a_plugin_declares_its_variables_with_the_hook(caplog):
    plugin = SimpleNamespace(nanocore_env_vars=hookimpl(lambda: ["NANOCORE_SEEDS"]))
    environ = {"NANOCORE_SEEDS": "1"}  # a near miss of 'seed', but this plugin reads it
    with caplog.at_level(logging.WARNING, logger="nanocore"):
        env_values(environ)
    assert "did you mean NANOCORE_SEED?" in caplog.text
    caplog.clear()
    manager = get_registry().plugin_manager
    manager.register(plugin, name="env_vars_test_plugin")
    try:
        assert "NANOCORE_SEEDS" in declared_env_vars()
        with caplog.at_level(logging.WARNING, logger="nanocore"):
            env_values(environ)
        assert caplog.text == ""
    finally:
        manager.unregister(name="env_vars_test_plugin")


def test_a_broken_declaration_costs_only_that_plugin(caplog):
    def broken():
        raise RuntimeError("boom")
    manager = get_registry().plugin_manager
    manager.register(SimpleNamespace(nanocore_env_vars=hookimpl(broken)), name="broken_env_vars_plugin")
    try:
        with caplog.at_level(logging.WARNING, logger="nanocore"):
            names = declared_env_vars()
    finally:
        manager.unregister(name="broken_env_vars_plugin")
    assert "NANOCORE_MOE_CONFIG_DIR" in names and "NANOCORE_PLUGINS" in names
    assert "broken_env_vars_plugin: nanocore_env_vars() failed: boom" in caplog.text


def test_in_tree_plugins_declare_the_variables_they_read():
    assert {"NANOCORE_MOE_CONFIG_DIR", "NANOCORE_CUTLASS_DIR"} <= declared_env_vars()


def test_flags_and_environment_meet_in_one_config(monkeypatch):
    monkeypatch.setenv("NANOCORE_SEED", "4")
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    config = engine_config_from_args(parser.parse_args(["--block-size", "32"]))
    assert (config.seed, config.block_size) == (4, 32)


def test_the_documented_toml_example_loads(tmp_path):
    text = (NANOCORE.parent / "docs" / "configuration.md").read_text()
    example = text.split("```toml\n", 1)[1].split("```", 1)[0]
    (tmp_path / "engine.toml").write_text(example)
    config = EngineConfig.load(tmp_path / "engine.toml", environ={}, device="cpu")
    assert (config.max_model_len, config.kv_codec) == (4096, "int8")
    assert config.backend("scheduler_policy") == ("decode_first", {"chunk_size": 128})
