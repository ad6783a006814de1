from infer.router.prompt_text import routing_key


def test_a_completion_is_routed_by_its_prompt() -> None:
    assert routing_key("/v1/completions", {"prompt": "Once upon"}) == "Once upon"
    assert routing_key("/v1/completions", {"prompt": ["first", "second"]}) == "first"
    assert routing_key("/v1/completions", {"prompt": [1, 2, 3]}) == [1, 2, 3]
    assert routing_key("/v1/completions", {"prompt": [[4, 5], [6]]}) == [4, 5]


def test_a_conversation_is_routed_by_its_roles_and_texts_in_order() -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "image_url"}]},
    ]
    key = routing_key("/v1/chat/completions", {"messages": messages})
    assert key == "system\nBe brief.\nuser\nHi\n"
    longer = routing_key("/v1/chat/completions", {"messages": [*messages, messages[1]]})
    assert isinstance(longer, str) and longer.startswith(key)
    with_tools = routing_key("/v1/chat/completions", {"messages": messages, "tools": [{"a": 1}]})
    assert with_tools == 'tools\n[{"a":1}]\n' + key


def test_a_response_is_routed_by_its_instructions_and_input() -> None:
    assert routing_key("/v1/responses", {"instructions": "Be brief.", "input": "Hi"}) == (
        "system\nBe brief.\nuser\nHi\n"
    )
    items = [{"role": "user", "content": [{"type": "input_text", "text": "Hi"}]}]
    assert routing_key("/v1/responses", {"input": items}) == "user\nHi\n"


def test_a_body_of_another_shape_is_routed_by_load_alone() -> None:
    for body in (
        None,
        [],
        "text",
        {"prompt": 3},
        {"prompt": [1, "x"]},
        {"messages": "hi"},
        {"messages": [3, {"role": "user", "content": 5}]},
    ):
        assert routing_key("/v1/completions", body) in ("", [])
        assert routing_key("/v1/chat/completions", body) in ("", "user\n\n")
    assert routing_key("/v1/models", {"prompt": "x"}) == ""
