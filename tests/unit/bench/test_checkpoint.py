"""HF checkpoint folders for benchmarks: a GGUF's real weights, dequantised, that
transformers (and so vLLM) loads as the model the GGUF holds."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from infer.bench.checkpoint import is_complete, write_gguf_checkpoint
from infer.loader.gguf import GGUFFile
from infer.loader.presets import embedded_model_path


@pytest.mark.slow
def test_a_gguf_becomes_a_folder_transformers_loads_with_the_same_weights(
    tmp_path: Path,
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = write_gguf_checkpoint(tmp_path / "smollm2", embedded_model_path())
    assert is_complete(folder, "safetensors")
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
    assert type(model).__name__ == "LlamaForCausalLM"
    config = GGUFFile(embedded_model_path()).hf_config()
    heads = config["num_attention_heads"], config["num_key_value_heads"]
    name, weight = next(
        (n, t) for n, t in GGUFFile(embedded_model_path()).tensors(*heads) if "q_proj" in n
    )
    assert torch.equal(model.state_dict()[name], weight.to(torch.bfloat16))
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert tokenizer.decode(tokenizer.encode("The quick brown fox")) == "The quick brown fox"
