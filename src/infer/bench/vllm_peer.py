"""The vLLM peer: the same model and workload through vLLM's offline engine (``--engine vllm``).

vLLM is imported here only, and only when a run asks for it (``import_vllm``). The requests
are the harness's own (``infer.workloads``: token-id prompts, the run's sampling
settings (``infer.bench.sampling``, greedy by default), EOS ignored, so
every request produces exactly its output length); a shape preset becomes a folder with its
``config.json`` that vLLM loads with ``load_format="dummy"`` (random weights at the real
shapes, as ``--load-format dummy`` does for infer); a checkpoint directory is loaded as it is.

The engine is stepped by ``infer.bench.offline.run_workload``, as infer's engine is:
requests are added at their arrival times, and outputs come as deltas
(``RequestOutputKind.DELTA``), so each token is timed when the step that made it returns
(``LLM.generate`` only returns finished requests, without token times).

On the GPU machines vLLM is the carried 0.26.0 build (``shared/tools/vllm-peer``): run with
``PYTHONPATH=/tmp/vsite:...``; flashinfer is not bundled, hence
``VLLM_USE_FLASHINFER_SAMPLER=0`` (set here unless the environment says otherwise).
"""

from __future__ import annotations

import importlib.util
import json
import os
import time
from collections.abc import Sequence
from dataclasses import asdict
from types import ModuleType
from typing import Any

from infer.bench.metrics import RequestMetrics, RunResult, append_token_times
from infer.bench.offline import check_fits, run_workload
from infer.bench.sampling import GREEDY, BenchSampling
from infer.config import EngineConfig, cache_dir
from infer.loader import resolve_model
from infer.workloads import RequestSpec, Workload

# The carried build has no flashinfer. The engine core runs in this process: the harness
# has touched CUDA before vLLM starts, and a forked engine core cannot use it ("Cannot
# re-initialize CUDA in forked subprocess", H100, 2026-11-24). The rest keeps a machine
# without internet quiet.
VLLM_ENVIRONMENT = {
    "VLLM_USE_FLASHINFER_SAMPLER": "0",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}
MISSING = (
    "engine: vllm is not importable ({reason}); install it (pip install vllm) or, on the GPU "
    "machines, the carried build (shared/tools/vllm-peer/install.sh) with "
    "PYTHONPATH=/tmp/vsite:$PYTHONPATH"
)


def check_available() -> None:
    """``ValueError`` naming the fix when vLLM cannot be found (checked before any run)."""
    if importlib.util.find_spec("vllm") is None:
        raise ValueError(MISSING.format(reason="no module named 'vllm'"))


def import_vllm() -> ModuleType:
    """``vllm``, with the environment the carried build needs."""
    check_available()
    for name, value in VLLM_ENVIRONMENT.items():
        os.environ.setdefault(name, value)
    try:
        import vllm
    except ImportError as exc:
        raise ValueError(MISSING.format(reason=exc)) from exc
    return vllm


def model_folder(model: str, load_format: str) -> tuple[str, str]:
    """The folder vLLM loads for ``--model`` and its load format: a preset's ``config.json``
    in the infer cache (``dummy``), or the checkpoint directory itself."""
    source = resolve_model(model)
    if source.kind == "gguf":
        raise ValueError("model: the vLLM peer needs a preset or a HF checkpoint, not GGUF")
    if source.kind == "preset":
        folder = cache_dir() / "vllm-peer" / source.name
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps(source.hf_config, indent=1) + "\n")
        return str(folder), "dummy"
    assert source.path is not None
    return str(source.path), "dummy" if load_format == "dummy" else "auto"


def build_vllm(config: EngineConfig, max_seq_len: int) -> tuple[Any, dict[str, Any]]:
    """vLLM's ``LLM`` for ``config.model`` (its own defaults otherwise: CUDA graphs,
    torch.compile, prefix caching, chunked prefill) and the settings to record.

    Of infer's flags it takes ``--model``, ``--load-format``, ``--dtype``,
    ``--gpu-memory-utilization``, ``--tensor-parallel-size``, ``--quantization`` (vLLM's
    online ``fp8``; its documented scales are per tensor, ours per channel and per token),
    ``--speculative-config`` and ``--seed``; the context is infer's (``max_seq_len``)."""
    vllm = import_vllm()
    folder, load_format = model_folder(config.model, config.load_format)
    dtype = str(config.torch_dtype).removeprefix("torch.")
    options: dict[str, Any] = {
        "model": folder,
        "load_format": load_format,
        "skip_tokenizer_init": True,  # prompts are token ids; nothing is detokenised
        "dtype": dtype,
        "max_model_len": max_seq_len,
        "gpu_memory_utilization": config.gpu_memory_utilization,
        "tensor_parallel_size": config.tensor_parallel_size,
        "seed": config.seed,
    }
    if config.quantization is not None:
        options["quantization"] = config.quantization
    spec = config.speculative_config
    if spec is not None:  # the same JSON shape (an unset disable_by_batch_size left out)
        options["speculative_config"] = {k: v for k, v in asdict(spec).items() if v is not None}
    started = time.perf_counter()
    llm = vllm.LLM(**options)
    details = {
        **options,
        "vllm": vllm.__version__,
        "startup_s": round(time.perf_counter() - started, 1),
        "max_num_seqs": llm.llm_engine.vllm_config.scheduler_config.max_num_seqs,
    }
    return llm, details


def run_vllm(
    llm: Any,
    workload: Workload,
    warmup: Workload | None = None,
    progress: bool = True,
    sampling: BenchSampling = GREEDY,
) -> RunResult:
    """Run ``warmup`` (unmeasured), then ``workload``, through vLLM's engine; a burst also
    goes once through ``LLM.generate`` (``generate_output_tok_s``)."""
    check_fits(workload, llm.llm_engine.vllm_config.model_config.max_model_len)
    stepped = _VllmEngine(llm.llm_engine, sampling)
    if warmup is not None:
        run_workload(stepped, warmup, "warmup", progress=False, label="vllm")
    result = RunResult(run_workload(stepped, workload, "bench", progress, label="vllm"))
    if workload.is_burst:
        result.extra["generate_output_tok_s"] = _generate_tok_s(llm, workload, sampling)
    return result


def _generate_tok_s(llm: Any, workload: Workload, sampling: BenchSampling) -> float:
    """Output tok/s of the same burst through vLLM's own batch API (final outputs only, the
    prefix cache emptied first): a check that stepping the engine with delta outputs, which
    times every token, does not slow vLLM down."""
    from vllm import SamplingParams

    prompts = [{"prompt_token_ids": r.prompt_token_ids} for r in workload.requests]
    params = [
        SamplingParams(
            **_vllm_sampling(sampling), max_tokens=r.max_tokens, ignore_eos=True, detokenize=False
        )
        for r in workload.requests
    ]
    llm.reset_prefix_cache()
    started = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - started
    return round(sum(len(o.outputs[0].token_ids) for o in outputs) / elapsed, 1)


class _VllmEngine:
    """vLLM's ``LLMEngine`` as a ``BenchEngine``."""

    def __init__(self, engine: Any, sampling: BenchSampling) -> None:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        self.engine = engine
        self._params = lambda max_tokens: SamplingParams(
            **_vllm_sampling(sampling),
            max_tokens=max_tokens,
            ignore_eos=True,
            detokenize=False,
            output_kind=RequestOutputKind.DELTA,
        )

    stalled = False  # vLLM compiles grammars inside its step

    def has_unfinished_requests(self) -> bool:
        return bool(self.engine.has_unfinished_requests())

    def wait_to_schedule(self) -> None:
        """vLLM's ``step`` schedules and runs at once: nothing to wait for here."""

    def add(self, request_id: str, spec: RequestSpec) -> None:
        prompt = {"prompt_token_ids": spec.prompt_token_ids}
        self.engine.add_request(request_id, prompt, self._params(spec.max_tokens))

    def step(self) -> list[Any]:
        return list(self.engine.step())

    def record(
        self, outputs: Sequence[Any], requests: dict[str, RequestMetrics], start: float
    ) -> int:
        now = time.perf_counter() - start
        finished = 0
        for out in outputs:
            record = requests[out.request_id]
            new_tokens = sum(len(completion.token_ids) for completion in out.outputs)
            append_token_times(record.token_times_s, now - record.arrival_s, new_tokens)
            if out.finished:
                finished += 1
        return finished


def _vllm_sampling(sampling: BenchSampling) -> dict[str, Any]:
    """The same settings in vLLM's terms (no top-k limit is -1 there)."""
    return {**sampling.as_dict(), "top_k": sampling.top_k or -1}
