"""infer: a fast, readable LLM inference engine and OpenAI-compatible server."""

from infer.config import EngineConfig, ModelConfig

__all__ = ["LLM", "EngineConfig", "ModelConfig", "SamplingParams"]
__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    # The engine pulls in torch-heavy modules; import it only when asked for.
    if name == "LLM":
        from infer.engine.llm import LLM

        return LLM
    if name == "SamplingParams":
        from infer.contract.sampling_params import SamplingParams

        return SamplingParams
    raise AttributeError(name)
