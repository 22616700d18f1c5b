"""SQL92 filters: RocketMQ's grammar and parse-time rules, its evaluation semantics (each quirk
named), the limits, the native evaluator held to the reference one on random expressions and
random messages, and the store's filtered read."""
import random
import string

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rmq import MessageSelector
from rmq._core.commitlog import encode_properties
from rmq.client.consumer_api import SubscriptionData, build_pull_frame
from rmq.client.message import MessageQueue
from rmq.errors import FilterExpressionError
from rmq.filter import ExpressionType, compile_sql92, sql92
from rmq.filter.sql92 import MAX_SQL92_DEPTH, MAX_SQL92_LENGTH, MAX_SQL92_PROPERTIES
from rmq.status import GetMessageStatus


# -- a generator of expressions from the grammar (also used by the integration test) -------------
def random_expression(rng: random.Random, names=("a", "b", "c"), depth: int = 0) -> str:
    """Random text from RocketMQ's SQL92 grammar; some of it breaks the parse-time rules on
    purpose (a string compared with >, NULL compared with =...)."""
    def operand():
        r = rng.random()
        if r < 0.45:
            return rng.choice(names)
        if r < 0.6:
            return str(rng.choice([0, 1, 5, 7, 10, 50, 2147483647, 2147483648, 9]))
        if r < 0.7:
            return rng.choice(["1.5", "5.0", ".5", "5.", "1E1", "2.5e-1", "100.25"])
        if r < 0.8:
            return "'" + rng.choice(["eu", "us", "x", "7", "5.0", "", "it''s", "true"]) + "'"
        if r < 0.85:
            return rng.choice(["TRUE", "FALSE", "NULL", "true"])
        if r < 0.93:
            return "-" + operand()
        return "+" + operand()

    def strlit():
        return "'" + rng.choice(["eu", "us", "7", "1", "", "n1", "x"]) + "'"

    if depth > 3 or rng.random() < 0.3:
        r = rng.random()
        lhs = operand() if rng.random() < 0.3 else rng.choice(names)
        if r < 0.25:
            return f"{lhs} {rng.choice(['=', '<>', '>', '>=', '<', '<='])} {operand()}"
        if r < 0.35:
            return f"{lhs} IS {rng.choice(['', 'NOT '])}NULL"
        if r < 0.5:
            return f"{lhs} {rng.choice(['', 'NOT '])}BETWEEN {operand()} AND {operand()}"
        if r < 0.62:
            k = rng.randrange(1, 4)
            return f"{lhs} {rng.choice(['', 'NOT '])}IN ({', '.join(strlit() for _ in range(k))})"
        if r < 0.75:
            return f"{lhs} {rng.choice(['', 'NOT '])}{rng.choice(['CONTAINS', 'STARTSWITH', 'ENDSWITH'])} {strlit()}"
        if r < 0.85:
            return rng.choice(names)                     # a bare property: a boolean cast
        return rng.choice(["TRUE", "FALSE", "NULL"])
    r = rng.random()
    a = random_expression(rng, names, depth + 1)
    if r < 0.4:
        return f"({a}) AND ({random_expression(rng, names, depth + 1)})"
    if r < 0.8:
        return f"({a}) OR ({random_expression(rng, names, depth + 1)})"
    if r < 0.9:
        return f"NOT ({a})"
    return f"({a}) = {rng.choice(['TRUE', 'FALSE', '1', chr(39) + 'true' + chr(39)])}"


VALUES = ["0", "1", "5", "7", "10", "50", "-3", "+4", " 7", "5.0", "5.5", "1E1", "NaN", "-0.0", "0.0",
          "Infinity", "2147483648", "9223372036854775808", "x", "eu", "us", "true", "TRUE", "n1", "it's",
          "1d", "0x10", "", "\u00e9t\u00e9"]


def random_props(rng: random.Random, names=("a", "b", "c")) -> dict:
    return {n: rng.choice(VALUES) for n in names if rng.random() < 0.8}


def reference(tree, props):
    try:
        return sql92.evaluate(tree, props)
    except ValueError:
        return "error"


def native(f, props):
    try:
        return f.evaluate(encode_properties(props))
    except ValueError:
        return "error"


# -- grammar and parse-time rules -----------------------------------------------------------------
@pytest.mark.parametrize("expr, tree", [
    ("a > 5 AND region IN ('eu', 'us') AND name IS NOT NULL",
     "(and (and (cmp '>' a, 5), (in ('eu', 'us') region)), (not (eq name, NULL)))"),
    ("NOT a = 1", "(eq (not (boolcast a)), 1)"),                  # NOT binds tighter than =
    ("a BETWEEN 1 AND 3 AND b = 2", "(and (and (cmp '>=' a, 1), (cmp '<=' a, 3)), (eq b, 2))"),
    ("a NOT BETWEEN 1 AND 3", "(or (cmp '<' a, 1), (cmp '>' a, 3))"),
    ("a not in ('x')", "(NOT in ('x',) a)"),
    ("TAGS = 't' or a", "(or (eq TAGS, 't'), (boolcast a))"),
    ("x CONTAINS 'ab'", "(contains 'ab' x)"),
    ("x NOT STARTSWITH 'it''s'", "(NOT startswith \"it's\" x)"),
    ("a >= -5", "(cmp '>=' a, (neg 5))"),
    ("a > +5", "(cmp '>' a, 5)"),
    ("-- line comment\na = 1 /* block\n comment */", "(eq a, 1)"),
    ("andy = 1 Or $x_1 = 2", "(or (eq andy, 1), (eq $x_1, 2))"),
    ("a = 5L", "(eq a, 5)"),
    ("a > 2147483648", "(cmp '>' a, 2147483648)"),
    ("a > .5 and b < 5. and c > 1e3", None),
    ("TRUE", "True"),
    ("NULL", "NULL"),
])
def test_accepted(expr, tree):
    t = sql92.parse(expr)
    if tree is not None:
        assert repr(t) == tree


def test_integer_literals_keep_their_java_type():
    assert sql92.parse("a = 2147483647").args[1].kind == "int"
    assert sql92.parse("a = 2147483648").args[1].kind == "long"
    assert sql92.parse("a = 5L").args[1].kind == "int"        # createFromDecimal narrows a long that fits


@pytest.mark.parametrize("expr, message, column", [
    ("a > 5 AND", "unexpected end of expression", 10),
    ("a >< 3", "unexpected '<'", 4),
    ("a > 5 ) ", "unexpected ')'", 7),
    ("a = 'unterminated", "unexpected character", 5),
    ("a # 1", "unexpected character '#'", 3),
    ("'x' > a", "Value ''x'' cannot be compared.", 1),
    ("a > TRUE", "Value 'TRUE' cannot be compared.", 5),
    ("(a > 1) > 2", "cannot be compared", 2),
    ("a = NULL", "'NULL' cannot be compared.", 5),
    ("NULL <> a", "'NULL' cannot be compared.", 1),
    ("TRUE = 5", "'TRUE' cannot be compared with '5'", 1),
    ("5", "Expression will not result in a boolean value: 5", 1),
    ("'x' AND a", "Expression will not result in a boolean value", 1),
    ("5 IN ('a')", "Expected a property for In expression", 1),
    ("a IN (5)", "unexpected '5'", 7),
    ("a BETWEEN 5 AND 1", "must less than or equal to right value", 11),
    ("a BETWEEN NULL AND 1", "values can not be null", 11),
    ("a > 0.0", "0.0 is less than 4.9E-324", 5),             # RocketMQ's createFloat refuses 0.0
    ("a > 1e400", "is greater than", 5),
    ("a > 9223372036854775808", "over the long range", 5),
    ("and = 1", "unexpected keyword 'and'", 1),
    ("a = 05", "unexpected '5'", 6),
    ("a > 5 -- no newline after the comment", "unexpected", 7),
])
def test_rejected_with_position(expr, message, column):
    with pytest.raises(FilterExpressionError) as e:
        sql92.parse(expr)
    assert message in str(e.value)
    assert e.value.column == column and e.value.line == 1
    assert f"line 1, column {column}" in str(e.value)
    assert e.value.expression == expr


def test_multiline_position_and_empty_or_wrong_type():
    with pytest.raises(FilterExpressionError) as e:
        sql92.parse("a > 1\n  AND b >")
    assert (e.value.line, e.value.column) == (2, 10)          # just past the end of line 2
    for bad in ("", "   ", None, 5):
        with pytest.raises(FilterExpressionError):
            sql92.parse(bad)


def test_limits_are_named_and_enforced():
    ok = "a = 1" + " " * (MAX_SQL92_LENGTH - 5)
    sql92.parse(ok)
    with pytest.raises(FilterExpressionError, match="MAX_SQL92_LENGTH"):
        sql92.parse(ok + " ")
    nested = "NOT " * (MAX_SQL92_DEPTH - 2) + "a"                # depth = NOTs + boolcast + property
    sql92.parse(nested)
    with pytest.raises(FilterExpressionError, match="MAX_SQL92_DEPTH"):
        sql92.parse("NOT " + nested)
    names = [f"p{i}" for i in range(MAX_SQL92_PROPERTIES)]
    compile_sql92(" OR ".join(f"{n} = 'x'" for n in names))
    with pytest.raises(FilterExpressionError, match="MAX_SQL92_PROPERTIES"):
        sql92.parse(" OR ".join(f"{n} = 'x'" for n in names + ["extra"]))
    # deep parentheses parse without recursion trouble (the LALR parser builds bottom-up) and add
    # no depth; deep nesting of operators is refused, never a RecursionError
    assert repr(sql92.parse("(" * 1500 + "a = 1" + ")" * 1500)) == "(eq a, 1)"
    with pytest.raises(FilterExpressionError, match="MAX_SQL92_DEPTH"):
        sql92.parse("NOT (" * 600 + "a = 1" + ")" * 600)


# -- semantics: RocketMQ's, quirks included -------------------------------------------------------
@pytest.mark.parametrize("expr, props, want", [
    ("a > 5", {"a": "7"}, True),
    ("a > 5", {"a": "5"}, False),
    ("a > 5", {}, None),                                      # NULL, not FALSE
    ("a > 5", {"a": "5.5"}, "error"),                         # Integer.valueOf("5.5") throws
    ("a > 5.0", {"a": "5.5"}, True),                          # Double.valueOf
    ("a > 5.0", {"a": " 5.5 "}, True),                        # Double.valueOf trims
    ("a > 5", {"a": " 7"}, "error"),                          # Integer.valueOf does not
    ("a > 5", {"a": "+7"}, True),
    ("a > 5", {"a": "2147483648"}, "error"),                  # over int: the int literal decides
    ("a > 5L", {"a": "2147483648"}, "error"),                 # 5L fits an int: still Integer.valueOf
    ("a > 2147483647", {"a": "2147483648"}, "error"),
    ("a > 2147483648", {"a": "2147483649"}, True),            # a long literal: Long.valueOf
    ("a > b", {"a": "2", "b": "1.5"}, True),                  # two strings: both as doubles
    ("a > b", {"a": "2", "b": "x"}, "error"),
    ("a = 5", {"a": "5"}, True),
    ("a = 5", {"a": "abc"}, "error"),
    ("a = '5'", {"a": "5"}, True),
    ("a = '5'", {"a": "5.0"}, False),                          # strings compare as strings
    ("a = 5.0", {"a": "5"}, True),
    ("a = TRUE", {"a": "True"}, True),                         # Boolean.valueOf ignores case
    ("a = TRUE", {"a": "yes"}, False),
    ("TRUE = a", {"a": "true"}, "error"),                     # Java casts the Boolean to String
    ("a = 5 OR b = 1", {"a": "abc", "b": "1"}, "error"),      # the left side throws first
    ("b = 1 OR a = 5", {"a": "abc", "b": "1"}, True),         # short-circuit: never evaluated
    ("a > 5 AND b = 1", {"b": "2"}, False),                   # NULL AND FALSE
    ("a > 5 AND b = 1", {"b": "1"}, None),                    # NULL AND TRUE
    ("a > 5 OR b = 1", {"b": "1"}, True),
    ("a > 5 OR b = 1", {"b": "2"}, None),
    ("NOT (a > 5)", {}, None),
    ("a IS NULL", {}, True),
    ("a IS NULL", {"a": ""}, True),                           # an empty value is dropped on decode
    ("a IS NOT NULL", {"a": "x"}, True),
    ("a <> 'x'", {}, None),
    ("a <> 'x'", {"a": "y"}, True),
    ("a IN ('x', 'y')", {"a": "y"}, True),
    ("a IN ('x', 'y')", {}, None),
    ("a NOT IN ('x', 'y')", {}, None),
    ("a NOT IN ('x', 'y')", {"a": "z"}, True),
    ("a CONTAINS 'b'", {"a": "abc"}, True),
    ("a CONTAINS 'b'", {}, False),                            # FALSE, never NULL
    ("a NOT CONTAINS 'b'", {}, False),
    ("a CONTAINS ''", {"a": "abc"}, False),                   # an empty search is FALSE
    ("a NOT CONTAINS ''", {"a": "abc"}, False),
    ("a STARTSWITH 'ab'", {"a": "abc"}, True),
    ("a ENDSWITH 'bc'", {"a": "abc"}, True),
    ("a NOT ENDSWITH 'bc'", {"a": "abc"}, False),
    ("a ENDSWITH '\u00e9'", {"a": "\u00e9t\u00e9"}, True),
    ("a", {"a": "true"}, False),                              # a property is a string, never a boolean
    ("a", {}, None),
    ("-a > 1", {"a": "5"}, None),                              # negating a string is NULL
    ("a > -5", {"a": "-3"}, True),
    ("a BETWEEN 1 AND 3", {"a": "2"}, True),
    ("a BETWEEN 1 AND 3", {"a": "4"}, False),
    ("a BETWEEN 1.0 AND 3", {"a": " 2"}, "error"),            # >= 1.0 trims, <= 3 does not parse " 2"
    ("a NOT BETWEEN 1 AND 3", {"a": "4"}, True),
    ("a > 1.0", {"a": "NaN"}, True),                           # Double.compare: NaN above everything
    ("a = 0.1", {"a": "1e-1"}, True),
    ("a < 1.0", {"a": "-0.0"}, True),
    ("a > 1.0", {"a": "1.5f"}, True),                          # Java's type suffix
    ("a > 1.0", {"a": "0x10"}, "error"),                       # hex floats: the documented deviation
    ("(a > 5) = TRUE", {"a": "7"}, True),
    ("(a > 5) = 1", {"a": "7"}, False),                        # Boolean vs Integer: -1, not equal
    ("TRUE", {}, True),
    ("NULL", {}, None),
])
def test_semantics(expr, props, want):
    tree = sql92.parse(expr)
    assert reference(tree, props) == want
    assert native(compile_sql92(expr), props) == want
    assert sql92.matches(tree, props) is (want is True)
    assert compile_sql92(expr).matches(encode_properties(props)) is (want is True)


def test_properties_are_decoded_as_rocketmq_does():
    f = compile_sql92("a = 'x'")
    assert f.matches(b"a\x01y\x02a\x01x\x02")                  # the last value wins (HashMap.put)
    assert not f.matches(b"a\x01x\x02a\x01y\x02")
    assert not f.matches(b"ax\x02")                             # no separator: not a property
    assert f.matches(b"b\x01\x02a\x01x")                        # no trailing separator is fine
    assert not f.matches(b"")
    assert compile_sql92("a IS NULL").matches(b"a\x01\x02")     # an empty value is no value
    assert compile_sql92("aa = 'x'").matches(b"a\x01y\x02aa\x01x\x02")


def test_compile_is_cached_per_expression():
    assert compile_sql92("a > 1") is compile_sql92("a > 1")
    assert compile_sql92("a > 1") is not compile_sql92("a > 2")


# -- the native evaluator against the reference ---------------------------------------------------
def test_native_matches_reference_on_random_expressions_and_messages():
    """600 random expressions (the valid ones of more), 20 random messages each: 12,000 decisions."""
    rng = random.Random(1125)
    checked = 0
    while checked < 600:
        expr = random_expression(rng)
        try:
            tree = sql92.parse(expr)
        except FilterExpressionError:
            continue
        f = compile_sql92(expr)
        for _ in range(20):
            props = random_props(rng)
            assert native(f, props) == reference(tree, props), (expr, props)
        checked += 1


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32), props=st.dictionaries(st.sampled_from(["a", "b", "c"]),
                                                          st.one_of(st.sampled_from(VALUES),
                                                                    st.text(string.printable.strip(), max_size=8)),
                                                          max_size=3))
def test_native_matches_reference_property(seed, props):
    rng = random.Random(seed)
    expr = random_expression(rng)
    try:
        tree = sql92.parse(expr)
    except FilterExpressionError:
        return
    props = {k: v.replace("\x01", "").replace("\x02", "") for k, v in props.items()}
    assert native(compile_sql92(expr), props) == reference(tree, props), (expr, props)


# -- client side ----------------------------------------------------------------------------------
def test_message_selector_and_subscription_data():
    sel = MessageSelector.by_sql("a > 5")
    assert sel.expression_type == ExpressionType.SQL92 == "SQL92"
    sub = SubscriptionData.build("T", sel)
    assert sub.is_sql92 and sub.is_all and sub.matches("anything") and not sub.tags_set
    assert sub.to_wire()["expressionType"] == "SQL92" and sub.to_wire()["subString"] == "a > 5"
    f = build_pull_frame("g", MessageQueue("T", "b", 0), 0, 32, sub)
    assert f.fields["expressionType"] == "SQL92" and f.fields["subscription"] == "a > 5"
    tag = SubscriptionData.build("T", MessageSelector.by_tag("x || y"))
    assert tag.expression_type == "TAG" and tag.tags_set == {"x", "y"}
    assert build_pull_frame("g", MessageQueue("T", "b", 0), 0, 32, "x").fields["expressionType"] == "TAG"
    with pytest.raises(FilterExpressionError, match="column 5"):
        MessageSelector.by_sql("a > ")
    with pytest.raises(FilterExpressionError, match="column 5"):
        SubscriptionData.build("T", MessageSelector(ExpressionType.SQL92, "a > "))
    assert ExpressionType.is_tag_type(None) and ExpressionType.is_tag_type("") and ExpressionType.is_tag_type("TAG")
    with pytest.raises(FilterExpressionError, match="unknown expressionType"):
        ExpressionType.check("JAVA")


# -- the store's filtered read ----------------------------------------------------------------------
def test_store_skips_messages_the_filter_rejects(open_store):
    s = open_store()
    for i in range(120):
        props = {"n": str(i)} if i % 5 else {}
        s.put_message("S", b"m%d" % i, 0, tags="t", properties=props)
    s.dispatch()
    f = compile_sql92("n > 100 OR n = 7")
    out, off, pulls = [], 0, 0
    while True:
        res = s.get_messages("g", "S", 0, off, 2, None, sql_filter=f)
        pulls += 1
        if res.status not in (GetMessageStatus.FOUND, GetMessageStatus.NO_MATCHED_MESSAGE):
            break
        assert res.message_count <= 2                        # max_msgs counts matches only
        out.extend(m.body for m in res.messages())
        assert res.next_begin_offset > off
        off = res.next_begin_offset
    assert out == [b"m7"] + [b"m%d" % i for i in range(101, 120) if i % 5]
    # a read with no match: NO_MATCHED_MESSAGE, and the offset moves past what was examined (one
    # ConsumeQueue read: up to the end of its file), until the first match
    off, seen = 8, []
    while True:
        res = s.get_messages("g", "S", 0, off, 32, None, sql_filter=f)
        seen.append(res.status)
        if res.status is GetMessageStatus.FOUND:
            break
        assert res.status is GetMessageStatus.NO_MATCHED_MESSAGE and res.next_begin_offset > off
        off = res.next_begin_offset
    assert res.messages()[0].body == b"m101" and seen[0] is GetMessageStatus.NO_MATCHED_MESSAGE
    res = s.get_messages("g", "S", 0, 100, 32, None, sql_filter=compile_sql92("n = 'none'"))
    assert res.status is GetMessageStatus.NO_MATCHED_MESSAGE and res.next_begin_offset == 120


def test_parse_is_cached_and_the_native_program_is_checked():
    from rmq._core.sqlfilter import MAX_PROPERTIES, SqlFilter
    assert sql92.parse("a > 1 AND b = 'x'") is sql92.parse("a > 1 AND b = 'x'")
    assert MAX_PROPERTIES == MAX_SQL92_PROPERTIES
    prop = ("prop", 0, 0, "", False, 0, 0.0, b"", [])
    with pytest.raises(ValueError, match="over the limit"):
        SqlFilter("x", [prop], 0, [b"p"] * (MAX_PROPERTIES + 1))
    with pytest.raises(ValueError, match="property index"):
        SqlFilter("x", [("prop", 3, 0, "", False, 0, 0.0, b"", [])], 0, [b"p"])
    with pytest.raises(ValueError, match="child index"):
        SqlFilter("x", [("not", 5, 0, "", False, 0, 0.0, b"", [])], 0, [])
    with pytest.raises(ValueError, match="IN needs a property"):
        SqlFilter("x", [("const", 0, 0, "str", False, 0, 0.0, b"a", []),
                        ("in", 0, 0, "", False, 0, 0.0, b"", [b"a"])], 1, [])
    with pytest.raises(ValueError, match="root out of range"):
        SqlFilter("x", [prop], 4, [b"p"])
