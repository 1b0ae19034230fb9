"""The `python` tool of `tool_chat`: a calculator that reads Python arithmetic, evaluated without running code.

The model writes `{"name": "python", "arguments": {"code": "(82 - 87) * 3 / 4"}}`. The code is parsed with
`ast` and only literals, arithmetic operators, parentheses and a few pure functions of `math` are evaluated: no
names, attributes, calls of anything else, comprehensions or statements, so nothing the model writes can touch
the process, the files or the network (the sandbox is the grammar, not a jail). Sizes are bounded so a turn cannot
stall the server (`10**10**10`, `9**9**9` are refused before they are computed).
"""

from __future__ import annotations

import ast
import math
import operator
from typing import Any

SCHEMA = {
    "type": "function",
    "function": {
        "name": "python",
        "description": "Evaluate a Python arithmetic expression (numbers, + - * / // % **, parentheses, abs, round, "
                       "min, max, and math's sqrt, floor, ceil, log, exp, gcd, factorial) and return its value.",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "The expression, e.g. (82 - 87) * 3"}},
            "required": ["code"],
        },
    },
}
"""The tool's JSON schema, as chat templates list tools (Qwen's `tools`)."""

MAX_CODE_CHARS = 400
MAX_EXPONENT = 1000
MAX_MAGNITUDE = 10 ** 100

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_FUNCTIONS = {"abs": abs, "round": round, "min": min, "max": max, "sqrt": math.sqrt, "floor": math.floor,
              "ceil": math.ceil, "log": math.log, "exp": math.exp, "gcd": math.gcd, "factorial": math.factorial}


class ToolError(ValueError):
    """Code the calculator refuses or cannot evaluate; the message is what the model is told."""


def run_python(arguments: dict[str, Any]) -> str:
    """The tool's reply to one call: the value as text, or ToolError naming the problem."""
    code = arguments.get("code")
    if not isinstance(code, str) or not code.strip():
        raise ToolError('the python tool takes {"code": "<an arithmetic expression>"}')
    if len(code) > MAX_CODE_CHARS:
        raise ToolError(f"code is {len(code)} characters; at most {MAX_CODE_CHARS}")
    try:
        tree = ast.parse(code.strip(), mode="eval")
    except SyntaxError as err:
        raise ToolError(f"not a Python expression ({err.msg})") from None
    try:
        value = _evaluate(tree.body)
    except (ArithmeticError, ValueError, TypeError) as err:
        raise ToolError(f"{type(err).__name__}: {err}") from None
    return _text(value)


def _evaluate(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ToolError(f"exponent {right} is too large (at most {MAX_EXPONENT})")
        return _bounded(_BINARY[type(node.op)](left, right))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS \
            and not node.keywords:
        if node.func.id == "factorial" and node.args and abs(_evaluate(node.args[0])) > MAX_EXPONENT:
            raise ToolError(f"factorial of more than {MAX_EXPONENT} is too large")
        return _bounded(_FUNCTIONS[node.func.id](*(_evaluate(arg) for arg in node.args)))
    raise ToolError(f"{_describe(node)} is not allowed: only numbers, arithmetic and "
                    f"{', '.join(sorted(_FUNCTIONS))}")


def _bounded(value: int | float) -> int | float:
    if isinstance(value, complex) or abs(value) > MAX_MAGNITUDE:
        raise ToolError("the result is too large (or complex)")
    return value


def _text(value: int | float) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 2 ** 53:
        return str(int(value))
    if isinstance(value, float):
        return repr(round(value, 10))
    return str(value)


def _describe(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return f"the name {node.id!r}"
    if isinstance(node, ast.Call):
        return "a call of anything but the listed functions"
    return f"a {type(node).__name__} expression"
