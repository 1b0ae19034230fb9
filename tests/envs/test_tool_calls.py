"""Qwen-style `<tool_call>` JSON blocks in a turn: calls, the text around them, and errors that name the block."""

import pytest

from turnkeep.envs.tool_calls import ToolCall, ToolCallError, format_tool_call, format_tool_result, parse_tool_calls


def test_a_turn_without_blocks_is_all_text() -> None:
    assert parse_tool_calls("The answer is 85.") == ([], "The answer is 85.")
    assert parse_tool_calls("") == ([], "")


def test_blocks_become_calls_in_order_and_the_rest_is_text() -> None:
    turn = ('Let me add, then multiply.\n<tool_call>\n{"name": "add", "arguments": {"a": 37, "b": 48}}\n'
            '</tool_call>\n<tool_call>\n{"name": "mul", "arguments": {"a": 85, "b": 2}}\n</tool_call>')
    calls, text = parse_tool_calls(turn)
    assert calls == [ToolCall("add", {"a": 37, "b": 48}), ToolCall("mul", {"a": 85, "b": 2})]
    assert text == "Let me add, then multiply."
    parsed = parse_tool_calls(turn)
    assert parsed.calls == calls and parsed.text == text


def test_what_the_template_renders_parses_back() -> None:
    call = ToolCall("search", {"query": "naïve \"quoted\" </tool> text", "limit": 3, "filters": {"x": [1, None]}})
    block = format_tool_call(call)
    assert block.startswith("<tool_call>\n{") and block.endswith("}\n</tool_call>")
    assert parse_tool_calls(block) == ([call], "")
    assert parse_tool_calls("before " + block + " after") == ([call], "before  after")


def test_lenient_forms_models_write() -> None:
    assert parse_tool_calls('<tool_call>{"name": "f", "parameters": {"x": 1}}</tool_call>').calls == [
        ToolCall("f", {"x": 1})]
    assert parse_tool_calls('<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>').calls == [
        ToolCall("f", {"x": 1})]
    assert parse_tool_calls('<tool_call>\n{"name": "now"}\n</tool_call>').calls == [ToolCall("now", {})]


@pytest.mark.parametrize(
    ("turn", "block", "problem"),
    [
        ('<tool_call>\n{"name": "add", "arguments": {"a": 1,}}\n</tool_call>', 1, "not valid JSON"),
        ("<tool_call>\n</tool_call>", 1, "not valid JSON"),
        ('<tool_call>["add", 1]</tool_call>', 1, "expected a JSON object"),
        ('<tool_call>{"arguments": {}}</tool_call>', 1, 'no "name"'),
        ('<tool_call>{"name": 3, "arguments": {}}</tool_call>', 1, '"name" must be a non-empty string'),
        ('<tool_call>{"name": "f", "arguments": [1]}</tool_call>', 1, '"arguments" must be a JSON object'),
        ('<tool_call>{"name": "f", "arguments": "x"}</tool_call>', 1, '"arguments" is a string that is not valid'),
        ('<tool_call>{"name": "f"}</tool_call> <tool_call>{"name": "g", ', 2, "never closed"),
        ('<tool_call>{"name": "f"} <tool_call>', 1, "opened again"),
        ('done</tool_call>', 1, "without an opening"),
    ],
)
def test_unreadable_blocks_raise_an_error_naming_the_block(turn: str, block: int, problem: str) -> None:
    with pytest.raises(ToolCallError) as err:
        parse_tool_calls(turn)
    assert err.value.block == block and problem in err.value.problem
    assert str(err.value).startswith(f"tool call {block}: ")
    assert isinstance(err.value, ValueError)


def test_invalid_json_says_where() -> None:
    with pytest.raises(ToolCallError, match=r"line 1 column \d+"):
        parse_tool_calls('<tool_call>{"name": "f" "arguments": {}}</tool_call>')


def test_results_become_message_text() -> None:
    assert format_tool_result("85") == "85"
    assert format_tool_result({"result": 85, "unit": "°C"}) == '{"result": 85, "unit": "°C"}'
    assert format_tool_result([1, 2]) == "[1, 2]"
    assert format_tool_result(None) == "null"
