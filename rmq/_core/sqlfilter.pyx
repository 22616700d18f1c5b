# cython: language_level=3
"""The broker's SQL92 filter evaluator: a compiled expression run over raw properties strings.

The expression is parsed and checked once (:func:`rmq.filter.sql92.parse`, RocketMQ's grammar and
rules) and flattened into an array of :c:type:`SqlNode`; :meth:`SqlFilter.match` then decides one
message from its stored properties bytes (``name \\x01 value \\x02 ...``, SPEC.md §1.6) without
the GIL, without decoding the properties into objects, and without allocating.  The semantics are
those of :mod:`rmq.filter.sql92`'s reference evaluator (RocketMQ's ``filter`` module), which the
tests hold this one to.
"""
from cpython.bytes cimport PyBytes_AS_STRING
from libc.math cimport INFINITY, NAN, signbit
from libc.stdint cimport int32_t, int64_t, uint64_t
from libc.stdlib cimport free, malloc, strtod
from libc.string cimport memcmp, memcpy

from rmq._core.layout cimport NAME_VALUE_SEPARATOR, PROPERTY_SEPARATOR

# node ops
cdef enum:
    OP_CONST = 0
    OP_PROP = 1
    OP_NEG = 2
    OP_BOOLCAST = 3
    OP_NOT = 4
    OP_AND = 5
    OP_OR = 6
    OP_EQ = 7
    OP_CMP = 8
    OP_IN = 9
    OP_CONTAINS = 10
    OP_STARTSWITH = 11
    OP_ENDSWITH = 12

# value kinds
cdef enum:
    K_NULL = 0
    K_BOOL = 1
    K_INT = 2
    K_LONG = 3
    K_DOUBLE = 4
    K_STR = 5

# comparisons
cdef enum:
    C_GT = 0
    C_GE = 1
    C_LT = 2
    C_LE = 3

#: Most distinct property names an expression may name (rmq.filter.sql92.MAX_SQL92_PROPERTIES).
MAX_PROPERTIES = MAX_PROPS

_OPS = {"const": OP_CONST, "prop": OP_PROP, "neg": OP_NEG, "boolcast": OP_BOOLCAST, "not": OP_NOT,
        "and": OP_AND, "or": OP_OR, "eq": OP_EQ, "cmp": OP_CMP, "in": OP_IN, "contains": OP_CONTAINS,
        "startswith": OP_STARTSWITH, "endswith": OP_ENDSWITH}
_KINDS = {"null": K_NULL, "bool": K_BOOL, "int": K_INT, "long": K_LONG, "double": K_DOUBLE, "str": K_STR}
_CMPS = {">": C_GT, ">=": C_GE, "<": C_LT, "<=": C_LE}


# -- Java's parsing of a property string ---------------------------------------------------------
cdef inline bint is_digit(unsigned char c) noexcept nogil:
    return 48 <= c <= 57


cdef int parse_java_long(const unsigned char* s, int32_t n, bint as_int, int64_t* out) noexcept nogil:
    """Integer.valueOf / Long.valueOf: optional sign, ASCII digits, no blanks, range checked."""
    cdef int32_t k = 0
    cdef bint neg = False
    cdef uint64_t acc = 0
    cdef uint64_t limit
    if n <= 0:
        return -1
    if s[0] == 43 or s[0] == 45:          # '+' '-'
        neg = s[0] == 45
        k = 1
    if k == n:
        return -1
    if as_int:
        limit = (<uint64_t>1 << 31) if neg else (<uint64_t>1 << 31) - 1
    else:
        limit = (<uint64_t>1 << 63) if neg else (<uint64_t>1 << 63) - 1
    while k < n:
        if not is_digit(s[k]):
            return -1
        acc = acc * 10 + (s[k] - 48)
        if acc > limit:
            return -1
        k += 1
    out[0] = -<int64_t>acc if neg else <int64_t>acc
    return 0


cdef int parse_java_double(const unsigned char* s, int32_t n, double* out) noexcept nogil:
    """Double.valueOf for decimal text: blanks (<= ' ') trimmed, sign, NaN, Infinity, digits with
    an optional point and exponent, an optional f/F/d/D suffix.  Hex floats are not read."""
    cdef int32_t i = 0, j = n, k, p, e, nd = 0, nx = 0
    cdef bint neg = False
    cdef char small[64]
    cdef char* buf
    while i < j and s[i] <= 32:
        i += 1
    while j > i and s[j - 1] <= 32:
        j -= 1
    if i == j:
        return -1
    k = i
    if s[k] == 43 or s[k] == 45:
        neg = s[k] == 45
        k += 1
    if j - k == 3 and memcmp(s + k, b"NaN", 3) == 0:
        out[0] = NAN
        return 0
    if j - k == 8 and memcmp(s + k, b"Infinity", 8) == 0:
        out[0] = -INFINITY if neg else INFINITY
        return 0
    e = j
    if e > k and (s[e - 1] == 102 or s[e - 1] == 70 or s[e - 1] == 100 or s[e - 1] == 68):   # f F d D
        e -= 1
    p = k
    while p < e and is_digit(s[p]):
        p += 1
        nd += 1
    if p < e and s[p] == 46:            # '.'
        p += 1
        while p < e and is_digit(s[p]):
            p += 1
            nd += 1
    if nd == 0:
        return -1
    if p < e and (s[p] == 101 or s[p] == 69):    # e E
        p += 1
        if p < e and (s[p] == 43 or s[p] == 45):
            p += 1
        while p < e and is_digit(s[p]):
            p += 1
            nx += 1
        if nx == 0:
            return -1
    if p != e:
        return -1
    if e - i < 64:
        buf = small
    else:
        buf = <char*>malloc(e - i + 1)
        if buf == NULL:
            return -1
    memcpy(buf, s + i, e - i)
    buf[e - i] = 0
    out[0] = strtod(buf, NULL)
    if buf != small:
        free(buf)
    return 0


cdef inline bint is_java_true(const unsigned char* s, int32_t n) noexcept nogil:
    """Boolean.valueOf: "true", any case."""
    return n == 4 and (s[0] | 32) == 116 and (s[1] | 32) == 114 and (s[2] | 32) == 117 and (s[3] | 32) == 101


cdef int convert_str(Val* v, int kind) noexcept nogil:
    """A K_STR value as ``kind`` parses it (ComparisonExpression's conversion); -1 when it does not."""
    cdef int64_t l
    cdef double d
    if kind == K_BOOL:
        v.l = is_java_true(v.s, v.n)
        v.kind = K_BOOL
        return 0
    if kind == K_INT or kind == K_LONG:
        if parse_java_long(v.s, v.n, kind == K_INT, &l) != 0:
            return -1
        v.l = l
        v.kind = kind
        return 0
    if kind == K_DOUBLE:
        if parse_java_double(v.s, v.n, &d) != 0:
            return -1
        v.d = d
        v.kind = K_DOUBLE
        return 0
    return -1


cdef inline int dcmp(double a, double b) noexcept nogil:
    """java.lang.Double.compare."""
    cdef int an, bn, sa, sb
    if a < b:
        return -1
    if a > b:
        return 1
    an = a != a
    bn = b != b
    if an or bn:
        return an - bn
    if a == 0.0 and b == 0.0:
        sa = signbit(a) != 0
        sb = signbit(b) != 0
        return sb - sa
    return 0


cdef int compare(Val lv, Val rv, int* res) noexcept nogil:
    """ComparisonExpression.__compare (convertStringExpressions on); -1 where Java throws."""
    if lv.kind != rv.kind:
        if lv.kind == K_BOOL:
            if rv.kind == K_STR:
                return -1                  # Java casts the Boolean to String: ClassCastException
            res[0] = -1
            return 0
        elif lv.kind == K_INT:
            if rv.kind == K_LONG:
                lv.kind = K_LONG
            elif rv.kind == K_DOUBLE:
                lv.d = <double>lv.l
                lv.kind = K_DOUBLE
            elif rv.kind == K_STR:
                if convert_str(&rv, K_INT) != 0:
                    return -1
            else:
                res[0] = -1
                return 0
        elif lv.kind == K_LONG:
            if rv.kind == K_INT:
                rv.kind = K_LONG
            elif rv.kind == K_DOUBLE:
                lv.d = <double>lv.l
                lv.kind = K_DOUBLE
            elif rv.kind == K_STR:
                if convert_str(&rv, K_LONG) != 0:
                    return -1
            else:
                res[0] = -1
                return 0
        elif lv.kind == K_DOUBLE:
            if rv.kind == K_INT or rv.kind == K_LONG:
                rv.d = <double>rv.l
                rv.kind = K_DOUBLE
            elif rv.kind == K_STR:
                if convert_str(&rv, K_DOUBLE) != 0:
                    return -1
            else:
                res[0] = -1
                return 0
        elif lv.kind == K_STR:
            if rv.kind == K_BOOL or rv.kind == K_INT or rv.kind == K_LONG or rv.kind == K_DOUBLE:
                if convert_str(&lv, rv.kind) != 0:
                    return -1
            else:
                res[0] = -1
                return 0
        else:
            res[0] = -1
            return 0
    if lv.kind == K_DOUBLE:
        res[0] = dcmp(lv.d, rv.d)
    elif lv.kind == K_STR:
        res[0] = 0 if (lv.n == rv.n and memcmp(lv.s, rv.s, lv.n) == 0) else 1   # only equality is asked
    else:
        res[0] = (lv.l > rv.l) - (lv.l < rv.l)
    return 0


cdef inline bint same_value(Val* a, Val* b) noexcept nogil:
    """Object.equals of two non-null values of one kind."""
    if a.kind != b.kind:
        return False
    if a.kind == K_STR:
        return a.n == b.n and memcmp(a.s, b.s, a.n) == 0
    if a.kind == K_DOUBLE:
        return dcmp(a.d, b.d) == 0
    return a.l == b.l


cdef inline void set_bool(Val* out, bint v) noexcept nogil:
    out.kind = K_BOOL
    out.l = v


cdef bint find_bytes(const unsigned char* hay, int32_t hn, const unsigned char* needle, int32_t nn) noexcept nogil:
    cdef int32_t i
    if nn > hn:
        return False
    for i in range(hn - nn + 1):
        if hay[i] == needle[0] and memcmp(hay + i, needle, nn) == 0:
            return True
    return False


cdef class SqlFilter:
    """A compiled SQL92 expression (build with :func:`rmq.filter.compile_sql92`, not directly).

    Parameters
    ----------
    expression : str
        The source text (for messages and repr only).
    nodes : list of tuple
        ``(op, a, b, kind, negated, long_value, double_value, str_bytes, in_list)`` per node,
        children before parents; ``op`` / ``kind`` are the names of :mod:`rmq.filter.sql92`.
    root : int
        Index of the root node.
    names : list of bytes
        Property names; ``OP_PROP`` nodes refer to them by index.

    Raises
    ------
    ValueError
        More than MAX_PROPERTIES names, an unknown op or kind, a child index out of range.
    """

    def __cinit__(self, str expression, list nodes, int root, list names):
        cdef Py_ssize_t i
        cdef SqlNode* nd
        self.nodes = NULL
        self.str_off = self.str_len = self.name_off = self.name_len = NULL
        self.expression = expression
        if len(names) > MAX_PROPS:
            raise ValueError(f"{len(names)} property names, over the limit of {MAX_PROPS}")
        if not nodes or not 0 <= root < len(nodes):
            raise ValueError("empty program or root out of range")
        pool = bytearray()
        strs = []
        self.n_nodes = len(nodes)
        self.root = root
        self.nodes = <SqlNode*>malloc(self.n_nodes * sizeof(SqlNode))
        self.n_props = len(names)
        self.name_off = <int32_t*>malloc((self.n_props + 1) * sizeof(int32_t))
        self.name_len = <int32_t*>malloc((self.n_props + 1) * sizeof(int32_t))
        if self.nodes == NULL or self.name_off == NULL or self.name_len == NULL:
            raise MemoryError()
        for i, nm in enumerate(names):
            self.name_off[i] = len(pool)
            self.name_len[i] = len(nm)
            pool += nm
        for i, (op, a, b, kind, negated, lval, dval, sval, in_list) in enumerate(nodes):
            nd = &self.nodes[i]
            nd.op = _OPS[op]
            nd.a, nd.b = a, b
            nd.kind = _CMPS[kind] if op == "cmp" else _KINDS.get(kind, K_NULL)
            nd.negated = bool(negated)
            nd.l = lval
            nd.d = dval
            nd.s_off = len(pool)
            nd.s_len = len(sval)
            pool += sval
            nd.list_off = len(strs)
            nd.list_n = len(in_list)
            strs.extend(in_list)
            if op == "prop":
                if not 0 <= a < self.n_props:
                    raise ValueError(f"node {i}: property index {a} out of range")
            elif op not in ("const", "in") and not (0 <= a < i and (op not in ("and", "or", "eq", "cmp")
                                                                     or 0 <= b < i)):
                raise ValueError(f"node {i}: child index out of range")
            elif op == "in" and not (0 <= a < i and nodes[a][0] == "prop"):
                raise ValueError(f"node {i}: IN needs a property child")
        self.n_strs = len(strs)
        self.str_off = <int32_t*>malloc((self.n_strs + 1) * sizeof(int32_t))
        self.str_len = <int32_t*>malloc((self.n_strs + 1) * sizeof(int32_t))
        if self.str_off == NULL or self.str_len == NULL:
            raise MemoryError()
        for i, sv in enumerate(strs):
            self.str_off[i] = len(pool)
            self.str_len[i] = len(sv)
            pool += sv
        self.pool = bytes(pool)
        self.pool_p = <const unsigned char*>PyBytes_AS_STRING(self.pool)

    def __dealloc__(self):
        free(self.nodes)
        free(self.str_off)
        free(self.str_len)
        free(self.name_off)
        free(self.name_len)

    def __repr__(self):
        return f"SqlFilter({self.expression!r})"

    cdef void resolve(self, const unsigned char* props, int32_t props_len, Ctx* ctx) noexcept nogil:
        """Each named property's value in ``props`` (the last one wins, as Java's HashMap.put;
        a segment without a name or a value is skipped, as MessageDecoder.string2messageProperties)."""
        cdef int32_t start = 0, end, sep, k, nl
        cdef int i
        for i in range(self.n_props):
            ctx.vptr[i] = NULL
            ctx.vlen[i] = 0
        while start < props_len:
            end = start
            sep = -1
            while end < props_len and props[end] != PROPERTY_SEPARATOR:
                if sep < 0 and props[end] == NAME_VALUE_SEPARATOR:
                    sep = end
                end += 1
            if sep > start and sep < end - 1:
                nl = sep - start
                for i in range(self.n_props):
                    if self.name_len[i] == nl and memcmp(props + start, self.pool_p + self.name_off[i], nl) == 0:
                        ctx.vptr[i] = props + sep + 1
                        ctx.vlen[i] = end - sep - 1
            start = end + 1

    cdef int ev(self, int idx, Ctx* ctx, Val* out) noexcept nogil:
        """Evaluate node ``idx``: 0 with ``out`` set (K_NULL for NULL), -1 where Java throws."""
        cdef SqlNode* nd = &self.nodes[idx]
        cdef Val lv, rv
        cdef int c, i, op = nd.op
        cdef bint hit
        cdef const unsigned char* q
        if op == OP_CONST:
            out.kind = nd.kind
            out.l = nd.l
            out.d = nd.d
            out.s = self.pool_p + nd.s_off
            out.n = nd.s_len
            return 0
        if op == OP_PROP:
            if ctx.vptr[nd.a] == NULL:
                out.kind = K_NULL
            else:
                out.kind = K_STR
                out.s = ctx.vptr[nd.a]
                out.n = ctx.vlen[nd.a]
            return 0
        if op == OP_AND or op == OP_OR:
            if self.ev(nd.a, ctx, &lv) != 0:
                return -1
            if lv.kind == K_BOOL and lv.l == (op == OP_OR):
                set_bool(out, op == OP_OR)
                return 0
            if self.ev(nd.b, ctx, &rv) != 0:
                return -1
            if rv.kind == K_BOOL and rv.l == (op == OP_OR):
                set_bool(out, op == OP_OR)
                return 0
            if lv.kind == K_NULL or rv.kind == K_NULL:
                out.kind = K_NULL
            else:
                set_bool(out, op == OP_AND)
            return 0
        if op == OP_NOT:
            if self.ev(nd.a, ctx, &lv) != 0:
                return -1
            if lv.kind == K_NULL:
                out.kind = K_NULL
            else:
                set_bool(out, not lv.l)
            return 0
        if op == OP_BOOLCAST:
            if self.ev(nd.a, ctx, &lv) != 0:
                return -1
            if lv.kind == K_NULL:
                out.kind = K_NULL
            else:
                set_bool(out, lv.kind == K_BOOL and lv.l != 0)
            return 0
        if op == OP_EQ:
            if self.ev(nd.a, ctx, &lv) != 0 or self.ev(nd.b, ctx, &rv) != 0:
                return -1
            if (lv.kind == K_NULL) != (rv.kind == K_NULL):
                if lv.kind == K_NULL:
                    out.kind = K_NULL
                else:
                    set_bool(out, False)
                return 0
            if lv.kind == K_NULL or same_value(&lv, &rv):
                set_bool(out, True)
                return 0
            if compare(lv, rv, &c) != 0:
                return -1
            set_bool(out, c == 0)
            return 0
        if op == OP_CMP:
            if self.ev(nd.a, ctx, &lv) != 0:
                return -1
            if lv.kind == K_NULL:
                out.kind = K_NULL
                return 0
            if self.ev(nd.b, ctx, &rv) != 0:
                return -1
            if rv.kind == K_NULL:
                out.kind = K_NULL
                return 0
            if lv.kind == K_STR and rv.kind == K_STR:
                if convert_str(&lv, K_DOUBLE) != 0 or convert_str(&rv, K_DOUBLE) != 0:
                    return -1
                c = dcmp(lv.d, rv.d)
            elif compare(lv, rv, &c) != 0:
                return -1
            if nd.kind == C_GT:
                set_bool(out, c > 0)
            elif nd.kind == C_GE:
                set_bool(out, c >= 0)
            elif nd.kind == C_LT:
                set_bool(out, c < 0)
            else:
                set_bool(out, c <= 0)
            return 0
        if op == OP_IN:
            if self.ev(nd.a, ctx, &lv) != 0:
                return -1
            if lv.kind != K_STR:
                out.kind = K_NULL
                return 0
            hit = False
            for i in range(nd.list_off, nd.list_off + nd.list_n):
                if self.str_len[i] == lv.n and memcmp(self.pool_p + self.str_off[i], lv.s, lv.n) == 0:
                    hit = True
                    break
            set_bool(out, hit != nd.negated)
            return 0
        if op == OP_CONTAINS or op == OP_STARTSWITH or op == OP_ENDSWITH:
            if nd.s_len == 0:
                set_bool(out, False)
                return 0
            if self.ev(nd.a, ctx, &lv) != 0:
                return -1
            if lv.kind != K_STR:
                set_bool(out, False)
                return 0
            q = self.pool_p + nd.s_off
            if op == OP_CONTAINS:
                hit = find_bytes(lv.s, lv.n, q, nd.s_len)
            elif op == OP_STARTSWITH:
                hit = lv.n >= nd.s_len and memcmp(lv.s, q, nd.s_len) == 0
            else:
                hit = lv.n >= nd.s_len and memcmp(lv.s + lv.n - nd.s_len, q, nd.s_len) == 0
            set_bool(out, hit != nd.negated)
            return 0
        if op == OP_NEG:
            if self.ev(nd.a, ctx, &lv) != 0:
                return -1
            out.kind = lv.kind
            if lv.kind == K_INT or lv.kind == K_LONG:
                out.l = -lv.l
            elif lv.kind == K_DOUBLE:
                out.d = -lv.d
            else:
                out.kind = K_NULL
            return 0
        return -1

    cdef bint match(self, const unsigned char* props, int32_t props_len) noexcept nogil:
        """Whether a message with this properties string passes: TRUE only (NULL, FALSE and an
        evaluation error reject it, as ExpressionMessageFilter.isMatchedByCommitLog)."""
        cdef Ctx ctx
        cdef Val v
        self.resolve(props, props_len, &ctx)
        if self.ev(self.root, &ctx, &v) != 0:
            return False
        return v.kind == K_BOOL and v.l != 0

    def matches(self, const unsigned char[::1] props):
        """:meth:`match` for one properties string (bytes, the stored encoding)."""
        if props.shape[0] == 0:
            return self.match(<const unsigned char*>b"", 0)
        return self.match(&props[0], <int32_t>props.shape[0])

    def evaluate(self, const unsigned char[::1] props):
        """TRUE / FALSE / None (NULL) for one properties string; raises ValueError where the
        expression's evaluation fails (RocketMQ's evaluation throws)."""
        cdef Ctx ctx
        cdef Val v
        cdef int r
        if props.shape[0] == 0:
            self.resolve(<const unsigned char*>b"", 0, &ctx)
        else:
            self.resolve(&props[0], <int32_t>props.shape[0], &ctx)
        r = self.ev(self.root, &ctx, &v)
        if r != 0:
            raise ValueError(f"evaluation of {self.expression!r} fails for these properties")
        if v.kind == K_NULL:
            return None
        return v.l != 0
