"""RocketMQ's SQL92 message filter: grammar, checks and the reference evaluator.

Source: RocketMQ's ``filter`` module (``parser/SelectorParser.jj``, ``expression/*.java``), a
descendant of ActiveMQ's JMS selector.  What it accepts, what it rejects at parse time and what
it answers for a message are RocketMQ's, quirks included (each is named where it is mirrored):

* Grammar, loosest first: ``OR``; ``AND``; ``=`` ``<>`` ``IS [NOT] NULL``; ``>`` ``>=`` ``<``
  ``<=`` ``[NOT] BETWEEN x AND y`` ``[NOT] IN ('a', ...)`` ``[NOT] CONTAINS|STARTSWITH|ENDSWITH
  'x'``; unary ``+`` ``-`` ``NOT``; literals, property names, parentheses.  ``NOT`` binds tighter
  than a comparison (``NOT a = 1`` is ``(NOT a) = 1``).  Keywords are case-insensitive; ``--``
  line and ``/* */`` block comments are skipped.
* Literals: ``'string'`` (``''`` is a quote), integers (``5``, ``5L``; int range -> int, else
  long), floats (``5.5``, ``.5``, ``5.``, ``5E3``; ``0.0`` is rejected: RocketMQ checks
  ``value < Double.MIN_VALUE``), ``TRUE``, ``FALSE``, ``NULL``.
* Property values are the message's property strings (user and system properties, e.g.
  ``TAGS``, ``KEYS``); a missing property is NULL.  A comparison with a number converts the
  string the way the number's Java type parses (``Integer.valueOf`` for an int literal,
  ``Long.valueOf``, ``Double.valueOf``); ``>`` ``>=`` ``<`` ``<=`` between two strings parse both
  as doubles.  A string that does not parse makes the *whole* expression false for that message
  (RocketMQ's evaluation throws, and the broker logs and skips the message).
* Three-valued logic: a comparison with NULL is NULL; ``AND`` / ``OR`` / ``NOT`` follow SQL's
  tables; a message matches only when the expression is TRUE.  ``CONTAINS`` & co. answer FALSE,
  never NULL, for a missing property or an empty search string.

Deviation, on purpose: Java's ``Double.valueOf`` also reads hexadecimal floats (``0x1p3``) and
``Character.digit`` accepts non-ASCII digits; here those strings do not parse (false).

:func:`parse` gives the checked tree; :func:`evaluate` / :func:`matches` are the reference
evaluator (plain Python, per message) that tests hold the broker's native evaluator
(:mod:`rmq._core.sqlfilter`) to.
"""
from __future__ import annotations

import functools
import math
import re
from typing import Any, Mapping, Optional

from lark import Lark, Token, Transformer, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from rmq.errors import FilterExpressionError

__all__ = ["Node", "parse", "evaluate", "matches", "MAX_SQL92_LENGTH", "MAX_SQL92_DEPTH",
           "MAX_SQL92_PROPERTIES", "referenced_properties"]

#: Longest expression accepted, characters.  RocketMQ has no explicit limit (its heartbeat body has
#: one); a subscription travels with every pull here, so it is kept to what a human writes.
MAX_SQL92_LENGTH = 4096
#: Deepest nesting of the parsed tree (the native evaluator recurses once per level).
MAX_SQL92_DEPTH = 128
#: Most distinct property names one expression may name (resolved once per message).
MAX_SQL92_PROPERTIES = 64

_INT_MIN, _INT_MAX = -(1 << 31), (1 << 31) - 1
_LONG_MIN, _LONG_MAX = -(1 << 63), (1 << 63) - 1
_DOUBLE_MIN_VALUE = 5e-324          # Java Double.MIN_VALUE (smallest positive subnormal)
_DOUBLE_MAX_VALUE = 1.7976931348623157e308

# Grammar: SelectorParser.jj, rule for rule.  Named operator tokens are kept so that errors can
# point at them.
_GRAMMAR = r"""
?start: or_expr

?or_expr: and_expr
        | or_expr OR and_expr                     -> or_
?and_expr: eq_expr
        | and_expr AND eq_expr                    -> and_
?eq_expr: cmp_expr
        | eq_expr EQ cmp_expr                     -> eq
        | eq_expr NE cmp_expr                     -> ne
        | eq_expr IS NULL                         -> is_null
        | eq_expr IS NOT NULL                     -> is_not_null
?cmp_expr: unary
        | cmp_expr GT unary                       -> gt
        | cmp_expr GE unary                       -> ge
        | cmp_expr LT unary                       -> lt
        | cmp_expr LE unary                       -> le
        | cmp_expr CONTAINS STRING                -> contains
        | cmp_expr NOT CONTAINS STRING            -> not_contains
        | cmp_expr STARTSWITH STRING              -> startswith
        | cmp_expr NOT STARTSWITH STRING          -> not_startswith
        | cmp_expr ENDSWITH STRING                -> endswith
        | cmp_expr NOT ENDSWITH STRING            -> not_endswith
        | cmp_expr BETWEEN unary AND unary        -> between
        | cmp_expr NOT BETWEEN unary AND unary    -> not_between
        | cmp_expr IN "(" strings ")"             -> in_
        | cmp_expr NOT IN "(" strings ")"         -> not_in
strings: STRING ("," STRING)*
?unary: PLUS unary                                -> pos
      | MINUS unary                               -> neg
      | NOT unary                                 -> not_
      | primary
?primary: STRING                                  -> string_lit
        | FLOAT                                   -> float_lit
        | DECIMAL                                 -> decimal_lit
        | TRUE                                    -> true_lit
        | FALSE                                   -> false_lit
        | NULL                                    -> null_lit
        | ID                                      -> prop
        | "(" or_expr ")"

OR: "OR"i
AND: "AND"i
NOT: "NOT"i
IS: "IS"i
NULL: "NULL"i
TRUE: "TRUE"i
FALSE: "FALSE"i
BETWEEN: "BETWEEN"i
IN: "IN"i
CONTAINS: "CONTAINS"i
STARTSWITH: "STARTSWITH"i
ENDSWITH: "ENDSWITH"i
EQ: "="
NE: "<>"
GT: ">"
GE: ">="
LT: "<"
LE: "<="
PLUS: "+"
MINUS: "-"
ID: /[a-z_$][a-z0-9_$]*/i
FLOAT.2: /[0-9]+\.[0-9]*([eE][+-]?[0-9]+)?|\.[0-9]+([eE][+-]?[0-9]+)?|[0-9]+[eE][+-]?[0-9]+/
DECIMAL: /(0|[1-9][0-9]*)[lL]?/
STRING: /'([^']|'')*'/
LINE_COMMENT: /--[^\n\r]*(\r\n|\n|\r)/
BLOCK_COMMENT: /\/\*(.|\n)*?\*\//s
WS: /[ \t\n\r\f]+/
%ignore WS
%ignore LINE_COMMENT
%ignore BLOCK_COMMENT
"""


_KEYWORDS = frozenset("NOT AND OR BETWEEN IN TRUE FALSE NULL IS CONTAINS STARTSWITH ENDSWITH".split())


class Node:
    """One node of a checked expression tree.

    ``op`` is one of: ``const`` (``kind`` in null/bool/int/long/double/str, ``value``), ``prop``
    (``value`` = name), ``neg``, ``boolcast``, ``not``, ``and``, ``or``, ``eq``, ``cmp`` (``value``
    in ``> >= < <=``), ``in`` (``value`` = tuple of strings), ``contains`` / ``startswith`` /
    ``endswith`` (``value`` = search string); ``negated`` for NOT IN / NOT CONTAINS & co.
    ``pos`` is the 0-based character index where the node's text starts.
    """
    __slots__ = ("op", "kind", "value", "args", "negated", "pos")

    def __init__(self, op: str, args: tuple = (), value: Any = None, kind: str = "", negated: bool = False,
                 pos: int = -1):
        self.op, self.args, self.value, self.kind, self.negated, self.pos = op, args, value, kind, negated, pos

    @property
    def is_boolean(self) -> bool:
        """RocketMQ's BooleanExpression: comparisons, logic, boolean casts, TRUE / FALSE / NULL."""
        if self.op == "const":
            return self.kind in ("bool", "null")
        return self.op not in ("prop", "neg")

    def __repr__(self) -> str:
        if self.op == "const":
            return "NULL" if self.kind == "null" else repr(self.value)
        if self.op == "prop":
            return self.value
        inner = ", ".join(map(repr, self.args))
        extra = f" {self.value!r}" if self.value is not None else ""
        return f"({'NOT ' if self.negated else ''}{self.op}{extra} {inner})"

    def depth(self) -> int:
        d, stack = 0, [(self, 1)]
        while stack:
            n, k = stack.pop()
            d = max(d, k)
            stack.extend((c, k + 1) for c in n.args)
        return d


class _SemanticError(Exception):
    def __init__(self, message: str, pos: int):
        super().__init__(message)
        self.pos = pos


def _text(n: Node) -> str:
    if n.op == "const":
        if n.kind == "str":
            return "'" + n.value.replace("'", "''") + "'"
        return {"null": "NULL", "bool": "TRUE" if n.value else "FALSE"}.get(n.kind, str(n.value))
    return n.value if n.op == "prop" else repr(n)


def _pos(x) -> int:
    return x.start_pos if isinstance(x, Token) else x.pos


def _as_boolean(n: Node) -> Node:
    """SelectorParser.asBooleanExpression."""
    if n.is_boolean:
        return n
    if n.op == "prop":
        return Node("boolcast", (n,), pos=n.pos)
    raise _SemanticError(f"Expression will not result in a boolean value: {_text(n)}", n.pos)


def _check_less_than_operand(n: Node) -> None:
    """ComparisonExpression.checkLessThanOperand."""
    if n.op == "const":
        if n.kind in ("int", "long", "double"):
            return
        raise _SemanticError(f"Value '{_text(n)}' cannot be compared.", n.pos)
    if n.is_boolean:
        raise _SemanticError(f"Value '{_text(n)}' cannot be compared.", n.pos)


def _cmp(op: str, a: Node, b: Node) -> Node:
    _check_less_than_operand(a)
    _check_less_than_operand(b)
    return Node("cmp", (a, b), value=op, pos=a.pos)


def _equal(a: Node, b: Node) -> Node:
    """ComparisonExpression.createEqual (checkEqualOperand, checkEqualOperandCompatability)."""
    for n in (a, b):
        if n.op == "const" and n.kind == "null":
            raise _SemanticError(f"'{_text(n)}' cannot be compared.", n.pos)
    if a.op == "const" and b.op == "const" and a.is_boolean and not b.is_boolean:
        raise _SemanticError(f"'{_text(a)}' cannot be compared with '{_text(b)}'", a.pos)
    return Node("eq", (a, b), pos=a.pos)


def _unquote(tok: Token) -> str:
    return tok[1:-1].replace("''", "'")


@v_args(inline=True)
class _Build(Transformer):
    """Lark callbacks (run inline by the LALR parser, bottom-up: no recursion on deep input)."""

    def or_(self, a, _t, b):
        return Node("or", (_as_boolean(a), _as_boolean(b)), pos=a.pos)

    def and_(self, a, _t, b):
        return Node("and", (_as_boolean(a), _as_boolean(b)), pos=a.pos)

    def eq(self, a, _t, b):
        return _equal(a, b)

    def ne(self, a, _t, b):
        return Node("not", (_equal(a, b),), pos=a.pos)

    def is_null(self, a, _t, _n):
        return Node("eq", (a, Node("const", kind="null", pos=_pos(_n))), pos=a.pos)

    def is_not_null(self, a, _t, _n, _m):
        return Node("not", (self.is_null(a, _t, _m),), pos=a.pos)

    def gt(self, a, _t, b):
        return _cmp(">", a, b)

    def ge(self, a, _t, b):
        return _cmp(">=", a, b)

    def lt(self, a, _t, b):
        return _cmp("<", a, b)

    def le(self, a, _t, b):
        return _cmp("<=", a, b)

    def _like(op, negated):
        def f(self, a, *rest):
            return Node(op, (a,), value=_unquote(rest[-1]), negated=negated, pos=a.pos)
        return f

    contains, not_contains = _like("contains", False), _like("contains", True)
    startswith, not_startswith = _like("startswith", False), _like("startswith", True)
    endswith, not_endswith = _like("endswith", False), _like("endswith", True)
    del _like

    def between(self, v, _t, lo, _a, hi):
        """ComparisonExpression.createBetween: constant bounds must be non-null and ordered."""
        if lo.op == "const" and hi.op == "const":
            if lo.kind == "null" or hi.kind == "null":
                raise _SemanticError("Illegal values of between, values can not be null!", lo.pos)
            try:
                order = _compare(_value(hi), _value(lo))
            except _EvalError as e:
                raise _SemanticError(f"Illegal values of between: {e}", lo.pos) from None
            if order < 0:
                raise _SemanticError(f"Illegal values of between, left value({_text(lo)}) must less than or "
                                     f"equal to right value({_text(hi)})", lo.pos)
        return Node("and", (_cmp(">=", v, lo), _cmp("<=", v, hi)), pos=v.pos)

    def not_between(self, v, _n, _t, lo, _a, hi):
        return Node("or", (_cmp("<", v, lo), _cmp(">", v, hi)), pos=v.pos)

    def _in(self, a, strings, negated):
        if a.op != "prop":
            raise _SemanticError(f"Expected a property for In expression, got: {_text(a)}", a.pos)
        return Node("in", (a,), value=tuple(dict.fromkeys(_unquote(t) for t in strings)), negated=negated, pos=a.pos)

    def in_(self, a, _t, strings):
        return self._in(a, strings, False)

    def not_in(self, a, _n, _t, strings):
        return self._in(a, strings, True)

    def strings(self, *toks):
        return list(toks)

    def pos(self, _t, a):
        return a

    def neg(self, t, a):
        return Node("neg", (a,), pos=t.start_pos)

    def not_(self, t, a):
        return Node("not", (_as_boolean(a),), pos=t.start_pos)

    def string_lit(self, t):
        return Node("const", kind="str", value=_unquote(t), pos=t.start_pos)

    def decimal_lit(self, t):
        """ConstantExpression.createFromDecimal: a long, narrowed to int when it fits."""
        text = t[:-1] if t[-1] in "lL" else str(t)
        v = int(text)
        if v > _LONG_MAX:
            raise _SemanticError(f'For input string: "{text}" (over the long range)', t.start_pos)
        return Node("const", kind="int" if v <= _INT_MAX else "long", value=v, pos=t.start_pos)

    def float_lit(self, t):
        """ConstantExpression.createFloat, with its range checks (``0.0`` fails the second)."""
        v = float(t)
        if v > _DOUBLE_MAX_VALUE:
            raise _SemanticError(f"{t} is greater than {_DOUBLE_MAX_VALUE!r}", t.start_pos)
        if v < _DOUBLE_MIN_VALUE:
            raise _SemanticError(f"{t} is less than 4.9E-324", t.start_pos)
        return Node("const", kind="double", value=v, pos=t.start_pos)

    def true_lit(self, t):
        return Node("const", kind="bool", value=True, pos=t.start_pos)

    def false_lit(self, t):
        return Node("const", kind="bool", value=False, pos=t.start_pos)

    def null_lit(self, t):
        return Node("const", kind="null", pos=t.start_pos)

    def prop(self, t):
        if t.upper() in _KEYWORDS:       # JavaCC lexes a keyword as the keyword, whatever the context
            raise _SemanticError(f"unexpected keyword {str(t)!r}", t.start_pos)
        return Node("prop", value=str(t), pos=t.start_pos)


_PARSER: Optional[Lark] = None


def _parser() -> Lark:
    """The LALR parser, built on first use (clients that never subscribe with SQL92 skip it)."""
    global _PARSER
    if _PARSER is None:
        _PARSER = Lark(_GRAMMAR, parser="lalr", lexer="contextual", transformer=_Build(), maybe_placeholders=False)
    return _PARSER


def _line_col(text: str, pos: int) -> tuple:
    line = text.count("\n", 0, pos) + 1
    return line, pos - (text.rfind("\n", 0, pos) + 1) + 1


def _error(expr: str, msg: str, pos: int) -> FilterExpressionError:
    if pos < 0:
        return FilterExpressionError(f"invalid SQL92 expression: {msg}", expr)
    line, col = _line_col(expr, pos)
    return FilterExpressionError(f"invalid SQL92 expression at line {line}, column {col}: {msg}", expr, pos, line,
                                 col)


def _describe(e: UnexpectedInput, expr: str) -> tuple:
    if isinstance(e, UnexpectedToken):
        tok = e.token
        if tok.type == "$END":
            return "unexpected end of expression", len(expr)
        expected = sorted(e.expected or ())
        hint = f"; expected one of {', '.join(expected)}" if expected and len(expected) <= 12 else ""
        return f"unexpected {str(tok)!r}{hint}", tok.start_pos
    if isinstance(e, UnexpectedCharacters):
        return f"unexpected character {expr[e.pos_in_stream]!r}", e.pos_in_stream
    if isinstance(e, UnexpectedEOF):
        return "unexpected end of expression", len(expr)
    return str(e).splitlines()[0], getattr(e, "pos_in_stream", -1) or -1


def parse(expr: str) -> Node:
    """Parse and check one SQL92 expression into its boolean tree.

    Raises
    ------
    FilterExpressionError
        Not a string, empty, over :data:`MAX_SQL92_LENGTH` characters, a syntax error, a rule of
        RocketMQ's parser broken (``'x' > a``, ``a = NULL``, ``5 IN (...)``, a constant that is not a
        boolean as the whole expression, ``BETWEEN 5 AND 1``...), deeper than
        :data:`MAX_SQL92_DEPTH` or naming more than :data:`MAX_SQL92_PROPERTIES` properties.  The
        message names the line and column; ``position`` is set.

    Trees are cached per expression text (:data:`PARSE_CACHE_SIZE`, as RocketMQ's SelectorParser
    caches its parses): a selector checked by the client, its SubscriptionData and the broker's
    compile parse once.  A tree is never modified after parsing.
    """
    if not isinstance(expr, str):
        raise FilterExpressionError(f"SQL92 expression must be a str, got {type(expr).__name__}", str(expr))
    return _parse_cached(expr)


#: Parsed trees kept per process (RocketMQ's SelectorParser.PARSE_CACHE keeps 100).
PARSE_CACHE_SIZE = 256


@functools.lru_cache(maxsize=PARSE_CACHE_SIZE)
def _parse_cached(expr: str) -> Node:
    if not expr.strip():
        raise FilterExpressionError("SQL92 expression is empty", expr)
    if len(expr) > MAX_SQL92_LENGTH:
        raise FilterExpressionError(f"SQL92 expression is {len(expr)} characters, over the limit of "
                                    f"{MAX_SQL92_LENGTH} (MAX_SQL92_LENGTH)", expr)
    try:
        tree = _parser().parse(expr)
        tree = _as_boolean(tree)
    except _SemanticError as e:
        raise _error(expr, str(e), e.pos) from None
    except UnexpectedInput as e:
        msg, pos = _describe(e, expr)
        raise _error(expr, msg, pos) from None
    except Exception as e:      # a callback's error wrapped by lark
        inner = getattr(e, "orig_exc", None)
        if isinstance(inner, _SemanticError):
            raise _error(expr, str(inner), inner.pos) from None
        raise
    if tree.depth() > MAX_SQL92_DEPTH:
        raise _error(expr, f"nested deeper than {MAX_SQL92_DEPTH} levels (MAX_SQL92_DEPTH)", tree.pos)
    names = referenced_properties(tree)
    if len(names) > MAX_SQL92_PROPERTIES:
        raise _error(expr, f"names {len(names)} properties, over the limit of {MAX_SQL92_PROPERTIES} "
                           f"(MAX_SQL92_PROPERTIES)", tree.pos)
    return tree


def referenced_properties(tree: Node) -> list:
    """Distinct property names of ``tree``, in first-seen order."""
    out: dict = {}
    stack = [tree]
    while stack:
        n = stack.pop()
        if n.op == "prop":
            out.setdefault(n.value, None)
        stack.extend(reversed(n.args))
    return list(out)


# -- the reference evaluator ---------------------------------------------------------------------
class _EvalError(Exception):
    """What RocketMQ's evaluation throws (a NumberFormatException, a ClassCastException): the
    broker then treats the message as not matched."""


_JAVA_INT = re.compile(r"[+-]?[0-9]+\Z")
_JAVA_DOUBLE = re.compile(r"[+-]?(NaN|Infinity|(([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?)[fFdD]?)\Z")


def _java_trim(s: str) -> str:
    i, j = 0, len(s)
    while i < j and s[i] <= " ":
        i += 1
    while j > i and s[j - 1] <= " ":
        j -= 1
    return s[i:j]


def _parse_as(s: str, kind: str) -> tuple:
    """The string ``s`` as Java's valueOf of ``kind`` reads it (Integer/Long/Double/Boolean)."""
    if kind == "bool":
        return "bool", s.lower() == "true"
    if kind in ("int", "long"):
        if not _JAVA_INT.match(s):
            raise _EvalError(f'For input string: "{s}"')
        v = int(s)
        lo, hi = (_INT_MIN, _INT_MAX) if kind == "int" else (_LONG_MIN, _LONG_MAX)
        if not lo <= v <= hi:
            raise _EvalError(f'For input string: "{s}" (out of {kind} range)')
        return kind, v
    t = _java_trim(s)
    m = _JAVA_DOUBLE.match(t)
    if not m:
        raise _EvalError(f'For input string: "{s}"')
    body = t[:-1] if t[-1] in "fFdD" and not t.endswith("NaN") and not t.endswith("Infinity") else t
    return "double", float(body.replace("Infinity", "inf").replace("NaN", "nan"))


def _double_compare(a: float, b: float) -> int:
    """java.lang.Double.compare: NaN is above everything and equal to itself; -0.0 < 0.0."""
    if a < b:
        return -1
    if a > b:
        return 1
    an, bn = math.isnan(a), math.isnan(b)
    if an or bn:
        return (an > bn) - (an < bn)
    if a == 0.0 and b == 0.0:
        sa, sb = math.copysign(1.0, a) < 0, math.copysign(1.0, b) < 0
        return (sb > sa) - (sb < sa)
    return 0


def _compare(lv: tuple, rv: tuple) -> int:
    """ComparisonExpression.__compare with convertStringExpressions on (what parsed selectors use)."""
    lk, rk = lv[0], rv[0]
    if lk != rk:
        if lk == "bool":
            if rk == "str":
                # Java casts the Boolean on the left to String: ClassCastException
                raise _EvalError("a boolean constant cannot be compared with a string")
            return -1
        elif lk == "int":
            if rk == "long":
                lv = ("long", lv[1])
            elif rk == "double":
                lv = ("double", float(lv[1]))
            elif rk == "str":
                rv = _parse_as(rv[1], "int")
            else:
                return -1
        elif lk == "long":
            if rk == "int":
                rv = ("long", rv[1])
            elif rk == "double":
                lv = ("double", float(lv[1]))
            elif rk == "str":
                rv = _parse_as(rv[1], "long")
            else:
                return -1
        elif lk == "double":
            if rk in ("int", "long"):
                rv = ("double", float(rv[1]))
            elif rk == "str":
                rv = _parse_as(rv[1], "double")
            else:
                return -1
        elif lk == "str":
            if rk in ("bool", "int", "long", "double"):
                lv = _parse_as(lv[1], rk)
            else:
                return -1
        else:
            return -1
    a, b = lv[1], rv[1]
    if lv[0] == "double":
        return _double_compare(a, b)
    return (a > b) - (a < b)


def _value(n: Node) -> Optional[tuple]:
    return None if n.kind == "null" else (n.kind, n.value)


_TRUE, _FALSE = ("bool", True), ("bool", False)


def _ev(n: Node, props: Mapping[str, str]) -> Optional[tuple]:
    op = n.op
    if op == "const":
        return _value(n)
    if op == "prop":
        v = props.get(n.value)
        # MessageDecoder.string2messageProperties drops a property with an empty value
        return ("str", v) if v else None
    if op == "and":
        lv = _ev(n.args[0], props)
        if lv == _FALSE:
            return _FALSE
        rv = _ev(n.args[1], props)
        if rv == _FALSE:
            return _FALSE
        return None if lv is None or rv is None else _TRUE
    if op == "or":
        lv = _ev(n.args[0], props)
        if lv == _TRUE:
            return _TRUE
        rv = _ev(n.args[1], props)
        if rv == _TRUE:
            return _TRUE
        return None if lv is None or rv is None else _FALSE
    if op == "not":
        v = _ev(n.args[0], props)
        return None if v is None else ("bool", not v[1])
    if op == "boolcast":
        v = _ev(n.args[0], props)
        return None if v is None else (v if v[0] == "bool" else _FALSE)
    if op == "eq":
        lv, rv = _ev(n.args[0], props), _ev(n.args[1], props)
        if (lv is None) != (rv is None):
            return None if lv is None else _FALSE
        if lv is None:
            return _TRUE
        if lv[0] == rv[0] and (lv[1] == rv[1] if lv[0] != "double" else _double_compare(lv[1], rv[1]) == 0):
            return _TRUE
        return _TRUE if _compare(lv, rv) == 0 else _FALSE
    if op == "cmp":
        lv = _ev(n.args[0], props)
        if lv is None:
            return None
        rv = _ev(n.args[1], props)
        if rv is None:
            return None
        if lv[0] == "str" and rv[0] == "str":
            c = _double_compare(_parse_as(lv[1], "double")[1], _parse_as(rv[1], "double")[1])
        else:
            c = _compare(lv, rv)
        o = n.value
        r = c > 0 if o == ">" else c >= 0 if o == ">=" else c < 0 if o == "<" else c <= 0
        return _TRUE if r else _FALSE
    if op == "in":
        v = _ev(n.args[0], props)
        if v is None or v[0] != "str":
            return None
        return _TRUE if (v[1] in n.value) != n.negated else _FALSE
    if op in ("contains", "startswith", "endswith"):
        if not n.value:
            return _FALSE
        v = _ev(n.args[0], props)
        if v is None or v[0] != "str":
            return _FALSE
        s = v[1]
        hit = n.value in s if op == "contains" else s.startswith(n.value) if op == "startswith" \
            else s.endswith(n.value)
        return _TRUE if hit != n.negated else _FALSE
    if op == "neg":
        v = _ev(n.args[0], props)
        if v is None or v[0] not in ("int", "long", "double"):
            return None
        return v[0], -v[1]
    raise AssertionError(f"unknown node {op}")


def evaluate(tree: Node, props: Mapping[str, str]) -> Optional[bool]:
    """TRUE / FALSE / NULL (None) of ``tree`` for a message with ``props``.

    Raises
    ------
    ValueError
        Where RocketMQ's evaluation throws (a property that does not parse as the number it is
        compared with); the broker counts such a message as not matched.
    """
    try:
        v = _ev(tree, props)
    except _EvalError as e:
        raise ValueError(str(e)) from None
    return None if v is None else bool(v[1])


def matches(tree: Node, props: Mapping[str, str]) -> bool:
    """Whether a message with ``props`` passes (ExpressionMessageFilter.isMatchedByCommitLog):
    TRUE only; FALSE, NULL and an evaluation error all reject it."""
    try:
        v = _ev(tree, props)
    except _EvalError:
        return False
    return v == _TRUE
