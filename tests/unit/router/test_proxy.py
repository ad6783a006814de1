import json

from infer.router.proxy import error_events, worker_failed


def test_a_failed_chat_or_completion_stream_ends_with_an_error_and_done() -> None:
    events = error_events("/v1/chat/completions", worker_failed("http://w:1")).decode()
    error, done, rest = events.split("\n\n")
    assert json.loads(error.removeprefix("data: "))["error"]["code"] == "unavailable"
    assert (done, rest) == ("data: [DONE]", "")


def test_a_failed_responses_stream_ends_with_an_error_event() -> None:
    events = error_events("/v1/responses", worker_failed("http://w:1")).decode()
    kind, data, rest = events.split("\n", 2)
    assert kind == "event: error" and rest == "\n"
    body = json.loads(data.removeprefix("data: "))
    assert (body["type"], body["code"]) == ("error", "unavailable")
    assert "http://w:1" in body["message"]
