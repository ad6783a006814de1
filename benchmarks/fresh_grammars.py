"""Constrained outputs under grammars a running server has never seen (issue 40): JSON
schemas and forced tool calls (``required`` and named) whose names are new in every request,
sent with the ``openai`` client at temperature 1; counts the replies that do not validate.

    python benchmarks/fresh_grammars.py --url http://127.0.0.1:8000 [--requests 500]
        [--concurrency 8]

Prints one line per broken reply (what broke, the text) and a summary: replies that
validate, broken ones, and the server's ``infer_structured_output_errors_total`` before and
after. Each schema bounds its strings, numbers and items, so every reply fits ``max_tokens``
and a reply cut by length counts as broken too.
"""

from __future__ import annotations

import argparse
import json
import secrets
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import jsonschema
import openai
from prometheus_client.parser import text_string_to_metric_families

MODEL = "smollm2-135m"
MAX_TOKENS = 160
QUESTION = [{"role": "user", "content": "What is the weather like in Paris today?"}]


def fresh_schema(tag: str) -> dict[str, Any]:
    """Parameters no request has used before: their property names carry ``tag``."""
    return {
        "type": "object",
        "properties": {
            f"city_{tag}": {"type": "string", "maxLength": 16},
            "unit": {"enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 14},
            "alerts": {
                "type": "array",
                "items": {"type": "string", "maxLength": 10},
                "maxItems": 2,
            },
        },
        "required": [f"city_{tag}", "unit", "days"],
        "additionalProperties": False,
    }


def ask(client: openai.OpenAI, index: int) -> str | None:
    """One request under a new grammar (a JSON schema, a required call or a named one, in
    turn); why its reply is broken (an error reply included), or None when it validates."""
    try:
        return _ask(client, index)
    except openai.APIStatusError as exc:
        return f"HTTP {exc.status_code}: {exc.message}"


def _ask(client: openai.OpenAI, index: int) -> str | None:
    tag = secrets.token_hex(4)
    schema, tool = fresh_schema(tag), f"get_weather_{tag}"
    common: Any = {
        "model": MODEL,
        "messages": QUESTION,
        "max_tokens": MAX_TOKENS,
        "temperature": 1.0,
    }
    if index % 3 == 0:
        fmt: Any = {"type": "json_schema", "json_schema": {"name": "w", "schema": schema}}
        choice = client.chat.completions.create(response_format=fmt, **common).choices[0]
        texts = [choice.message.content or ""]
        expected = "stop"
    else:
        tools: Any = [{"type": "function", "function": {"name": tool, "parameters": schema}}]
        forced: Any = (
            "required" if index % 3 == 1 else {"type": "function", "function": {"name": tool}}
        )
        choice = client.chat.completions.create(
            tools=tools, tool_choice=forced, parallel_tool_calls=False, **common
        ).choices[0]
        calls = choice.message.tool_calls or []
        if [call.function.name for call in calls] != [tool]:  # type: ignore[union-attr]
            return f"tool calls {calls!r}, content {choice.message.content!r}"
        texts = [calls[0].function.arguments]  # type: ignore[union-attr]
        expected = "tool_calls"
    if choice.finish_reason != expected:
        return f"finish_reason {choice.finish_reason!r}: {texts[0]!r}"
    try:
        jsonschema.validate(json.loads(texts[0]), schema)
    except (ValueError, jsonschema.ValidationError) as exc:
        return f"{type(exc).__name__}: {texts[0]!r}"
    return None


def grammar_errors(url: str) -> float:
    """The server's count of sequences its grammar's matcher ended."""
    text = httpx.get(f"{url}/metrics").text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "infer_structured_output_errors_total"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", required=True, help="the server, e.g. http://127.0.0.1:8000")
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    client = openai.OpenAI(base_url=f"{args.url}/v1", api_key="unused", max_retries=0)
    before = grammar_errors(args.url)
    with ThreadPoolExecutor(args.concurrency) as pool:
        problems = list(pool.map(lambda i: ask(client, i), range(args.requests)))
    broken = [p for p in problems if p is not None]
    for problem in broken:
        print(f"broken: {problem}")
    after = grammar_errors(args.url)
    print(
        f"{args.requests - len(broken)} of {args.requests} replies validate, "
        f"{len(broken)} broken; infer_structured_output_errors_total {before:g} -> {after:g}"
    )


if __name__ == "__main__":
    main()
