"""The transformers peer: the same model and workload through Hugging Face transformers.

- Sequential workloads (``single``, ``baseline``): ``model.generate``, batch 1, dynamic cache,
  SDPA attention, as a transformers user serves one request at a time.
- Every other workload: transformers' continuous batching (``paged|sdpa``), the engine behind
  ``generate_batch``. Its manager is driven directly so that requests can be added at their
  arrival times and so that CUDA-graph warm-up happens before the clock starts, not inside
  the measured call (``generate_batch`` warms up a fresh manager on every call).

EOS is disabled (fixed output lengths) and decoding is greedy, as on the ``infer`` side.
Token timestamps: transformers' own ``record_timestamps`` for continuous batching, a
streamer for ``generate``.
"""

from __future__ import annotations

import gc
import math
import time
from collections import deque
from typing import Any

import torch
from tqdm import tqdm
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    ContinuousBatchingConfig,
    GenerationConfig,
)
from transformers.generation.continuous_batching.utils import WorkloadHints
from transformers.generation.streamers import BaseStreamer

from infer.bench.metrics import RequestMetrics, RunResult
from infer.loader import resolve_model
from infer.workloads import Workload

CONTINUOUS_ATTENTION = "paged|sdpa"
SEQUENTIAL_ATTENTION = "sdpa"


def build_hf_model(
    model: str, load_format: str, device: torch.device, dtype: torch.dtype, seed: int
) -> Any:
    """The transformers model behind ``--model``: random weights at the real shapes for a
    preset or ``--load-format dummy``, the checkpoint's weights otherwise."""
    source = resolve_model(model)
    if source.kind == "gguf":
        raise ValueError("model: the transformers peer needs a preset or a HF checkpoint, not GGUF")
    torch.manual_seed(seed)
    if source.kind == "preset" or load_format == "dummy":
        raw = dict(source.hf_config)
        config = AutoConfig.for_model(raw.pop("model_type"), **raw)
        with torch.device(device):
            hf_model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    else:
        hf_model = AutoModelForCausalLM.from_pretrained(str(source.path), dtype=dtype)
        hf_model = hf_model.to(device)  # type: ignore[arg-type]
    hf_model.eval()
    hf_model.generation_config.eos_token_id = None  # fixed-length outputs
    hf_model.config.eos_token_id = None
    return hf_model


def run_hf(
    model: Any,
    workload: Workload,
    warmup: Workload | None = None,
    progress: bool = True,
) -> RunResult:
    """Run ``warmup`` (unmeasured), then ``workload``, through transformers."""
    if workload.sequential:
        return _run_generate(model, workload, warmup, progress)
    return _run_continuous(model, workload, warmup, progress)


class _TokenTimer(BaseStreamer):
    """Notes when ``generate`` hands over each new token (the first call is the prompt)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self._seen_prompt = False

    def put(self, value: torch.Tensor) -> None:
        if self._seen_prompt:
            self.times.append(time.perf_counter())
        self._seen_prompt = True

    def end(self) -> None:
        pass


def _run_generate(
    model: Any, workload: Workload, warmup: Workload | None, progress: bool
) -> RunResult:
    model.set_attn_implementation(SEQUENTIAL_ATTENTION)

    def one(prompt: list[int], max_tokens: int, start: float) -> RequestMetrics:
        config = GenerationConfig(
            max_new_tokens=max_tokens,
            min_new_tokens=max_tokens,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
        input_ids = torch.tensor([prompt], device=model.device)
        timer = _TokenTimer()
        arrival = time.perf_counter()
        with torch.inference_mode():
            model.generate(input_ids, generation_config=config, streamer=timer)
        return RequestMetrics(len(prompt), arrival - start, [t - arrival for t in timer.times])

    for spec in warmup.requests if warmup else []:
        one(spec.prompt_token_ids, spec.max_tokens, time.perf_counter())
    start = time.perf_counter()
    requests = [
        one(spec.prompt_token_ids, spec.max_tokens, start)
        for spec in tqdm(
            workload.requests,
            desc=f"transformers {workload.name}",
            unit="req",
            disable=not progress,
        )
    ]
    return RunResult(requests, {"hf_api": "generate", "hf_attention": _attention(model)})


def _run_continuous(
    model: Any, workload: Workload, warmup: Workload | None, progress: bool
) -> RunResult:
    model.set_attn_implementation(CONTINUOUS_ATTENTION)
    specs = workload.requests
    config = GenerationConfig(
        max_new_tokens=max(s.max_tokens for s in specs),
        do_sample=False,
        eos_token_id=-1,
        pad_token_id=0,
    )
    hints = WorkloadHints(
        max_prompt_length=max(len(s.prompt_token_ids) for s in specs),
        max_generated_length=max(s.max_tokens for s in specs),
        num_requests=len(specs),
    )
    with model.continuous_batching_context_manager(
        generation_config=config,
        continuous_batching_config=_cpu_cache_config(workload, warmup, model.device),
        workload_hints=hints,
        warmup=True,
        block=True,
    ) as manager:
        if warmup is not None:
            _feed(manager, warmup, "warmup", progress=False)
        requests = _feed(manager, workload, "bench", progress)
        attention = _attention(model)  # what transformers chose to run with
    gc.collect()  # give the paged cache back before anything else runs on the device
    if model.device.type == "cuda":
        torch.cuda.empty_cache()
    return RunResult(requests, {"hf_api": "continuous batching", "hf_attention": attention})


def _feed(manager: Any, workload: Workload, tag: str, progress: bool) -> list[RequestMetrics]:
    """Add each request at its arrival time; collect results with their token timestamps."""
    specs = workload.requests
    pending = deque(sorted(range(len(specs)), key=lambda i: specs[i].arrival_s))
    outputs: dict[str, Any] = {}
    dropped: set[str] = set()
    start = time.perf_counter()
    with tqdm(
        total=len(specs), desc=f"transformers {workload.name}", unit="req", disable=not progress
    ) as bar:
        while len(outputs) + len(dropped) < len(specs):
            now = time.perf_counter() - start
            while pending and specs[pending[0]].arrival_s <= now:
                index = pending.popleft()
                spec = specs[index]
                request_id = f"{tag}-{index}"
                added = manager.add_request(
                    spec.prompt_token_ids,
                    request_id=request_id,
                    max_new_tokens=spec.max_tokens,
                    record_timestamps=True,
                )
                if added is None:  # the manager refused it
                    dropped.add(request_id)
            wait = specs[pending[0]].arrival_s - now if pending else 1.0
            out = manager.get_result(timeout=min(max(wait, 0.001), 1.0))
            if out is None:
                if not manager.is_running():
                    raise RuntimeError("transformers' generation thread stopped")
                continue
            if out.is_finished() and out.request_id not in outputs:
                outputs[out.request_id] = out
                bar.update(1)
    return [
        _metrics(specs[i].prompt_token_ids, outputs.get(f"{tag}-{i}"), start)
        for i in range(len(specs))
    ]


def _metrics(prompt: list[int], out: Any, start: float) -> RequestMetrics:
    if out is None:
        return RequestMetrics(len(prompt), 0.0, error="dropped by the transformers manager")
    arrival = out.created_time
    times = [t - arrival for t in (out.timestamps or [])]
    return RequestMetrics(len(prompt), arrival - start, times, out.error)


def _cpu_cache_config(
    workload: Workload, warmup: Workload | None, device: torch.device
) -> ContinuousBatchingConfig | None:
    """On a GPU transformers sizes its cache from free memory (None: its defaults); on a CPU
    that would claim most of the host's RAM, so the cache is sized to the workload."""
    if device.type == "cuda":
        return None
    requests = workload.requests + (warmup.requests if warmup else [])
    blocks = sum(math.ceil((len(r.prompt_token_ids) + r.max_tokens) / 16) for r in requests)
    return ContinuousBatchingConfig(num_blocks=blocks + 1, max_batch_tokens=512)


def _attention(model: Any) -> str:
    return str(model.config._attn_implementation)
