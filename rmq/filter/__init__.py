"""Message filters of a subscription: TAG expressions and SQL92 property filters.

A subscription names its filter by ``expressionType`` as RocketMQ does (``TAG``, the default, or
``SQL92``; ExpressionType.java).  TAG expressions are matched by the broker on the ConsumeQueue's
tagsCode and re-checked by clients; SQL92 expressions are evaluated by the broker on each
message's properties (broker.conf ``enablePropertyFilter=true``, as in RocketMQ) and never
re-checked by clients.

>>> MessageSelector.by_sql("a > 5 AND region IN ('eu', 'us')").expression_type
'SQL92'
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

from rmq.errors import FilterExpressionError
from rmq.filter import sql92

__all__ = ["ExpressionType", "MessageSelector", "compile_sql92", "FilterExpressionError",
           "SQL92_COMPILE_CACHE_SIZE"]

#: Compiled SQL92 expressions kept per process (RocketMQ's SelectorParser caches 100 parses; a
#: broker here compiles once per distinct expression, never per pull or per message).
SQL92_COMPILE_CACHE_SIZE = 1024


class ExpressionType:
    """RocketMQ's ExpressionType names."""
    TAG = "TAG"
    SQL92 = "SQL92"

    @staticmethod
    def is_tag_type(t: "str | None") -> bool:
        """ExpressionType.isTagType: None, empty and ``TAG`` all mean a tag expression."""
        return not t or t == ExpressionType.TAG

    @staticmethod
    def check(t: "str | None") -> str:
        """The canonical name of ``t``; raises FilterExpressionError for any other type."""
        if ExpressionType.is_tag_type(t):
            return ExpressionType.TAG
        if t == ExpressionType.SQL92:
            return t
        raise FilterExpressionError(f"unknown expressionType {t!r} (expected 'TAG' or 'SQL92')", str(t))


@dataclass(frozen=True)
class MessageSelector:
    """What a consumer subscribes with: ``MessageSelector.by_tag("a || b")`` or
    ``MessageSelector.by_sql("a > 5")`` (RocketMQ's MessageSelector.byTag / bySql).

    A plain string given where a selector is expected is a tag expression.
    """
    expression_type: str
    expression: str

    @classmethod
    def by_tag(cls, expression: str = "*") -> "MessageSelector":
        return cls(ExpressionType.TAG, expression or "*")

    @classmethod
    def by_sql(cls, expression: str) -> "MessageSelector":
        """A SQL92 selector; the expression is checked now.

        Raises
        ------
        FilterExpressionError
            It does not parse (the message names the line and column), or breaks a limit.
        """
        sql92.parse(expression)
        return cls(ExpressionType.SQL92, expression)


def _flatten(tree: sql92.Node, names: list) -> tuple:
    nodes: list = []
    seen: dict = {}
    index = {n: i for i, n in enumerate(names)}

    def emit(n: sql92.Node) -> int:
        # iterative post-order (children first) so deep trees do not recurse in Python
        stack = [(n, False)]
        while stack:
            node, done = stack.pop()
            if id(node) in seen:
                continue
            if not done:
                stack.append((node, True))
                stack.extend((c, False) for c in reversed(node.args))
                continue
            kids = [seen[id(c)] for c in node.args]
            a = index[node.value] if node.op == "prop" else (kids[0] if kids else 0)
            b = kids[1] if len(kids) > 1 else 0
            lval, dval, sval, in_list = 0, 0.0, b"", []
            if node.op == "const":
                if node.kind in ("int", "long"):
                    lval = node.value
                elif node.kind == "bool":
                    lval = int(node.value)
                elif node.kind == "double":
                    dval = node.value
                elif node.kind == "str":
                    sval = node.value.encode("utf-8")
            elif node.op in ("contains", "startswith", "endswith"):
                sval = node.value.encode("utf-8")
            elif node.op == "in":
                in_list = [v.encode("utf-8") for v in node.value]
            kind = node.value if node.op == "cmp" else node.kind
            seen[id(node)] = len(nodes)
            nodes.append((node.op, a, b, kind, node.negated, lval, dval, sval, in_list))
        return seen[id(n)]

    root = emit(tree)
    return nodes, root


@functools.lru_cache(maxsize=SQL92_COMPILE_CACHE_SIZE)
def compile_sql92(expression: str):
    """Parse, check and compile one SQL92 expression for the native evaluator (cached).

    Returns
    -------
    rmq._core.sqlfilter.SqlFilter
        ``.matches(properties_bytes) -> bool`` and the nogil ``match`` the store's read loop calls.

    Raises
    ------
    FilterExpressionError
        As :func:`rmq.filter.sql92.parse`.
    """
    from rmq._core.sqlfilter import SqlFilter
    tree = sql92.parse(expression)
    names = sql92.referenced_properties(tree)
    nodes, root = _flatten(tree, names)
    return SqlFilter(expression, nodes, root, [n.encode("utf-8") for n in names])
