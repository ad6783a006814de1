import contextlib
import io

import pytest

from infer.cli import build_parser, main


def test_router_has_its_flags() -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        build_parser().parse_args(["router", "--help"])
    flags = ["--worker", "--host", "--port", "--api-key", "--health-interval"]
    flags += ["--cache-threshold", "--balance-abs-threshold", "--balance-rel-threshold"]
    assert [flag for flag in flags if flag not in out.getvalue()] == []


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--worker", "localhost:8000"], "url"),
        (["--cache-threshold", "2"], "cache_threshold"),
        (["--balance-rel-threshold", "0.5"], "balance_rel_threshold"),
        (["--health-interval", "0"], "health_interval"),
        (["--port", "70000"], "port"),
    ],
)
def test_bad_router_flags_are_an_error_naming_the_field(
    args: list[str], field: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["router", *args]) == 2
    assert f"infer router: error: {field}: " in capsys.readouterr().err
