"""Engine flags: a flag not given leaves its field unset, so the seeds' one-flag commands
adapt the dependent defaults, and only flags given together that contradict each other fail
(naming both)."""

from __future__ import annotations

import argparse

import pytest

from infer.cli.engine_args import add_engine_args, engine_config_from_args
from infer.config import EngineConfig


def config_from(argv: list[str]) -> EngineConfig:
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    return engine_config_from_args(parser.parse_args(argv))


@pytest.mark.parametrize(
    ("argv", "resolved"),
    [
        ([], ("continuous", "paged", True, True)),
        (["--kv-cache-backend", "contiguous"], ("continuous", "contiguous", True, False)),
        (["--batching-mode", "static"], ("static", "contiguous", False, False)),
        (["--no-prefix-caching"], ("continuous", "paged", True, False)),
    ],
)
def test_flags_not_given_follow_the_flags_given(
    argv: list[str], resolved: tuple[str, str, bool, bool]
) -> None:
    config = config_from(argv)
    assert (
        config.batching_mode,
        config.kv_cache_backend,
        config.use_chunked_prefill,
        config.use_prefix_caching,
    ) == resolved


@pytest.mark.parametrize(
    ("argv", "flag", "other"),
    [
        (
            ["--batching-mode", "static", "--kv-cache-backend", "paged"],
            "kv_cache_backend",
            "batching_mode",
        ),
        (
            ["--batching-mode", "static", "--chunked-prefill"],
            "use_chunked_prefill",
            "batching_mode",
        ),
        (
            ["--kv-cache-backend", "contiguous", "--prefix-caching"],
            "use_prefix_caching",
            "kv_cache_backend",
        ),
    ],
)
def test_contradicting_flags_name_both(argv: list[str], flag: str, other: str) -> None:
    with pytest.raises(ValueError, match=rf"^{flag}: .*{other}="):
        config_from(argv)


def test_fp8_flags_reach_the_config() -> None:
    config = config_from(["--quantization", "fp8", "--kv-cache-dtype", "fp8", "--device", "cpu"])
    assert (config.quantization, config.kv_cache_dtype) == ("fp8", "fp8")
    default = config_from([])
    assert (default.quantization, default.kv_cache_dtype) == (None, "auto")


def test_speculative_config_is_json_as_in_vllm() -> None:
    text = '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 2}'
    spec = config_from(["--speculative-config", text]).speculative_config
    assert spec is not None and (spec.num_speculative_tokens, spec.prompt_lookup_max) == (3, 2)
    with pytest.raises(ValueError, match=r"speculative_config\.num_speculative_tokens"):
        config_from(["--speculative-config", '{"num_speculative_tokens": 0}'])


def test_node_flags_default_to_the_launchers_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {"GROUP_WORLD_SIZE": "2", "GROUP_RANK": "1", "MASTER_ADDR": "10.0.0.7",
           "MASTER_PORT": "29400"}  # fmt: skip
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("NODE_RANK", raising=False)
    config = config_from(["--device", "cpu", "-tp", "4"])
    assert (config.nnodes, config.node_rank, config.master_addr, config.master_port) == (
        2, 1, "10.0.0.7", 29400
    )  # fmt: skip
    assert config_from(["--device", "cpu", "-tp", "4", "--node-rank", "0"]).node_rank == 0
