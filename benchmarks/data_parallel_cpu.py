"""Issue 54's CPU figures (results-by-topic 16.1): the prefix hit rate of one SmolLM2 server
and of two replicas behind one (``-dp 2``) on the same shared-prefix workload, and how 20
concurrent prompts without a shared prefix split between the replicas. The workloads are the
integration test's (``tests/integration/test_server_data_parallel.py``), which holds the
bounds; this prints the figures. About 2 minutes on 2 cores:

    .venv/bin/python benchmarks/data_parallel_cpu.py
"""

from __future__ import annotations

import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.conftest import SMOLLM2_OPTIONS
from tests.integration.test_server_data_parallel import (
    complete,
    replica_samples,
    shared_prefix_hit_rate,
)

from infer.config import EngineConfig
from infer.server import build_server, serve_in_thread


def main() -> None:
    config = EngineConfig(model="smollm2-135m", **SMOLLM2_OPTIONS)
    rates = {}
    for replicas in (1, 2):
        server = build_server(config, port=0, log_level="warning", data_parallel_size=replicas)
        with serve_in_thread(server) as url:
            rates[replicas] = shared_prefix_hit_rate(url)
            if replicas == 2:
                before = replica_samples(url, "routed_requests_total")
                prompts = [f"{uuid.uuid4().hex} Tell me about the number {i}." for i in range(20)]
                with ThreadPoolExecutor(len(prompts)) as pool:
                    answers = list(pool.map(lambda p: complete(url, p), prompts))
                statuses = {answer.status_code for answer in answers}
                after = replica_samples(url, "routed_requests_total")
                split = [int(after[r] - before[r]) for r in ("0", "1")]
                print(f"unshared prompts per replica: {split} (statuses {sorted(statuses)})")
    print(f"prefix hit rate: one replica {rates[1]:.3f}, two {rates[2]:.3f} "
          f"({rates[2] / rates[1]:.2f}x)")  # fmt: skip


if __name__ == "__main__":
    main()
