"""How a sequence the engine ended with an error reaches the client: its own grammar's
failure as a 400 that says what failed, anything else as a generic 500."""

from __future__ import annotations

from infer.server.http.serving import _as_api_error, _SequenceFailed


def test_a_sequence_ended_by_its_grammar_is_a_400_naming_structured_outputs() -> None:
    message = "structured_outputs: the grammar's matcher failed: lexer error: too many expressions"
    error = _as_api_error(_SequenceFailed(message))
    assert error.status == 400
    assert error.info.param == "structured_outputs"
    assert error.info.message == message


def test_a_sequence_failed_by_the_engine_is_a_generic_500() -> None:
    error = _as_api_error(_SequenceFailed("RuntimeError: CUDA error: an illegal memory access"))
    assert error.status == 500
    assert "CUDA" not in error.info.message
