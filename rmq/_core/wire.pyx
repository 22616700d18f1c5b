# cython: language_level=3, embedsignature=True
"""The frame header's msgpack in C: what every request and response pays twice (decode, encode).

``rmq.protocol.decode`` / ``encode`` spend most of a small frame's time around msgpack rather than
in it: ``msgpack.unpackb`` parses seven keyword limits per call, a ``zmq.Frame`` part is copied to
bytes first, and the header's checks run as Python code (4.1 us a POP_MESSAGE answer on this 2-core
VM, 2.0-2.6 us to encode one).  This module does the common case in one pass over the parts'
buffers:

* :func:`decode_header` -- the header part's msgpack (the subset a header holds: nil, bool, ints,
  floats, str, bin, arrays, maps with str / bytes keys; no ext types) read under
  ``rmq.protocol``'s limits, and the header's own checks (a map; int ``code`` / ``opaque`` /
  ``flag``, not bool; str ``remark``; a ``fields`` map of at most MAX_FIELDS entries).
* :func:`encode_header` -- ``{"code", "opaque", "flag", "remark", "fields"}`` as msgpack, byte for
  byte what ``msgpack.Packer(use_bin_type=True)`` writes for it.

Both answer None whenever the input is not that common case (a malformed or oversized header, an
ext type, a value type they do not write, ...): ``rmq.protocol`` then takes its msgpack path, which
raises the error a peer gets (so errors, and their wording, have one source).

Layout: the msgpack spec (https://github.com/msgpack/msgpack/blob/master/spec.md).
"""
cimport cython
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE
from cpython.dict cimport PyDict_Next, PyDict_SetItem
from cpython.float cimport PyFloat_AS_DOUBLE, PyFloat_FromDouble
from cpython.list cimport PyList_New, PyList_SET_ITEM
from cpython.long cimport PyLong_FromLongLong, PyLong_FromUnsignedLongLong
from cpython.object cimport PyObject
from cpython.ref cimport Py_INCREF, Py_XDECREF
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memcmp, memcpy

cdef extern from "Python.h":
    const char* PyUnicode_AsUTF8AndSize(object o, Py_ssize_t* size) except NULL
    object PyLong_FromLong(long v)
    long long PyLong_AsLongLongAndOverflow(object o, int* overflow) except? -1
    unsigned long long PyLong_AsUnsignedLongLong(object o) except? -1

cdef enum:
    MAX_DEPTH = 32                   # nesting a header never needs (deeper: the msgpack path)
    STR_CACHE_SLOTS = 512            # decoded short strs kept (direct-mapped by an FNV-1a hash)
    STR_CACHE_MAX_LEN = 32           # bytes of the longest str kept

cdef struct _Cached:
    PyObject* s                      # a str (a reference held), or NULL
    Py_ssize_t n
    char data[STR_CACHE_MAX_LEN]

# the decoder's str cache: read and written with the GIL held (decode_header never releases it)
cdef _Cached _str_cache[STR_CACHE_SLOTS]


cdef class _Limits:
    cdef Py_ssize_t max_str, max_bin, max_array, max_map


cdef _Limits _limits = _Limits()
_limits.max_str = _limits.max_bin = 64 * 1024
_limits.max_array = 4096
_limits.max_map = 264


def set_limits(Py_ssize_t max_str_len, Py_ssize_t max_bin_len, Py_ssize_t max_array_len, Py_ssize_t max_map_len):
    """The decoder's msgpack limits (``rmq.protocol.UNPACK_LIMITS``; set once, at import)."""
    _limits.max_str = max_str_len
    _limits.max_bin = max_bin_len
    _limits.max_array = max_array_len
    _limits.max_map = max_map_len


# -- decoding -------------------------------------------------------------------------------------
class _NotCommon(Exception):
    """Internal: the header is not the common case (the caller returns None)."""


cdef inline uint16_t _be16(const uint8_t* p) noexcept nogil:
    return (<uint16_t>p[0] << 8) | p[1]


cdef inline uint32_t _be32(const uint8_t* p) noexcept nogil:
    return (<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | p[3]


cdef inline uint64_t _be64(const uint8_t* p) noexcept nogil:
    return (<uint64_t>_be32(p) << 32) | _be32(p + 4)


@cython.final
cdef class _Reader:
    cdef const uint8_t* p
    cdef Py_ssize_t n, i

    cdef inline const uint8_t* take(self, Py_ssize_t k) except NULL:
        if k < 0 or self.n - self.i < k:
            raise _NotCommon()
        cdef const uint8_t* at = self.p + self.i
        self.i += k
        return at

    cdef object str_(self, Py_ssize_t k):
        if k > _limits.max_str:
            raise _NotCommon()
        cdef const uint8_t* at = self.take(k)
        cdef uint32_t h
        cdef Py_ssize_t j
        cdef _Cached* c = NULL
        if k <= STR_CACHE_MAX_LEN:       # names, groups, topics: the same few strs frame after frame
            h = 2166136261u
            for j in range(k):
                h = (h ^ at[j]) * 16777619u
            c = &_str_cache[h & (STR_CACHE_SLOTS - 1)]
            if c.s != NULL and c.n == k and memcmp(c.data, at, k) == 0:
                return <object>c.s
        try:
            v = PyUnicode_DecodeUTF8(<const char*>at, k, NULL)
        except UnicodeDecodeError:
            raise _NotCommon() from None
        if c != NULL:
            Py_XDECREF(c.s)
            Py_INCREF(v)
            c.s = <PyObject*>v
            c.n = k
            memcpy(c.data, at, k)
        return v

    cdef object bin_(self, Py_ssize_t k):
        if k > _limits.max_bin:
            raise _NotCommon()
        cdef const uint8_t* at = self.take(k)
        return PyBytes_FromStringAndSize(<const char*>at, k)

    cdef object array(self, Py_ssize_t k, int depth):
        if k > _limits.max_array:
            raise _NotCommon()
        cdef list out = PyList_New(k)
        cdef Py_ssize_t j
        for j in range(k):
            v = self.value(depth + 1)
            Py_INCREF(v)
            PyList_SET_ITEM(out, j, v)
        return out

    cdef object map_(self, Py_ssize_t k, int depth):
        if k > _limits.max_map:
            raise _NotCommon()
        cdef dict out = {}
        cdef Py_ssize_t j
        for j in range(k):
            key = self.value(depth + 1)
            if type(key) is not str and type(key) is not bytes:     # strict_map_key
                raise _NotCommon()
            PyDict_SetItem(out, key, self.value(depth + 1))
        return out

    cdef object value(self, int depth):
        if depth > MAX_DEPTH:
            raise _NotCommon()
        cdef uint8_t b = self.take(1)[0]
        cdef const uint8_t* q
        cdef uint32_t u32
        cdef uint64_t u64
        cdef float f
        cdef double d
        if b <= 0x7f:
            return PyLong_FromLong(b)
        if b >= 0xe0:
            return PyLong_FromLong(<int8_t>b)
        if 0xa0 <= b <= 0xbf:
            return self.str_(b & 0x1f)
        if 0x80 <= b <= 0x8f:
            return self.map_(b & 0x0f, depth)
        if 0x90 <= b <= 0x9f:
            return self.array(b & 0x0f, depth)
        if b == 0xc0:
            return None
        if b == 0xc2:
            return False
        if b == 0xc3:
            return True
        if b == 0xcc:
            return PyLong_FromLong(self.take(1)[0])
        if b == 0xcd:
            return PyLong_FromLong(_be16(self.take(2)))
        if b == 0xce:
            return PyLong_FromUnsignedLongLong(_be32(self.take(4)))
        if b == 0xcf:
            return PyLong_FromUnsignedLongLong(_be64(self.take(8)))
        if b == 0xd0:
            return PyLong_FromLong(<int8_t>self.take(1)[0])
        if b == 0xd1:
            return PyLong_FromLong(<int16_t>_be16(self.take(2)))
        if b == 0xd2:
            return PyLong_FromLong(<int32_t>_be32(self.take(4)))
        if b == 0xd3:
            return PyLong_FromLongLong(<int64_t>_be64(self.take(8)))
        if b == 0xca:
            u32 = _be32(self.take(4))
            memcpy(&f, &u32, 4)
            return PyFloat_FromDouble(f)
        if b == 0xcb:
            q = self.take(8)
            u64 = _be64(q)
            memcpy(&d, &u64, 8)
            return PyFloat_FromDouble(d)
        if b == 0xd9:
            return self.str_(self.take(1)[0])
        if b == 0xda:
            return self.str_(_be16(self.take(2)))
        if b == 0xdb:
            return self.str_(_be32(self.take(4)))
        if b == 0xc4:
            return self.bin_(self.take(1)[0])
        if b == 0xc5:
            return self.bin_(_be16(self.take(2)))
        if b == 0xc6:
            return self.bin_(_be32(self.take(4)))
        if b == 0xdc:
            return self.array(_be16(self.take(2)), depth)
        if b == 0xdd:
            return self.array(_be32(self.take(4)), depth)
        if b == 0xde:
            return self.map_(_be16(self.take(2)), depth)
        if b == 0xdf:
            return self.map_(_be32(self.take(4)), depth)
        raise _NotCommon()               # 0xc1 (never used), ext types


cdef inline bint _is_int(v):
    return type(v) is int or (isinstance(v, int) and not isinstance(v, bool))


def decode_header(part, Py_ssize_t max_header_size, Py_ssize_t max_fields):
    """``(code, opaque, flag, remark, fields)`` of a header part (bytes or any buffer, a
    ``zmq.Frame`` read in place), or None when it is not the common case (see the module
    docstring; ``rmq.protocol.decode`` then raises the error)."""
    cdef Py_buffer view
    PyObject_GetBuffer(part, &view, PyBUF_SIMPLE)
    cdef _Reader r = _Reader.__new__(_Reader)
    try:
        if view.len > max_header_size:
            return None
        r.p = <const uint8_t*>view.buf
        r.n = view.len
        r.i = 0
        try:
            header = r.value(0)
        except _NotCommon:
            return None
        if r.i != r.n or type(header) is not dict:           # trailing bytes, not a map
            return None
    finally:
        PyBuffer_Release(&view)
    h = <dict>header
    code = h.get("code")
    opaque = h.get("opaque", 0)
    flag = h.get("flag", 0)
    remark = h.get("remark", "")
    fields = h["fields"] if "fields" in h else {}
    if not (_is_int(code) and _is_int(opaque) and _is_int(flag)) or not isinstance(remark, str) \
            or type(fields) is not dict or len(<dict>fields) > max_fields:
        return None
    return code, opaque, flag, remark, fields


def magic_is(part, bytes magic):
    """Whether ``part`` (bytes or any buffer) holds exactly ``magic``."""
    if type(part) is bytes:
        return part == magic
    cdef Py_buffer view
    PyObject_GetBuffer(part, &view, PyBUF_SIMPLE)
    try:
        return view.len == len(magic) and (<const char*>view.buf)[:view.len] == magic
    finally:
        PyBuffer_Release(&view)


# -- encoding -------------------------------------------------------------------------------------
@cython.final
cdef class _Writer:
    cdef bytearray buf
    cdef Py_ssize_t n

    cdef inline uint8_t* room(self, Py_ssize_t k) except NULL:
        cdef Py_ssize_t cap = PyByteArray_GET_SIZE(self.buf)
        if self.n + k > cap:
            self.buf.extend(bytes(max(cap, k)))
        cdef uint8_t* at = <uint8_t*>PyByteArray_AS_STRING(self.buf) + self.n
        self.n += k
        return at

    cdef inline void byte(self, uint8_t b) except *:
        self.room(1)[0] = b

    cdef inline void be16(self, uint8_t tag, uint16_t v) except *:
        cdef uint8_t* o = self.room(3)
        o[0] = tag
        o[1] = v >> 8
        o[2] = v & 0xff

    cdef inline void be32(self, uint8_t tag, uint32_t v) except *:
        cdef uint8_t* o = self.room(5)
        o[0] = tag
        o[1] = v >> 24
        o[2] = (v >> 16) & 0xff
        o[3] = (v >> 8) & 0xff
        o[4] = v & 0xff

    cdef inline void be64(self, uint8_t tag, uint64_t v) except *:
        cdef uint8_t* o = self.room(9)
        o[0] = tag
        cdef int j
        for j in range(8):
            o[1 + j] = (v >> (56 - 8 * j)) & 0xff

    cdef void int_(self, v) except *:
        cdef int overflow = 0
        cdef long long x = PyLong_AsLongLongAndOverflow(v, &overflow)
        cdef unsigned long long u
        cdef uint8_t* o
        if overflow > 0:
            u = PyLong_AsUnsignedLongLong(v)          # OverflowError past 2**64 - 1: not common
            self.be64(0xcf, u)
        elif overflow < 0:
            raise _NotCommon()
        elif x >= 0:
            if x <= 0x7f:
                self.byte(<uint8_t>x)
            elif x <= 0xff:
                o = self.room(2)
                o[0] = 0xcc
                o[1] = <uint8_t>x
            elif x <= 0xffff:
                self.be16(0xcd, <uint16_t>x)
            elif x <= 0xffffffff:
                self.be32(0xce, <uint32_t>x)
            else:
                self.be64(0xcf, <uint64_t>x)
        elif x >= -32:
            self.byte(<uint8_t>(<int8_t>x))
        elif x >= -128:
            o = self.room(2)
            o[0] = 0xd0
            o[1] = <uint8_t>(<int8_t>x)
        elif x >= -32768:
            self.be16(0xd1, <uint16_t>(<int16_t>x))
        elif x >= -2147483648:
            self.be32(0xd2, <uint32_t>(<int32_t>x))
        else:
            self.be64(0xd3, <uint64_t>x)

    cdef void raw(self, const char* s, Py_ssize_t k, bint is_str) except *:
        cdef uint8_t* o
        if is_str and k <= 31:
            self.byte(0xa0 | <uint8_t>k)
        elif k <= 0xff:
            o = self.room(2)
            o[0] = 0xd9 if is_str else 0xc4
            o[1] = <uint8_t>k
        elif k <= 0xffff:
            self.be16(0xda if is_str else 0xc5, <uint16_t>k)
        elif k <= 0xffffffff:
            self.be32(0xdb if is_str else 0xc6, <uint32_t>k)
        else:
            raise _NotCommon()
        memcpy(self.room(k), s, k)

    cdef void value(self, v, int depth) except *:
        cdef Py_ssize_t k
        cdef const char* s
        cdef double d
        cdef uint64_t u
        cdef Py_buffer view
        cdef PyObject* kobj
        cdef PyObject* vobj
        cdef Py_ssize_t pos = 0
        if depth > MAX_DEPTH:
            raise _NotCommon()
        t = type(v)
        if t is str:
            s = PyUnicode_AsUTF8AndSize(v, &k)
            self.raw(s, k, True)
        elif v is None:
            self.byte(0xc0)
        elif t is bool:
            self.byte(0xc3 if v is True else 0xc2)
        elif isinstance(v, int):          # int and its subclasses (IntEnum codes), as msgpack's Packer
            self.int_(v)
        elif t is bytes:
            self.raw(PyBytes_AS_STRING(v), len(<bytes>v), False)
        elif t is float:
            d = PyFloat_AS_DOUBLE(v)
            memcpy(&u, &d, 8)
            self.be64(0xcb, u)
        elif t is list or t is tuple:
            k = len(v)
            if k <= 15:
                self.byte(0x90 | <uint8_t>k)
            elif k <= 0xffff:
                self.be16(0xdc, <uint16_t>k)
            else:
                self.be32(0xdd, <uint32_t>k)
            for x in v:
                self.value(x, depth + 1)
        elif t is dict:
            k = len(<dict>v)
            if k <= 15:
                self.byte(0x80 | <uint8_t>k)
            elif k <= 0xffff:
                self.be16(0xde, <uint16_t>k)
            else:
                self.be32(0xdf, <uint32_t>k)
            while PyDict_Next(<dict>v, &pos, &kobj, &vobj):
                self.value(<object>kobj, depth + 1)
                self.value(<object>vobj, depth + 1)
        elif t is bytearray or t is memoryview:
            PyObject_GetBuffer(v, &view, PyBUF_SIMPLE)
            try:
                self.raw(<const char*>view.buf, view.len, False)
            finally:
                PyBuffer_Release(&view)
        else:
            raise _NotCommon()           # what msgpack does with it (or its TypeError) is its path's


cdef bytes _CODE = b"\xa4code"
cdef bytes _OPAQUE = b"\xa6opaque"
cdef bytes _FLAG = b"\xa4flag"
cdef bytes _REMARK = b"\xa6remark"
cdef bytes _FIELDS = b"\xa6fields"


cdef inline void _key(_Writer w, bytes k) except *:
    memcpy(w.room(len(k)), PyBytes_AS_STRING(k), len(k))


def encode_header(code, opaque, flag, remark, fields):
    """msgpack of ``{"code", "opaque", "flag", "remark", "fields"}`` (ints, a str, a dict), byte
    for byte what ``msgpack.Packer(use_bin_type=True).pack`` gives; None when a value is not of
    the types written here (the caller's msgpack path then packs it, or raises)."""
    cdef _Writer w = _Writer.__new__(_Writer)
    w.buf = bytearray(256)
    w.n = 0
    if type(remark) is not str or type(fields) is not dict:
        return None
    try:
        w.byte(0x85)
        _key(w, _CODE)
        w.value(code, 1)
        _key(w, _OPAQUE)
        w.value(opaque, 1)
        _key(w, _FLAG)
        w.value(flag, 1)
        _key(w, _REMARK)
        w.value(remark, 1)
        _key(w, _FIELDS)
        w.value(fields, 1)
    except (_NotCommon, OverflowError, UnicodeEncodeError):
        return None
    return PyBytes_FromStringAndSize(PyByteArray_AS_STRING(w.buf), w.n)
