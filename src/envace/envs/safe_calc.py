"""tau2's ``calculate`` tool without ``eval``: the same answers, bounded work.

tau2's airline and retail toolkits (and its ``GenericToolKit``) answer ``calculate(expression)`` with
Python's ``eval`` of the expression (no builtins), rounded to 2 places, after a character whitelist,
``0123456789+-*/(). ``. The whitelist admits ``**``, so ``9**9**9`` passes it and then runs for hours
inside one C call that holds the GIL, where no thread deadline can stop it. Here the expression is
parsed with :mod:`ast` and evaluated by a small interpreter that applies Python's own operators in
Python's order, so every answer and every error message is the one ``eval`` gives, except where a
bound cuts the work short (:class:`CalculationLimit`):

* an integer (a literal or an intermediate result) over :data:`MAX_INT_BITS` bits; ``int ** int`` and
  ``int * int`` are refused *before* they are computed when the result would be that large;
* an expression over :data:`MAX_EXPRESSION_CHARS` characters.

What the whitelist lets through is small: numbers, ``+ - * / // **`` (binary and unary ``+``/``-``),
parentheses, the empty tuple ``()`` and ``...``; the last two and calls such as ``(1)(2)`` only ever
end in the ``TypeError`` ``eval`` raises for them. Floats keep IEEE semantics (``10.0**300 *
10.0**300`` is ``inf``, answered ``"inf"`` as tau2 does); float work is constant-time.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from typing import Any

ALLOWED_CHARACTERS = "0123456789+-*/(). "  # tau2's whitelist, verbatim
MAX_INT_BITS = 1 << 14  # 16,384 bits (4,932 digits): above any literal Python parses (4,300 digits)
MAX_EXPRESSION_CHARS = 10_000  # tau2's gold expressions are at most 41


class CalculationLimit(ValueError):
    """The expression is valid but would need more work than the bounds allow."""


def check_power(base: Any, exponent: Any) -> None:
    """Refuse ``int ** int`` whose result would exceed :data:`MAX_INT_BITS` bits, before computing it.

    Only non-negative integer exponents of bases other than 0 and +-1 grow; a float on either side
    (or a negative exponent) makes it a constant-time float power.

    >>> check_power(2, 10), check_power(1, 10**100), check_power(2.0, 10**9)
    (None, None, None)
    >>> try:
    ...     check_power(9, 9**9)
    ... except CalculationLimit as exc:
    ...     print(exc)
    power too large: 9 ** 387420489 has over 16384 bits
    """
    if not (isinstance(base, int) and isinstance(exponent, int)) or exponent <= 0 or abs(base) <= 1:
        return
    if exponent > MAX_INT_BITS or exponent * math.log2(abs(base)) > MAX_INT_BITS:
        raise CalculationLimit(f"power too large: {_short(base)} ** {_short(exponent)} has over {MAX_INT_BITS} bits")


def _short(n: int) -> str:
    return str(n) if n.bit_length() <= 64 else f"<{n.bit_length()}-bit integer>"


def _bounded(value: Any) -> Any:
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise CalculationLimit(f"integer result too large: over {MAX_INT_BITS} bits")
    return value


def _mul(left: Any, right: Any) -> Any:
    if isinstance(left, int) and isinstance(right, int) and left.bit_length() + right.bit_length() > MAX_INT_BITS + 1:
        raise CalculationLimit(f"product too large: over {MAX_INT_BITS} bits")
    return left * right


def _pow(base: Any, exponent: Any) -> Any:
    check_power(base, exponent)
    return base**exponent


BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: _mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Pow: _pow,
}
UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def _children(node: ast.AST) -> list[ast.expr]:
    """The operands of ``node``, left to right; anything the interpreter does not know is refused."""
    if isinstance(node, ast.BinOp) and type(node.op) in BINARY:
        return [node.left, node.right]
    if isinstance(node, ast.UnaryOp) and type(node.op) in UNARY:
        return [node.operand]
    if isinstance(node, ast.Call) and not node.keywords and not any(isinstance(a, ast.Starred) for a in node.args):
        return [node.func, *node.args]
    if isinstance(node, ast.Constant) and type(node.value) in (int, float, type(...)):
        return []
    if isinstance(node, ast.Tuple) and not node.elts:
        return []
    raise ValueError(f"unsupported expression: {type(node).__name__}")


def _apply(node: ast.AST, operands: list[Any]) -> Any:
    """The value of ``node`` given its operands' values (as Python computes it)."""
    if isinstance(node, ast.Constant):
        return _bounded(node.value)
    if isinstance(node, ast.Tuple):
        return ()
    if isinstance(node, ast.UnaryOp):
        return UNARY[type(node.op)](operands[0])
    if isinstance(node, ast.BinOp):
        return _bounded(BINARY[type(node.op)](operands[0], operands[1]))
    # a call: nothing the whitelist can produce is callable; eval evaluates the arguments first, too
    raise TypeError(f"'{type(operands[0]).__name__}' object is not callable")


def evaluate(tree: ast.expr) -> Any:
    """Evaluate a parsed expression, operands left to right, without recursion (``1+1+...+1`` nests
    as deep as the parser allows)."""
    values: list[Any] = []
    todo: list[tuple[ast.expr, bool]] = [(tree, False)]
    while todo:
        node, expanded = todo.pop()
        children = _children(node)
        if expanded or not children:
            operands = values[len(values) - len(children) :]
            del values[len(values) - len(children) :]
            values.append(_apply(node, operands))
        else:
            todo.append((node, True))
            todo.extend((child, False) for child in reversed(children))
    return values.pop()


def calculate(expression: str) -> str:
    """tau2's ``calculate``: the rounded result as text, or the exception tau2's own version raises.

    >>> calculate("2 * ((350 - 122) + (499 - 127))"), calculate(" 7 / 2"), calculate("2 ** -1")
    ('1200.0', '3.5', '0.5')
    >>> calculate("2 + x")
    Traceback (most recent call last):
    ...
    ValueError: Invalid characters in expression
    >>> try:
    ...     calculate("9**9**9")
    ... except CalculationLimit as exc:
    ...     print(exc)
    power too large: 9 ** 387420489 has over 16384 bits
    """
    if not all(char in ALLOWED_CHARACTERS for char in expression):  # tau2's check, as it is written
        raise ValueError("Invalid characters in expression")
    if not isinstance(expression, str):
        raise TypeError("eval() arg 1 must be a string, bytes or code object")  # safe: tau2's message text, no call
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculationLimit(f"expression too long: {len(expression)} characters (at most {MAX_EXPRESSION_CHARS})")
    # eval drops leading spaces and tabs; "<string>" is the file name its syntax errors give
    tree = ast.parse(expression.lstrip(" \t"), filename="<string>", mode="eval")
    return str(round(float(evaluate(tree.body)), 2))
