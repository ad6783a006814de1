"""``infer serve``'s own flags: ``--data-parallel-size`` (``-dp``) and its errors, given
before any weights load."""

from __future__ import annotations

import contextlib
import io

import pytest

from infer.cli import build_parser, main

MODEL = ["--model", "smollm2-135m", "--device", "cpu"]


def test_data_parallel_size_has_a_short_flag() -> None:
    assert build_parser().parse_args(["serve", *MODEL, "-dp", "2"]).data_parallel_size == 2
    assert build_parser().parse_args(["serve", *MODEL]).data_parallel_size == 1
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    assert "--data-parallel-size" in out.getvalue() and "-dp" in out.getvalue()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-dp", "0"], "data_parallel_size: must be >= 1, got 0"),
        (["-dp", "2", "-tp", "2", "--nnodes", "2"], "data_parallel_size: replicas share one host"),
    ],
)
def test_impossible_replica_layouts_are_an_error_naming_the_field(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["serve", *MODEL, "--port", "0", *args]) == 2
    assert f"infer serve: error: {message}" in capsys.readouterr().err
