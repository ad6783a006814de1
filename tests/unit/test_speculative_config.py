"""``--speculative-config``: vLLM's JSON shape, errors that name the setting."""

from __future__ import annotations

import pytest

from infer.config import EngineConfig
from infer.speculative_config import SpeculativeConfig


def test_vllm_ngram_shape_from_json_text_and_dict() -> None:
    text = '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}'
    spec = SpeculativeConfig.parse(text)
    assert spec == SpeculativeConfig.parse(
        {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}
    )
    assert (spec.num_speculative_tokens, spec.prompt_lookup_min, spec.prompt_lookup_max) == (
        3,
        4,
        4,
    )


def test_one_lookup_bound_sets_both_and_none_gives_vllms_default() -> None:
    assert SpeculativeConfig.parse({"num_speculative_tokens": 2, "prompt_lookup_min": 2}) == (
        SpeculativeConfig(num_speculative_tokens=2, prompt_lookup_min=2, prompt_lookup_max=2)
    )
    default = SpeculativeConfig.parse({"num_speculative_tokens": 2})
    assert (default.prompt_lookup_min, default.prompt_lookup_max) == (5, 5)


def test_a_model_means_a_draft_model() -> None:
    spec = SpeculativeConfig.parse({"model": "smollm2-135m", "num_speculative_tokens": 3})
    assert (spec.method, spec.model, spec.num_speculative_tokens) == (
        "draft_model",
        "smollm2-135m",
        3,
    )


def test_engine_config_parses_the_cli_text_and_llm_dict() -> None:
    config = EngineConfig(device="cpu", speculative_config='{"num_speculative_tokens": 2}')  # type: ignore[arg-type]
    assert config.speculative_config == SpeculativeConfig(num_speculative_tokens=2)
    assert EngineConfig(device="cpu").speculative_config is None


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ("{not json", "speculative_config: not valid JSON"),
        ("[1]", "speculative_config: must be a JSON object"),
        ({"method": "ngram"}, "speculative_config.num_speculative_tokens: is required"),
        ({"num_speculative_tokens": 0}, "speculative_config.num_speculative_tokens"),
        ({"num_speculative_tokens": True}, "speculative_config.num_speculative_tokens"),
        ({"num_speculative_tokens": 2, "method": "eagle"}, "speculative_config.method"),
        (
            {"num_speculative_tokens": 2, "prompt_lookup_min": 0},
            "speculative_config.prompt_lookup_min",
        ),
        (
            {"num_speculative_tokens": 2, "prompt_lookup_min": 4, "prompt_lookup_max": 2},
            "speculative_config.prompt_lookup_max",
        ),
        ({"num_speculative_tokens": 2, "disable_by_batch_size": 0}, "disable_by_batch_size"),
        ({"num_speculative_tokens": 2, "lookahead": 1}, "speculative_config.lookahead"),
        ({"method": "draft_model", "num_speculative_tokens": 2}, "speculative_config.model"),
        (
            {"method": "ngram", "model": "x", "num_speculative_tokens": 2},
            "speculative_config.model",
        ),
        ({"model": "", "num_speculative_tokens": 2}, "speculative_config.model"),
    ],
)
def test_bad_settings_raise_naming_the_setting(value: object, named: str) -> None:
    with pytest.raises(ValueError, match=named.replace(".", r"\.")):
        SpeculativeConfig.parse(value)  # type: ignore[arg-type]
