"""Registry rules (nanocore/plugins.py docstring), each against real fake distributions in tests/fixtures."""
from __future__ import annotations

import importlib
import logging
import multiprocessing
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest

from nanocore.interfaces import API_VERSION
from nanocore.plugins import BackendError, Registry, get_registry, reload_registry

DISTS = Path(__file__).parent / "fixtures" / "dists"
FAKE_MODULES = ("fake_good_plugin", "fake_broken_plugin", "fake_dup_plugin", "fake_oldapi_plugin",
                "fake_hookraises_plugin", "fake_samename_plugin", "spawn_probe")


@contextmanager
def plugin_env(*roots: str, **env: str | None):
    """Fixture distributions ``roots`` on sys.path and ``env`` set; the registry reloaded inside and after."""
    env = {"NANOCORE_PLUGINS": None, "NANOCORE_DISABLE_PLUGINS": None, **env}
    saved_path, saved_env = list(sys.path), {k: os.environ.get(k) for k in env}
    sys.path[:0] = [str(DISTS / root) for root in roots]
    _set_env(env)
    importlib.invalidate_caches()
    try:
        yield reload_registry()
    finally:
        sys.path[:] = saved_path
        _set_env(saved_env)
        for name in FAKE_MODULES:
            sys.modules.pop(name, None)
        reload_registry()


def _set_env(env: dict[str, str | None]) -> None:
    for key, value in env.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def test_fixture_distribution_is_discovered_through_entry_points():
    with plugin_env("good") as registry:
        entry = registry.get("linear_method", "fake_linear")
    assert (entry.distribution, entry.version, entry.plugin) == ("nanocore-fake-good", "0.1", "fake_good")
    assert entry.cls.__name__ == "FakeLinear" and entry.cls.name == "fake_linear"


def test_builtins_are_registered_through_the_same_hooks():
    registry = get_registry()
    expected = {"linear_method": "unquantized", "kv_codec": "unquantized", "prefix_cache": "none",
                "moe_executor": "eager", "scheduler_policy": "prefill_first"}
    for kind, name in expected.items():
        assert registry.get(kind, name).distribution == "nanocore"


@pytest.mark.parametrize("allowed", ["fake_good", "nanocore-fake-good"])  # entry-point or distribution name
def test_allow_list_loads_only_named_plugins(allowed):
    with plugin_env("good", "duplicate", "broken", NANOCORE_PLUGINS=allowed) as registry:
        assert registry.get("linear_method", "fake_linear").distribution == "nanocore-fake-good"
        assert registry.failures == []  # the broken plugin was never imported
        assert registry.get("linear_method", "unquantized").distribution == "nanocore"  # builtins always load
        assert {e.distribution for names in registry.entries.values() for es in names.values() for e in es} == {
            "nanocore", "nanocore-fake-good"}


def test_block_list_skips_named_plugins():
    with plugin_env("good", "duplicate", NANOCORE_DISABLE_PLUGINS="nanocore-fake-dup, other") as registry:
        assert registry.get("linear_method", "fake_linear").distribution == "nanocore-fake-good"
    with plugin_env("good", "duplicate", NANOCORE_DISABLE_PLUGINS="fake_good") as registry:
        assert registry.get("linear_method", "fake_linear").distribution == "nanocore-fake-dup"


def test_plugin_whose_import_raises_is_listed_and_the_rest_work():
    with plugin_env("good", "broken") as registry:
        [failure] = registry.failures
        assert (failure.plugin, failure.distribution, failure.version) == ("fake_broken", "nanocore-fake-broken", "0.2")
        assert "ImportError" in failure.error and "libfakeaccel.so" in failure.error
        assert registry.get("linear_method", "fake_linear").cls.__name__ == "FakeLinear"
        assert registry.resolve("linear_method", "auto", "cpu").name == "unquantized"


def test_plugin_whose_hook_raises_is_listed_and_the_rest_work():
    with plugin_env("good", "hookraises") as registry:
        [failure] = registry.failures
        assert failure.plugin == "fake_hookraises" and "could not build its policies" in failure.error
        assert registry.get("scheduler_policy", "prefill_first").distribution == "nanocore"


def test_same_name_from_two_distributions_is_an_error_naming_both():
    with plugin_env("good", "duplicate") as registry:
        with pytest.raises(BackendError) as info:
            registry.get("linear_method", "fake_linear")
        message = str(info.value)
        assert "nanocore-fake-good" in message and "nanocore-fake-dup" in message
        assert "'nanocore-fake-good:fake_linear'" in message  # says how to pick one
        assert registry.get("linear_method", "nanocore-fake-good:fake_linear").cls.__name__ == "FakeLinear"
        assert registry.get("linear_method", "nanocore-fake-dup:fake_linear").cls.__name__ == "OtherFakeLinear"
        rows = [r for r in registry.rows() if r["name"] == "fake_linear"]
        assert len(rows) == 2 and not any(r["supported"] for r in rows)


def test_two_distributions_with_one_entry_point_name_both_load(tmp_path):
    # regression: the registry used to skip the second distribution silently when entry-point names matched
    dist_info = tmp_path / "nanocore_fake_samename-1.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: nanocore-fake-samename\nVersion: 1.0\n")
    (dist_info / "entry_points.txt").write_text("[nanocore]\nfake_good = fake_samename_plugin\n")
    (tmp_path / "fake_samename_plugin.py").write_text((DISTS / "duplicate" / "fake_dup_plugin.py").read_text())
    with plugin_env("good") as _:
        sys.path.insert(0, str(tmp_path))
        registry = reload_registry()
        dists = {e.distribution for e in registry.entries["linear_method"]["fake_linear"]}
        assert registry.failures == []
    assert dists == {"nanocore-fake-good", "nanocore-fake-samename"}


def test_api_version_major_mismatch_is_refused_naming_plugin_and_versions():
    with plugin_env("oldapi") as registry:
        with pytest.raises(BackendError) as info:
            registry.get("moe_executor", "old_moe")
        message = str(info.value)
        assert "fake_oldapi" in message and "'0.9'" in message and repr(API_VERSION) in message
        assert "old_moe" not in registry.names("moe_executor")
        [row] = [r for r in registry.rows() if r["name"] == "old_moe"]
        assert row["supported"] is False and "0.9" in row["reason"]


def test_explicit_unsupported_choice_fails_with_the_reason():
    with plugin_env("good") as registry:
        with pytest.raises(BackendError, match="needs the fake accelerator"):
            registry.resolve("kv_codec", "accel_codec", "cpu")


def test_auto_skips_unsupported_and_logs_its_choice(caplog):
    with plugin_env("good") as registry, caplog.at_level(logging.INFO, logger="nanocore"):
        entry = registry.resolve("kv_codec", "auto", "cpu")
    assert entry.name != "accel_codec"
    assert any("chose" in r.message and "accel_codec" in r.message for r in caplog.records), caplog.text


def test_loading_is_idempotent():
    assert get_registry() is get_registry()
    with plugin_env("good", "broken") as registry:
        again = Registry.load()
        assert again.rows() == registry.rows()
        assert len(again.failures) == len(registry.failures) == 1
        assert all(len(entries) == 1 for entries in again.entries["linear_method"].values())


def test_loading_in_a_freshly_spawned_process():
    with plugin_env("good", "broken"):
        sys.path.insert(0, str(DISTS.parent))  # the child gets this sys.path and imports spawn_probe from it
        from spawn_probe import registry_summary

        # an executor, not a Pool: a child that dies raises here instead of hanging the test
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            names, failed = pool.submit(registry_summary).result(timeout=120)
    assert "fake_linear" in names and "unquantized" in names
    assert failed == ["fake_broken"]


def test_check_options_refuses_a_bool_where_a_number_is_expected():
    from nanocore.interfaces import check_options
    with pytest.raises(ValueError, match="must be int, got True"):
        check_options("prefill_first", {"chunk_size": True}, {"chunk_size": int})
    assert check_options("x", {"flag": True, "n": 3}, {"flag": bool, "n": int}) == {"flag": True, "n": 3}


@pytest.mark.parametrize("kind, name", [("linear_method", "unquantized"), ("kv_codec", "unquantized"),
                                        ("moe_executor", "eager"), ("prefix_cache", "none")])
def test_builtin_backends_refuse_unknown_options(kind, name):
    """The oracles take no options; a typo such as kv_codec_options={"chunk": 1} was silently ignored."""
    cls = get_registry().get(kind, name).cls
    args = (16, 8) if kind == "prefix_cache" else ()
    assert cls(*args, {}).options == {}
    with pytest.raises(ValueError, match=rf"backend '{name}' got unknown option\(s\) \['bogus'\]; allowed options: none"):
        cls(*args, {"bogus": 1})


@pytest.mark.parametrize("kind, name", [("linear_method", "unquantized"), ("kv_codec", "unquantized"),
                                        ("moe_executor", "eager"), ("prefix_cache", "none"),
                                        ("scheduler_policy", "prefill_first")])
def test_a_third_party_subclass_of_a_builtin_takes_its_own_options(kind, name):
    """A plugin that extends a built-in passes its own options up; the built-in checks only its own instances."""
    from nanocore.interfaces import check_options
    base = get_registry().get(kind, name).cls

    class Extended(base):
        def __init__(self, *args):
            super().__init__(*args)
            self.alpha = check_options("extended", self.options, {"alpha": float, "chunk_size": int})["alpha"]

    args = (16, 8) if kind == "prefix_cache" else ()
    assert Extended(*args, {"alpha": 0.5}).alpha == 0.5
    with pytest.raises(ValueError, match=r"backend 'extended' got unknown option\(s\) \['bogus'\]"):
        Extended(*args, {"alpha": 0.5, "bogus": 1})
    with pytest.raises(ValueError, match=rf"backend '{name}' got unknown option\(s\) \['alpha'\]"):
        base(*args, {"alpha": 0.5})

    class OnlyOverrides(base):  # no __init__ of its own: the built-in's check still applies, under its name
        name = "overrides"
    with pytest.raises(ValueError, match=r"backend 'overrides' got unknown option\(s\) \['alpha'\]"):
        OnlyOverrides(*args, {"alpha": 0.5})


def test_unknown_kv_codec_options_are_an_error_in_the_engine():
    sys.path.insert(0, str(Path(__file__).parent))
    from engine_fakes import fake_loaded_model
    from nanocore.engine.llm import LLM

    with pytest.raises(ValueError, match=r"unknown option\(s\) \['bogus'\]"):
        LLM("fake", loaded_model=fake_loaded_model(), device="cpu", num_kv_blocks=16, kv_codec="unquantized",
            kv_codec_options={"bogus": 1})


def test_choice_option_names_the_allowed_values():
    from nanocore.interfaces import choice_option

    assert choice_option("x", {}, "kernel", ("auto", "triton", "torch")) == "auto"
    assert choice_option("x", {"kernel": "torch"}, "kernel", ("auto", "triton", "torch")) == "torch"
    with pytest.raises(ValueError, match="x: option kernel must be 'auto', 'triton' or 'torch', got 'cuda'"):
        choice_option("x", {"kernel": "cuda"}, "kernel", ("auto", "triton", "torch"))


def test_moe_executor_options_are_checked_on_a_dense_model_too():
    """The executor goes unused on a dense model, but a typo in its options is still an error."""
    from nanocore.engine.llm import LLM
    with pytest.raises(ValueError, match=r"backend 'eager' got unknown option\(s\) \['bogus'\]"):
        LLM("dummy:tiny-qwen2", device="cpu", num_kv_blocks=16, moe_executor="eager",
            moe_executor_options={"bogus": 1})
    llm = LLM("dummy:tiny-qwen2", device="cpu", num_kv_blocks=16, moe_executor="eager")
    assert llm.engine.loaded.moe_executor is None
