"""Tensor parallelism across "nodes" on the CPU (gloo): every node but 0 is an
``infer serve --node-rank N`` process on this machine. SmolLM2 split over three nodes (its 9
heads do not split in two) gives one rank's greedy tokens, and its nodes exit when node 0
stops; a node 0 that dies (``infer serve``'s engine killed) ends the other node too; a node
with no master is the timeout error naming the master."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import openai
import pytest
import torch

from infer import LLM, SamplingParams
from infer.cli import main
from infer.server.bridge.launch import spawn_server

CPU = ["--device", "cpu", "--dtype", "float32"]
GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, logprobs=0)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Node 0's rank here, like the other "nodes", on one core of this machine's few: each
    would take them all, as on a node of its own, and wait on the others in every step."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def start_node(model: str, tp: int, node_rank: int, port: int) -> subprocess.Popen[str]:
    """``infer serve`` for node ``node_rank`` of ``tp`` nodes (one rank each, one thread)."""
    args = ["--model", model, "-tp", str(tp), "--nnodes", str(tp), "--node-rank",
            str(node_rank), "--master-port", str(port), "--dist-timeout", "300", *CPU]  # fmt: skip
    return subprocess.Popen(
        [sys.executable, "-m", "infer.cli", "serve", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


def ended(node: subprocess.Popen[str]) -> tuple[int, str]:
    """The node's exit status and log, once it has exited (killed if it has not in time)."""
    try:
        _, log = node.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        node.kill()
        _, log = node.communicate()
    return node.returncode, log


def test_three_nodes_give_one_ranks_tokens_and_exit_with_node_0(
    smollm2_llm: LLM, one_thread: None
) -> None:
    prompts = ["The capital of France is", "def fibonacci(n):"]
    single = [r.outputs[0] for r in smollm2_llm.generate(prompts, GREEDY, use_tqdm=False)]
    port = free_port()
    nodes = [start_node("smollm2-135m", 3, rank, port) for rank in (1, 2)]
    try:
        llm = LLM("smollm2-135m", tensor_parallel_size=3, nnodes=3, master_port=port,
                  device="cpu", dtype="float32", num_gpu_blocks=32, max_seq_len=128)  # fmt: skip
        try:
            split = [r.outputs[0] for r in llm.generate(prompts, GREEDY, use_tqdm=False)]
        finally:
            llm.engine.close()  # the shutdown step
    finally:
        results = [ended(node) for node in nodes]
    for rank, (code, log) in zip((1, 2), results, strict=True):
        assert code == 0, log
        assert f"node {rank}: serving rank {rank} of 3 headless" in log
        assert f"node {rank}: rank 0 sent the shutdown step" in log
    for one, many in zip(single, split, strict=True):
        assert one.token_ids == many.token_ids
        for a, b in zip(one.logprobs, many.logprobs, strict=True):  # to float32 rounding
            assert b.logprob == pytest.approx(a.logprob, abs=1e-4)


def test_a_node_exits_when_node_0_dies(tiny_checkpoint: Callable[[str], Path]) -> None:
    model = str(tiny_checkpoint("llama"))
    port = free_port()
    node = start_node(model, 2, 1, port)
    try:
        args = ["--model", model, "-tp", "2", "--nnodes", "2", "--master-port", str(port),
                "--num-gpu-blocks", "32", "--max-seq-len", "128", *CPU]  # fmt: skip
        with spawn_server(args) as server:
            client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)
            completion = client.completions.create(
                model=model, prompt=[5, 17, 33], max_tokens=4, temperature=0
            )
            assert completion.usage is not None and completion.usage.completion_tokens == 4
            os.kill(server.engine_pid(), signal.SIGKILL)  # node 0's rank 0 is gone
            code, log = ended(node)
    finally:
        if node.poll() is None:
            node.kill()
    assert code == 1, log
    assert "node 1: the connection to the group broke (rank 0" in log


def test_a_node_with_no_master_is_the_timeout_error_naming_it(
    tiny_checkpoint: Callable[[str], Path], capsys: pytest.CaptureFixture[str]
) -> None:
    port = free_port()
    argv = ["serve", "--model", str(tiny_checkpoint("llama")), "-tp", "2", "--nnodes", "2",
            "--node-rank", "1", "--master-port", str(port), "--dist-timeout", "1",
            *CPU]  # fmt: skip
    assert main(argv) == 2
    error = capsys.readouterr().err
    assert "infer serve: error: dist_timeout: rank 1 could not reach the master at " in error
    assert f"127.0.0.1:{port} within 1 s" in error
