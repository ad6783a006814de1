"""The CPU sampler tells a busy process from an idle one."""

from __future__ import annotations

import subprocess
import sys

import pytest

from infer.bench.cpu_sampler import CpuSampler

# The busy loop prints the share of a core it got (less than one on a loaded machine).
BUSY = (
    "import time\nstart = time.monotonic()\nwhile time.monotonic() < start + 2.5: pass\n"
    "print(time.process_time() / (time.monotonic() - start))"
)
IDLE = "import time; time.sleep(2.5)"


def _peak(code: str) -> tuple[float, str]:
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    sampler = CpuSampler(child.pid, interval_s=0.05).start()
    printed, _ = child.communicate(timeout=60)
    sampler.stop()
    return sampler.peak_cores(window_s=1.0), printed


@pytest.mark.serial
def test_a_busy_loop_keeps_about_one_core_busy_and_a_sleep_none() -> None:
    peak, printed = _peak(BUSY)
    share = float(printed)  # one core, or what a shared machine left it
    assert 0.8 * share < peak <= 1.2  # one thread: at most one core
    assert _peak(IDLE)[0] < 0.3  # the interpreter's start-up only


def test_too_few_samples_give_zero() -> None:
    sampler = CpuSampler(pid=1)
    sampler.samples = [(0.0, 0.0), (0.5, 0.5)]
    assert sampler.peak_cores(window_s=1.0) == 0.0
    sampler.samples = [(0.0, 0.0), (0.5, 0.1), (1.0, 0.9), (1.5, 1.0)]
    assert sampler.peak_cores(window_s=1.0) == 0.9


def test_cores_between_two_moments_count_only_the_samples_inside() -> None:
    sampler = CpuSampler(pid=1)
    sampler.samples = [(0.0, 0.0), (1.0, 2.0), (2.0, 2.5), (3.0, 3.0), (4.0, 5.0)]
    assert sampler.cores_between(0.9, 3.1) == 0.5  # 1 CPU second over 2 s
    assert sampler.cores_between(1.5, 2.5) is None  # one sample: nothing to divide
