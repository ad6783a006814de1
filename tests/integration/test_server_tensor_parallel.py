"""``infer serve -tp 3`` as a real process (SmolLM2: 9 heads split over 3 CPU ranks): it
answers a request, and its worker processes exit with it."""

from __future__ import annotations

import openai
import psutil

from infer.server.bridge.launch import spawn_server


def test_server_with_tensor_parallel_workers() -> None:
    args = [
        "--model", "smollm2-135m", "-tp", "3", "--device", "cpu", "--dtype", "float32",
        "--num-gpu-blocks", "64", "--max-seq-len", "512", "--max-batch-size", "4",
    ]  # fmt: skip
    with spawn_server(args) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)
        chat = client.chat.completions.create(
            model="smollm2-135m",
            messages=[{"role": "user", "content": "What is the capital of France?"}],
            temperature=0,
            max_tokens=16,
        )
        assert "Paris" in (chat.choices[0].message.content or "")
        workers = [
            p
            for p in psutil.Process(server.process.pid).children(recursive=True)
            if "infer.engine.setup.tp_worker" in " ".join(p.cmdline())
        ]
        assert len(workers) == 2
    _, alive = psutil.wait_procs(workers, timeout=30)
    assert not alive
