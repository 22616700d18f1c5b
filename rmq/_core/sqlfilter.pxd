# cython: language_level=3
from libc.stdint cimport int32_t, int64_t


cdef struct SqlNode:
    # One node of a compiled SQL92 expression (see sqlfilter.pyx for the op codes).
    int op
    int a             # first child, or the property index of OP_PROP
    int b             # second child
    int kind          # OP_CONST: value kind; OP_CMP: comparison
    int negated       # NOT IN / NOT CONTAINS / NOT STARTSWITH / NOT ENDSWITH
    int64_t l
    double d
    int32_t s_off     # OP_CONST str / search string: bytes in the pool
    int32_t s_len
    int32_t list_off  # OP_IN: first entry of the string table
    int32_t list_n


cdef enum:
    # Most distinct property names one expression may name (rmq.filter.sql92.MAX_SQL92_PROPERTIES).
    MAX_PROPS = 64


cdef struct Val:
    int kind
    int64_t l            # K_BOOL (0/1), K_INT, K_LONG
    double d             # K_DOUBLE
    const unsigned char* s
    int32_t n


cdef struct Ctx:
    # The values of the named properties in the message at hand (NULL: absent).
    const unsigned char* vptr[MAX_PROPS]
    int32_t vlen[MAX_PROPS]


cdef class SqlFilter:
    cdef SqlNode* nodes
    cdef int n_nodes
    cdef int root
    cdef bytes pool
    cdef const unsigned char* pool_p
    cdef int32_t* str_off
    cdef int32_t* str_len
    cdef int n_strs
    cdef int n_props
    cdef int32_t* name_off
    cdef int32_t* name_len
    cdef readonly str expression

    cdef void resolve(self, const unsigned char* props, int32_t props_len, Ctx* ctx) noexcept nogil
    cdef int ev(self, int idx, Ctx* ctx, Val* out) noexcept nogil
    cdef bint match(self, const unsigned char* props, int32_t props_len) noexcept nogil
