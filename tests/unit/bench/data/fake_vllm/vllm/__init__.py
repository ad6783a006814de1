"""A stand-in for vLLM 0.26's offline API, as far as ``infer.bench.vllm_peer`` uses it: an
``LLM`` whose ``llm_engine`` makes one token per request per step, returned as deltas."""

from types import SimpleNamespace

from vllm.sampling_params import RequestOutputKind, SamplingParams

__version__ = "0.0-fake"
__all__ = ["LLM", "SamplingParams"]


class _Engine:
    def __init__(self, max_model_len: int) -> None:
        self.vllm_config = SimpleNamespace(
            model_config=SimpleNamespace(max_model_len=max_model_len),
            scheduler_config=SimpleNamespace(max_num_seqs=1024),
        )
        self.running: dict[str, list[int]] = {}

    def add_request(self, request_id, prompt, params):
        assert params.output_kind is RequestOutputKind.DELTA and params.ignore_eos
        assert params.temperature == 0.0 and not params.detokenize
        assert all(isinstance(t, int) for t in prompt["prompt_token_ids"])
        self.running[request_id] = [params.max_tokens, 0]
        return request_id

    def has_unfinished_requests(self) -> bool:
        return bool(self.running)

    def step(self):
        outputs = []
        for request_id, state in list(self.running.items()):
            state[1] += 1
            finished = state[1] == state[0]
            completion = SimpleNamespace(token_ids=[7])
            outputs.append(
                SimpleNamespace(request_id=request_id, outputs=[completion], finished=finished)
            )
            if finished:
                del self.running[request_id]
        return outputs


class LLM:
    def __init__(self, **options) -> None:
        self.llm_engine = _Engine(options["max_model_len"])
        self.prefix_cache_resets = 0

    def reset_prefix_cache(self) -> bool:
        self.prefix_cache_resets += 1
        return True

    def generate(self, prompts, params, use_tqdm=True):
        assert self.prefix_cache_resets and len(prompts) == len(params)
        return [
            SimpleNamespace(outputs=[SimpleNamespace(token_ids=[7] * p.max_tokens)]) for p in params
        ]
