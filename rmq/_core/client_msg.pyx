# cython: language_level=3, embedsignature=True
"""The producer's per-message work in C: unique ids, validation, properties, batch bodies.

What ``Producer.send_async`` / ``send`` / ``send_batch`` (threads and ``rmq.aio``) do for
each message before it joins a request:

* :func:`create_uniq_id` -- RocketMQ's ``MessageClientIDSetter`` id (``UNIQ_KEY``): 32
  uppercase hex digits = IP (4 bytes) + pid (2) + a per-process random (4, RocketMQ's
  class-loader hash) + ms since the start of the month (4) + a counter (2);
* :class:`MessagePreparer` -- RocketMQ ``Validators.checkMessage`` + ``sendKernelImpl``'s
  preparation: topic and body checks, the ``UNIQ_KEY``, zlib compression of a large body,
  ``sysFlag``, the encoded properties (SPEC.md §1.6) and the message's size in a batch
  (SPEC.md §1.11), into a :class:`PreparedMessage`;
* :func:`batch_body` -- the SEND_BATCH_MESSAGE body of prepared messages (SPEC.md §1.11),
  one pass over pre-sized memory.

It also holds :class:`Message` itself (``rmq.Message``: a C type the cyclic GC does not
track), :func:`many_parts` (``send_async_many``'s split into requests) and
:func:`complete_send_batch` (the I/O thread's per-message results).  This module imports no
client, store or actor module: the topic check and the error type are handed to
:class:`MessagePreparer`.
"""
cimport cython
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.mem cimport PyMem_Calloc, PyMem_Free, PyMem_Malloc
from cpython.dict cimport PyDict_Contains, PyDict_GetItem, PyDict_Next, PyDict_SetItem
from cpython.object cimport PyObject
from cpython.ref cimport Py_DECREF, Py_INCREF, Py_XDECREF
from cpython.unicode cimport PyUnicode_CheckExact
from libc.stdint cimport int16_t, int32_t, int64_t, uint8_t, uint32_t
from libc.string cimport memchr, memcpy

from rmq._core.hton cimport load_be32, store_be16, store_be32
from rmq._core.layout cimport COMPRESSED_FLAG as _COMPRESSED, COMPRESSION_ZLIB_TYPE as _ZLIB, \
    TRANSACTION_PREPARED_TYPE as _PREPARED
from rmq._core.layout cimport BATCH_FIXED_LENGTH, BATCH_TOTAL_SIZE_OFFSET, PROPERTIES_MAX_LENGTH, put_batch_element

import calendar
import os
import socket
import time
import zlib

from rmq.errors import MessageIllegalError, MQClientError

cdef extern from "Python.h":
    object PyUnicode_New(Py_ssize_t size, Py_UCS4 maxchar)
    void* PyUnicode_DATA(object o)
    const char* PyUnicode_AsUTF8AndSize(object o, Py_ssize_t* size) except NULL
    void PyObject_GC_Track(void* o)
    void PyObject_GC_UnTrack(void* o)
    int PyObject_GC_IsTracked(object o)
    int PyObject_IS_GC(object o)
    bint PyUnicode_IS_COMPACT_ASCII(object o)
    Py_ssize_t PyUnicode_GET_LENGTH(object o)

cdef extern from "structmember.h":
    ctypedef struct PyMemberDef:
        int type
        Py_ssize_t offset
        int flags
    int T_OBJECT_EX
    int READONLY

cdef extern from "Python.h":
    ctypedef struct PyMemberDescrObject:
        PyMemberDef* d_member
    ctypedef PyObject* (*_allocfunc)(void* cls, Py_ssize_t nitems)
    ctypedef struct _TypeObject "PyTypeObject":
        _allocfunc tp_alloc

cdef extern from "time.h" nogil:
    ctypedef long time_t
    struct timespec:
        time_t tv_sec
        long tv_nsec
    int clock_gettime(int clk, timespec* tp)
    int CLOCK_REALTIME

# Property names (SPEC.md §1.6, MessageConst): rmq.common.message_const
from rmq.common.message_const import (KEY_SEPARATOR, PROPERTY_DELAY_TIME_LEVEL, PROPERTY_KEYS,  # noqa: F401
                                      PROPERTY_TAGS, PROPERTY_TIMER_DELAY_MS, PROPERTY_TIMER_DELAY_SEC,
                                      PROPERTY_TIMER_DELIVER_MS, PROPERTY_TRANSACTION_PREPARED,
                                      PROPERTY_SHARDING_KEY, PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
                                      PROPERTY_WAIT_STORE_MSG_OK,
                                      RESERVED_PROPERTIES, TIMER_PROPERTIES)
MAX_DELAY_LEVEL = 18                 # messageDelayLevel has 18 levels (SPEC.md §10.1)
# MessageSysFlag (SPEC.md §1.5), from rmq._core.layout
COMPRESSED_FLAG = _COMPRESSED
TRANSACTION_PREPARED_TYPE = _PREPARED
COMPRESSION_ZLIB_TYPE = _ZLIB
cdef enum:
    _UNIQ_LEN = 32
UNIQ_ID_LENGTH = _UNIQ_LEN           # hex digits of a UNIQ_KEY
BATCH_ELEMENT_OVERHEAD = BATCH_FIXED_LENGTH   # TOTALSIZE+MAGIC+BODYCRC+FLAG+BODYLEN+PROPLEN (SPEC.md §1.11)
VALID_TOPICS_CACHE_MAX = 10_000      # topic names remembered as valid (cleared when full)

cdef str _UNIQ = PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX
cdef str _WAIT = PROPERTY_WAIT_STORE_MSG_OK
cdef str _TRAN = PROPERTY_TRANSACTION_PREPARED
cdef tuple _UNBATCHABLE = (PROPERTY_DELAY_TIME_LEVEL,) + TIMER_PROPERTIES
cdef const char* _HEX = b"0123456789ABCDEF"


# -- unique ids -------------------------------------------------------------------------------
def _ip_bytes():
    try:
        return socket.inet_aton(socket.gethostbyname(socket.gethostname()))
    except OSError:
        return bytes([127, 0, 0, 1])


cdef char _fix_hex[20]               # IP + pid + random, in hex
cdef double _month_lo = 0.0          # [start of this month, start of the next) in epoch s, UTC
cdef double _month_hi = 0.0
cdef uint32_t _counter = 0


cdef void _set_fix() except *:
    global _counter
    cdef bytes fix = _ip_bytes() + (os.getpid() & 0xFFFF).to_bytes(2, "big") + os.urandom(4)
    cdef const unsigned char* f = <const unsigned char*>PyBytes_AS_STRING(fix)
    cdef int i
    for i in range(10):
        _fix_hex[2 * i] = _HEX[f[i] >> 4]
        _fix_hex[2 * i + 1] = _HEX[f[i] & 15]
    _counter = int.from_bytes(os.urandom(2), "big")       # a random start, as a fresh process


cdef void _set_month(double now) except *:
    global _month_lo, _month_hi
    lt = time.gmtime(now)
    _month_lo = calendar.timegm((lt.tm_year, lt.tm_mon, 1, 0, 0, 0))
    _month_hi = calendar.timegm((lt.tm_year + lt.tm_mon // 12, lt.tm_mon % 12 + 1, 1, 0, 0, 0))


cdef inline void _hex_be(char* out, uint32_t v, int digits) noexcept nogil:
    cdef int i
    for i in range(digits - 1, -1, -1):
        out[i] = _HEX[v & 15]
        v >>= 4


cdef uint32_t _uniq_ms() except? 0xFFFFFFFF:
    """A UNIQ_KEY's time field now: ms since the start of this month (UTC)."""
    cdef timespec ts
    clock_gettime(CLOCK_REALTIME, &ts)
    cdef double now = ts.tv_sec + ts.tv_nsec * 1e-9
    if not (_month_lo <= now < _month_hi):
        _set_month(now)
    return <uint32_t>(<int64_t>((now - _month_lo) * 1000.0))


cdef inline void _write_uniq_id_at(char* out, uint32_t ms) noexcept:
    """A new UNIQ_KEY's 32 hex digits at ``out``, with time field ``ms`` (:func:`_uniq_ms`).  The
    GIL makes the counter's read-and-increment atomic (no Python call in between)."""
    global _counter
    cdef uint32_t n = _counter & 0xFFFF
    _counter += 1
    memcpy(out, _fix_hex, 20)
    _hex_be(out + 20, ms, 8)
    _hex_be(out + 28, n, 4)


cdef void _write_uniq_id(char* out) except *:
    """A new UNIQ_KEY's 32 hex digits at ``out``."""
    _write_uniq_id_at(out, _uniq_ms())


cdef str _new_uniq_id():
    cdef str s = PyUnicode_New(UNIQ_ID_LENGTH, 127)
    _write_uniq_id(<char*>PyUnicode_DATA(s))
    return s


# A user batch's new ids share one clock read per this many: an id is (time field in ms, a 16-bit
# counter), so ids 65,536 apart must not share a time field; 65,536 ids take well over a ms to make.
cdef enum:
    _IDS_PER_CLOCK_READ = 4096
UNIQ_IDS_PER_CLOCK_READ = _IDS_PER_CLOCK_READ


cdef str _new_uniq_id_at(uint32_t ms):
    """:func:`_new_uniq_id` with the time field read once for many (a user batch's messages: the
    counter keeps them apart)."""
    cdef str s = PyUnicode_New(UNIQ_ID_LENGTH, 127)
    _write_uniq_id_at(<char*>PyUnicode_DATA(s), ms)
    return s


cdef bytes _UNIQ_PROPS_PREFIX = (PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX + "\x01").encode()


cdef bytes _uniq_only_props(str uniq):
    """The encoded properties of a message whose only property is its UNIQ_KEY ``uniq`` (one of
    the ASCII ids :func:`_new_uniq_id` makes: a lazy Message's ``_uniq`` is set nowhere else):
    ``UNIQ_KEY \x01 uniq \x02``, as encode_properties gives them."""
    cdef bytes out = PyBytes_FromStringAndSize(NULL, PyBytes_GET_SIZE(_UNIQ_PROPS_PREFIX) + PyUnicode_GET_LENGTH(uniq) + 1)
    _put_property(<unsigned char*>PyBytes_AS_STRING(out), _UNIQ_PROPS_PREFIX, uniq)
    return out


cdef str _SHARD = PROPERTY_SHARDING_KEY
cdef bytes _SHARD_PROPS_PREFIX = (PROPERTY_SHARDING_KEY + "\x01").encode()


cdef bytes _shard_uniq_props(str shard, str uniq):
    """The encoded properties of a lazy message sent with a sharding key: ``SHARDING_KEY \x01
    shard \x02 UNIQ_KEY \x01 uniq \x02``, what encode_properties gives for the dict the message
    shows ({SHARDING_KEY: shard, UNIQ_KEY: uniq}: :meth:`Message._materialize`).

    Raises
    ------
    MessageIllegalError
        ``shard`` holds a \x01 or \x02 separator (as encode_properties).
    """
    cdef Py_ssize_t sl
    cdef const char* sp = PyUnicode_AsUTF8AndSize(shard, &sl)
    if _has_separator(sp, sl):
        raise MessageIllegalError(f"property {PROPERTY_SHARDING_KEY!r} contains a \\x01 or \\x02 separator")
    cdef Py_ssize_t a = PyBytes_GET_SIZE(_SHARD_PROPS_PREFIX), k = PyBytes_GET_SIZE(_UNIQ_PROPS_PREFIX)
    cdef Py_ssize_t n = PyUnicode_GET_LENGTH(uniq)
    cdef bytes out = PyBytes_FromStringAndSize(NULL, a + sl + 1 + k + n + 1)
    cdef unsigned char* o = <unsigned char*>PyBytes_AS_STRING(out)
    _put_property(_put_property(o, _SHARD_PROPS_PREFIX, shard), _UNIQ_PROPS_PREFIX, uniq)
    return out


def create_uniq_id():
    """A new ``UNIQ_KEY``: 32 uppercase hex digits (RocketMQ ``MessageClientIDSetter``)."""
    return _new_uniq_id()


def _after_fork_in_child():
    _set_fix()                           # a forked child puts its own pid (and random) in its ids


_set_fix()
os.register_at_fork(after_in_child=_after_fork_in_child)   # not os.getpid() per id: a syscall each


# -- properties (SPEC.md §1.6) -------------------------------------------------------------------
cdef inline bint _has_separator(const char* s, Py_ssize_t n) noexcept nogil:
    return memchr(s, 1, n) != NULL or memchr(s, 2, n) != NULL


cdef enum:
    PROPS_FAST_MAX = 32              # properties encoded from stack arrays (more: the general path)
PROPERTIES_IN_PLACE_MAX = PROPS_FAST_MAX


cpdef bytes encode_properties(dict properties):
    """``name \\x01 value \\x02`` per item (None values left out), UTF-8, in one pass over
    pre-sized memory.

    Raises
    ------
    MessageIllegalError
        A name or value contains a \\x01 or \\x02 separator.
    """
    if not properties:
        return b""
    # the common case: str names and values, few of them -- read in place (PyDict_Next lends
    # its items; nothing runs Python code until the copy is done, so the dict cannot change)
    cdef const char* kps[PROPS_FAST_MAX]
    cdef const char* vps[PROPS_FAST_MAX]
    cdef Py_ssize_t kls[PROPS_FAST_MAX]
    cdef Py_ssize_t vls[PROPS_FAST_MAX]
    cdef Py_ssize_t pos = 0, total = 0, kl, vl, i, m = 0
    cdef PyObject* kobj
    cdef PyObject* vobj
    while PyDict_Next(properties, &pos, &kobj, &vobj):
        if vobj == <PyObject*>None:
            continue
        if m == PROPS_FAST_MAX or not PyUnicode_CheckExact(<object>kobj) or not PyUnicode_CheckExact(<object>vobj):
            return _encode_properties_general(properties)
        kps[m] = PyUnicode_AsUTF8AndSize(<object>kobj, &kls[m])
        vps[m] = PyUnicode_AsUTF8AndSize(<object>vobj, &vls[m])
        if _has_separator(kps[m], kls[m]) or _has_separator(vps[m], vls[m]):
            raise MessageIllegalError(f"property {<object>kobj!r} contains a \\x01 or \\x02 separator")
        total += kls[m] + vls[m] + 2
        m += 1
    cdef bytes out = PyBytes_FromStringAndSize(NULL, total)
    cdef char* o = PyBytes_AS_STRING(out)
    for i in range(m):
        kl = kls[i]
        vl = vls[i]
        memcpy(o, kps[i], kl)
        o[kl] = 1
        memcpy(o + kl + 1, vps[i], vl)
        o[kl + 1 + vl] = 2
        o += kl + vl + 2
    return out


cdef bytes _encode_properties_general(dict properties):
    """encode_properties for names / values that are not str (their str()), or many of them."""
    cdef Py_ssize_t total = 0, kl, vl, i = 0
    cdef const char* kp
    cdef const char* vp
    cdef list strs = []                  # keeps the str() of non-str names / values alive
    cdef object k, v
    for k, v in properties.items():
        if v is None:
            continue
        if type(k) is not str:
            k = str(k)
        if type(v) is not str:
            v = str(v)
        kp = PyUnicode_AsUTF8AndSize(k, &kl)
        vp = PyUnicode_AsUTF8AndSize(v, &vl)
        if _has_separator(kp, kl) or _has_separator(vp, vl):
            raise MessageIllegalError(f"property {k!r} contains a \\x01 or \\x02 separator")
        strs.append(k)
        strs.append(v)
        total += kl + vl + 2
    cdef bytes out = PyBytes_FromStringAndSize(NULL, total)
    cdef char* o = PyBytes_AS_STRING(out)
    for i in range(0, len(strs), 2):
        kp = PyUnicode_AsUTF8AndSize(strs[i], &kl)
        vp = PyUnicode_AsUTF8AndSize(strs[i + 1], &vl)
        memcpy(o, kp, kl)
        o[kl] = 1
        memcpy(o + kl + 1, vp, vl)
        o[kl + 1 + vl] = 2
        o += kl + vl + 2
    return out


# -- the message ----------------------------------------------------------------------------------
cdef str _TAGS = PROPERTY_TAGS
cdef str _KEYS = PROPERTY_KEYS
cdef str _DELAY = PROPERTY_DELAY_TIME_LEVEL
cdef str _DELIVER_MS = PROPERTY_TIMER_DELIVER_MS
cdef str _DELAY_MS = PROPERTY_TIMER_DELAY_MS


cdef str _keys_value(value):
    """The ``KEYS`` property of ``value``: a str, or keys joined by KEY_SEPARATOR."""
    if isinstance(value, str):
        return value if type(value) is str else str(value)
    return KEY_SEPARATOR.join([x if type(x) is str else str(x) for x in value])


@cython.no_gc          # untracked by the cyclic GC: building many messages triggers no collection;
@cython.freelist(64)   # (a message is never part of a cycle: it holds str / bytes / a dict of str)
cdef class Message:
    """A message to send (RocketMQ ``Message``).

    Parameters
    ----------
    topic : str
    body : bytes
        At most the producer's ``max_message_size`` (4 MiB by default).
    tags : str, optional
        One tag (hashed into the ConsumeQueue tagsCode for server-side filtering).
    keys : str or list of str, optional
        Indexed keys (look-up with ``query_message``); no spaces inside a key.
    properties : dict, optional
        User properties (str -> str).
    delay_time_level : int
        0 (none) or 1..18 (SPEC.md §10.1).
    flag : int
        Opaque user int stored in the record.
    wait_store_msg_ok : bool
        False: property ``WAIT=false`` (the broker answers before a SYNC_FLUSH / SYNC_MASTER wait).
    deliver_time_ms : int, optional
        Timer message (RocketMQ 5 ``setDeliverTimeMs``; property ``TIMER_DELIVER_MS``): deliver
        at this time, epoch ms.  A time not ahead delivers at once; more than the broker's
        ``timerMaxDelaySec`` (3 days) ahead is refused (MQBrokerError, MESSAGE_ILLEGAL).  Delivery
        is never early and at most ``timerPrecisionMs`` (1 000 ms) late, plus the broker's work.
    delay_time_ms : int, optional
        Timer message, relative (``setDelayTimeMs``; ``TIMER_DELAY_MS``): deliver this many ms
        after the broker stores it.

    Attributes ``topic``, ``body``, ``properties`` (a dict; tags, keys, delay level and timers
    live there, under RocketMQ's property names) and ``flag``; no others can be added.  A C type
    the cyclic GC does not track: do not put a message inside its own properties.

    Raises
    ------
    MQClientError
        A body that is not bytes, a bad delay level or timer value, or a timer together with a
        delay level or with another timer property.
    """

    cdef public object topic
    cdef public object body
    # the properties dict is made on first need: a message given none (the usual case) has
    # ``_lazy`` set and no dict, and ``prepare`` gives it its UNIQ_KEY in ``_uniq`` (its properties
    # are then {UNIQ_KEY: _uniq}); reading ``properties`` makes the dict, which is then the only
    # place they live.  ``_props`` is None with ``_lazy``, or when the user set None.
    cdef dict _props
    cdef bint _lazy
    cdef str _uniq
    # a lazy message's SHARDING_KEY, set by an ordered send (set_sharding_key): its properties are
    # then {SHARDING_KEY: _shard, UNIQ_KEY: _uniq} without a dict made either; None otherwise
    cdef str _shard
    cdef public object flag

    def __init__(self, topic, body, tags=None, keys=None, properties=None, delay_time_level=0, flag=0,
                 wait_store_msg_ok=True, deliver_time_ms=None, delay_time_ms=None):
        if type(body) is not bytes:
            if not isinstance(body, (bytes, bytearray, memoryview)):
                raise MQClientError(f"message body must be bytes, got {type(body).__name__}")
            body = bytes(body)
        self.topic = topic
        self.body = body
        self.flag = flag
        self._uniq = None
        self._shard = None
        if not (properties or tags or keys or delay_time_level or not wait_store_msg_ok
                or deliver_time_ms is not None or delay_time_ms is not None):
            self._props = None           # no property: no dict (see above)
            self._lazy = True
            return
        self._lazy = False
        cdef dict props = {}
        if properties:
            for k, v in properties.items():
                props[k if type(k) is str else str(k)] = v if type(v) is str else str(v)
        self._props = props
        if tags:                         # as the tags / keys setters, without the descriptor calls
            props[_TAGS] = tags
        if keys:
            props[_KEYS] = _keys_value(keys)
        if delay_time_level:
            self.delay_time_level = delay_time_level
        if not wait_store_msg_ok:
            self.properties[_WAIT] = "false"
        if deliver_time_ms is not None:
            self.deliver_time_ms = deliver_time_ms
        if delay_time_ms is not None:
            self.delay_time_ms = delay_time_ms

    @property
    def properties(self):
        """The message's properties, a dict (str -> str): user properties, and tags, keys, delay
        level, timers and UNIQ_KEY under RocketMQ's names.  The same dict on every read."""
        if self._lazy:
            return self._materialize()
        return self._props

    @properties.setter
    def properties(self, value):
        self._props = value              # a dict, or None (prepare then refuses the message)
        self._lazy = False
        self._uniq = None
        self._shard = None

    cdef dict _materialize(self):
        cdef dict d = {}
        if self._shard is not None:      # in the order the dict path set them (sharding key first)
            d[_SHARD] = self._shard
        if self._uniq is not None:
            d[_UNIQ] = self._uniq
        self._props = d
        self._lazy = False
        self._uniq = None
        self._shard = None
        return d

    @property
    def tags(self):
        """The message's tag (property ``TAGS``), or None."""
        return self.properties.get(_TAGS)

    @tags.setter
    def tags(self, value):
        if value:
            self.properties[_TAGS] = value
        else:
            self.properties.pop(_TAGS, None)

    @property
    def keys(self):
        """The message's keys (property ``KEYS``, space-separated), as a list."""
        k = self.properties.get(_KEYS)
        return [x for x in k.split(KEY_SEPARATOR) if x] if k else []

    @keys.setter
    def keys(self, value):
        if not value:
            self.properties.pop(_KEYS, None)
            return
        self.properties[_KEYS] = _keys_value(value)

    @property
    def delay_time_level(self):
        """0 (none) or the delay level 1..18 (property ``DELAY``)."""
        d = self.properties.get(_DELAY)
        return int(d) if d else 0

    @delay_time_level.setter
    def delay_time_level(self, level):
        if isinstance(level, bool) or not isinstance(level, int) or not 0 <= level <= MAX_DELAY_LEVEL:
            raise MQClientError(f"delay_time_level must be 0..{MAX_DELAY_LEVEL}, got {level!r}")
        if level and any(p in self.properties for p in TIMER_PROPERTIES):
            raise MQClientError("delay_time_level and a timer (deliver_time_ms / delay_time_ms) are exclusive")
        if level:
            self.properties[_DELAY] = str(level)
        else:
            self.properties.pop(_DELAY, None)

    def _timer(self, name):
        v = self.properties.get(name)
        return int(v) if v else None

    def _set_timer(self, name, value, what):
        if value is None:
            self.properties.pop(name, None)
            return
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise MQClientError(f"{what} must be an int >= 0 (ms), got {value!r}")
        others = [p for p in TIMER_PROPERTIES if p != name and p in self.properties]
        if others:
            raise MQClientError(f"a message takes one timer: {what} given, {others[0]} already set")
        if self.properties.get(_DELAY):
            raise MQClientError(f"{what} and delay_time_level are exclusive (RocketMQ: the level wins)")
        self.properties[name] = str(value)

    @property
    def deliver_time_ms(self):
        """Timer deliver time, epoch ms (``TIMER_DELIVER_MS``), or None."""
        return self._timer(_DELIVER_MS)

    @deliver_time_ms.setter
    def deliver_time_ms(self, value):
        self._set_timer(_DELIVER_MS, value, "deliver_time_ms")

    @property
    def delay_time_ms(self):
        """Timer delay after the broker stores the message, ms (``TIMER_DELAY_MS``), or None."""
        return self._timer(_DELAY_MS)

    @delay_time_ms.setter
    def delay_time_ms(self, value):
        self._set_timer(_DELAY_MS, value, "delay_time_ms")

    def put_user_property(self, name, value):
        """Set user property ``name`` to ``str(value)``.  Raises MQClientError for a name the
        system uses (``RESERVED_PROPERTIES``)."""
        if name in RESERVED_PROPERTIES:
            raise MQClientError(f"the property {name!r} is used by the system")
        self.properties[name] = str(value)

    def __repr__(self):
        return f"Message(topic={self.topic!r}, body={len(self.body)} bytes, properties={self.properties})"


# -- prepared messages ----------------------------------------------------------------------------
@cython.no_gc          # no cycle can pass through it (nothing it holds refers back): one object per
cdef class PreparedMessage:   # message fewer for the cyclic GC, whose collections run in the sender
    """A validated message ready for the wire: its (maybe compressed) body, sysFlag and encoded
    properties, as of preparation (later changes to the Message are not sent).  ``size`` is the
    message's bytes in a batch body (SPEC.md §1.11)."""

    cdef public object msg
    cdef public bytes body
    cdef public int sys_flag
    cdef public str uniq_id
    cdef public bint wait
    cdef public bint batchable
    cdef public bytes props
    cdef public Py_ssize_t size

    def __init__(self, msg, bytes body, int sys_flag, str uniq_id, bint wait, bint batchable):
        self.msg = msg
        self.body = body
        self.sys_flag = sys_flag
        self.uniq_id = uniq_id
        self.wait = wait
        self.batchable = batchable
        self.props = encode_properties(msg.properties)
        self.size = len(body) + len(self.props) + BATCH_FIXED_LENGTH


cdef class _BatchScan
cdef class UserBatch


cpdef void set_sharding_key(Message msg, key) except *:
    """Set ``msg``'s SHARDING_KEY property to ``str(key)``, as ``selector_for`` does, without
    making a properties dict for a message that has none (its ``_shard``; the dict shows it once
    made).  A message whose properties the user set to None is left so (prepare refuses it)."""
    cdef str k = key if type(key) is str else str(key)
    if msg._lazy:
        msg._shard = k
    elif msg._props is not None:
        msg._props[_SHARD] = k


cdef class MessagePreparer:
    """``prepare(msg) -> PreparedMessage`` with a producer's limits.

    Parameters
    ----------
    message_type : type
        The accepted message class (``rmq.Message``).
    check_topic : callable (str) -> object
        The topic name check (TopicValidator); raises ``ValueError`` on a bad name.
    error_type : type
        Raised for a bad message as ``error_type(text, response_code)``.
    illegal_code : int
        The response code of such errors (MESSAGE_ILLEGAL, 13).
    max_message_size : int
        Bytes a body may have (``max_message_size``, 4 MiB by default).
    compress_over : int
        Bodies of at least this many bytes are zlib-compressed (``compress_msg_body_over_howmuch``).
    compress_level : int
        zlib level, 0..9.
    """

    cdef object message_type, check_topic
    cdef readonly object error_type
    cdef readonly int illegal_code
    cdef int compress_level
    cdef readonly Py_ssize_t max_message_size
    cdef Py_ssize_t compress_over
    cdef set valid_topics

    def __init__(self, message_type, check_topic, error_type, int illegal_code, Py_ssize_t max_message_size,
                 Py_ssize_t compress_over, int compress_level):
        self.message_type = message_type
        self.check_topic = check_topic
        self.error_type = error_type
        self.illegal_code = illegal_code
        self.max_message_size = max_message_size
        self.compress_over = compress_over
        self.compress_level = compress_level
        self.valid_topics = set()

    @property
    def cached_topics(self):
        """How many topic names are remembered as valid (at most ``VALID_TOPICS_CACHE_MAX``)."""
        return len(self.valid_topics)

    cpdef check_topic_once(self, topic):
        """The topic check of :meth:`check` (remembered once valid).  Raises ``error_type``."""
        if topic not in self.valid_topics:
            try:
                self.check_topic(topic)
            except ValueError as e:
                raise self.error_type(str(e), self.illegal_code) from None
            if len(self.valid_topics) >= VALID_TOPICS_CACHE_MAX:
                self.valid_topics.clear()
            self.valid_topics.add(topic)

    cpdef check(self, msg):
        """RocketMQ ``Validators.checkMessage``: a message of the right type, a valid topic, a
        body of 1..max_message_size bytes.  Raises ``error_type`` (MESSAGE_ILLEGAL)."""
        if not isinstance(msg, self.message_type):
            raise self.error_type(f"expected an rmq.Message, got {type(msg).__name__}", self.illegal_code)
        cdef object topic, body
        if isinstance(msg, Message):     # its fields read in C
            topic = (<Message>msg).topic
            body = (<Message>msg).body
        else:
            topic = msg.topic
            body = msg.body
        self.check_topic_once(topic)
        cdef Py_ssize_t n = PyBytes_GET_SIZE(body) if type(body) is bytes else len(body)
        if n == 0:
            raise self.error_type("the message body length is zero", self.illegal_code)
        if n > self.max_message_size:
            raise self.error_type(f"the message body size over max value, MAX: {self.max_message_size} "
                                  f"(body is {n} bytes; topic {topic})", self.illegal_code)

    cpdef PreparedMessage prepare(self, msg):
        """Check ``msg``, give it a ``UNIQ_KEY`` (kept if already set), compress a large body.

        Raises
        ------
        error_type
            Bad type, topic, empty body or body over ``max_message_size`` (MESSAGE_ILLEGAL), or
            a property with a \\x01 / \\x02 separator.
        """
        self.check(msg)
        cdef bint typed = isinstance(msg, Message)
        if typed and (<Message>msg)._lazy:
            return self._prepare_plain(<Message>msg)
        cdef object props_obj = (<Message>msg)._props if typed else msg.properties
        if type(props_obj) is not dict:
            raise self.error_type(f"message properties must be a dict, got {type(props_obj).__name__}",
                                  self.illegal_code)
        cdef dict props = props_obj
        cdef object uniq = <object>PyDict_GetItem(props, _UNIQ) if PyDict_Contains(props, _UNIQ) else None
        cdef bint added = False
        if not uniq:
            uniq = _new_uniq_id()
            PyDict_SetItem(props, _UNIQ, uniq)
            added = True
        cdef object b = (<Message>msg).body if typed else msg.body
        cdef bytes body = b if type(b) is bytes else bytes(b)
        cdef int sys_flag = 0
        if len(body) >= self.compress_over:
            body = zlib.compress(body, self.compress_level)
            sys_flag = COMPRESSED_FLAG | COMPRESSION_ZLIB_TYPE
        cdef bint wait = True
        cdef bint batchable = sys_flag == 0
        cdef object k
        if len(props) > 1:               # only UNIQ_KEY: nothing else to look at
            w = props.get(_WAIT)
            wait = w is None or w != "false"
            if batchable:
                for k in _UNBATCHABLE:
                    if PyDict_Contains(props, k):
                        batchable = False
                        break
            if props.get(_TRAN) == "true":           # a half message (sendKernelImpl)
                sys_flag |= TRANSACTION_PREPARED_TYPE
                batchable = False
        try:
            return self._prepared(msg, body, sys_flag, uniq, wait, batchable, props)
        except BaseException:
            if added:                    # a refused message is left as it was given
                del props[_UNIQ]
            raise

    cdef PreparedMessage _prepare_plain(self, Message msg):
        """:meth:`prepare` of a message without properties (no dict made): its only property is
        the UNIQ_KEY (kept if it has one), set on it once the rest cannot fail."""
        cdef str uniq = msg._uniq
        if uniq is None:
            uniq = _new_uniq_id()
        b = msg.body
        cdef bytes body = b if type(b) is bytes else bytes(b)
        cdef int sys_flag = 0
        if len(body) >= self.compress_over:
            body = zlib.compress(body, self.compress_level)
            sys_flag = COMPRESSED_FLAG | COMPRESSION_ZLIB_TYPE
        cdef bytes plain = None
        if msg._shard is not None:
            try:
                plain = _shard_uniq_props(msg._shard, uniq)
            except MessageIllegalError as e:
                raise self.error_type(str(e), self.illegal_code) from None
        cdef PreparedMessage p = self._prepared(msg, body, sys_flag, uniq, True, sys_flag == 0, None, plain)
        msg._uniq = uniq
        return p

    cdef PreparedMessage _prepared(self, msg, bytes body, int sys_flag, str uniq, bint wait, bint batchable,
                                   dict props, bytes plain=None):
        """A PreparedMessage with the encoded properties (``props`` None: a message without a
        properties dict, ``plain`` its encoded properties, else the UNIQ_KEY alone) and the batch
        size; a separator in a property is ``error_type`` (MESSAGE_ILLEGAL)."""
        cdef PreparedMessage p = PreparedMessage.__new__(PreparedMessage)
        p.msg = msg
        p.body = body
        p.sys_flag = sys_flag
        p.uniq_id = uniq
        p.wait = wait
        p.batchable = batchable
        if props is None:
            p.props = _uniq_only_props(uniq) if plain is None else plain
        else:
            try:
                p.props = encode_properties(props)
            except MessageIllegalError as e:
                raise self.error_type(str(e), self.illegal_code) from None
        p.size = len(body) + len(p.props) + BATCH_FIXED_LENGTH
        return p

    cpdef list prepare_many(self, list msgs, list keys, str key_property):
        """:meth:`prepare` for each of ``msgs`` (one ``send_async_many`` call), a message whose
        ``keys[i]`` is not None getting ``key_property`` = ``str(keys[i])`` first; all or none.

        Raises
        ------
        error_type
            For the first invalid message, its remark prefixed ``message i of n: ``; the key
            properties set so far are taken back.
        """
        msgs = msgs[:]      # as given: a message's own Python code could change the caller's list (no bounds checks here)
        cdef Py_ssize_t i = 0, j, n = len(msgs)
        cdef list out = []
        cdef object m, k
        if keys is not None and len(keys) != n:
            raise ValueError(f"{len(keys)} keys for {n} messages")
        try:
            for i in range(n):
                m = msgs[i]
                if not isinstance(m, self.message_type):
                    raise self.error_type(f"expected a Message, got {type(m).__name__}", self.illegal_code)
                if keys is not None:
                    k = keys[i]
                    if k is not None:
                        if key_property == _SHARD and type(m) is Message:
                            set_sharding_key(<Message>m, k)      # no dict made for a message without one
                        else:
                            m.properties[key_property] = k if type(k) is str else str(k)
                out.append(self.prepare(m))
        except Exception as e:
            if keys is not None:
                for j in range(i + 1):
                    m = msgs[j]
                    if keys[j] is not None and isinstance(m, self.message_type) and type(m.properties) is dict:
                        m.properties.pop(key_property, None)
            if isinstance(e, self.error_type):
                raise self.error_type(f"message {i} of {n}: {e.remark}", e.response_code) from e
            raise
        return out

    cdef _BatchScan _scan_batch(self, msgs):
        """The checks of a user batch (:meth:`prepare_batch`, :meth:`encode_user_batch`) and what
        building it needs: each message's body, UNIQ_KEY and encoded properties (None: the UNIQ_KEY
        alone), their total size in a batch body.  The UNIQ_KEYs it gives are set on the messages;
        on any error they are taken back before it raises."""
        cdef list ms = list(msgs)       # a copy even of a list: read without bounds checks, as given
        if not ms:
            raise self.error_type("send_batch needs at least one message", self.illegal_code)
        cdef Py_ssize_t n = len(ms)
        cdef _BatchScan s = _BatchScan.__new__(_BatchScan)
        s.ms = ms
        s.bodies = [None] * n
        s.uniqs = [None] * n
        s.props = [None] * n
        s.waits = [True] * n
        s.added = []
        s.added_plain = []
        s.wait = True
        cdef uint32_t now_ms = 0
        cdef Py_ssize_t made = 0         # new ids so far: the clock is read again every UNIQ_IDS_PER_CLOCK_READ
        cdef Py_ssize_t total = 0, i, k = PyBytes_GET_SIZE(_UNIQ_PROPS_PREFIX)
        cdef object props_obj, uniq, b, mt, w, pb
        cdef dict props
        cdef bint wait, lazy
        topic = ms[0].topic if isinstance(ms[0], self.message_type) else None
        try:
            for i in range(n):
                m = ms[i]
                self.check(m)
                lazy = False
                if isinstance(m, Message):       # its fields read in C
                    mt = (<Message>m).topic
                    b = (<Message>m).body
                    lazy = (<Message>m)._lazy    # no property but perhaps its UNIQ_KEY: no dict made
                    if lazy and (<Message>m)._shard is not None:
                        (<Message>m)._materialize()   # sent with a sharding key before: its dict now
                        lazy = False
                    props_obj = (<Message>m)._props
                else:
                    mt, props_obj, b = m.topic, m.properties, m.body
                if mt != topic:
                    raise self.error_type(f"the topic of the messages in one batch should be the same: "
                                          f"{topic!r} and {mt!r}", self.illegal_code)
                if not lazy and type(props_obj) is not dict:
                    raise self.error_type(f"message properties must be a dict, got {type(props_obj).__name__}",
                                          self.illegal_code)
                props = props_obj
                wait = True
                uniq = (<Message>m)._uniq if lazy else None
                if props:                        # none set (the usual case): nothing to look for
                    if PROPERTY_DELAY_TIME_LEVEL in props:
                        raise self.error_type("TimeDelayLevel is not supported for batching", self.illegal_code)
                    for kk in TIMER_PROPERTIES:
                        if kk in props:
                            raise self.error_type("timer messages (deliver_time_ms / delay_time_ms) are not "
                                                  "supported for batching", self.illegal_code)
                    uniq = props.get(_UNIQ)
                    w = props.get(_WAIT)
                    wait = w is None or w != "false"
                if i == 0 and topic.startswith("%RETRY%"):   # every message has the first's topic
                    raise self.error_type("Retry Group is not supported for batching", self.illegal_code)
                if not uniq:
                    if made % _IDS_PER_CLOCK_READ == 0:
                        now_ms = _uniq_ms()
                    made += 1
                    uniq = _new_uniq_id_at(now_ms)
                    if lazy:
                        (<Message>m)._uniq = uniq
                        s.added_plain.append(m)
                    else:
                        PyDict_SetItem(props, _UNIQ, uniq)
                        s.added.append(props)
                if not isinstance(uniq, str):
                    raise self.error_type(f"the UNIQ_KEY property must be a str, got {type(uniq).__name__}",
                                          self.illegal_code)
                if props is None:                # a lazy message: UNIQ_KEY \x01 id \x02 (_uniq_only_props)
                    pb = None
                    total += k + PyUnicode_GET_LENGTH(uniq) + 1
                else:
                    try:
                        pb = encode_properties(props)
                    except MessageIllegalError as e:
                        raise self.error_type(str(e), self.illegal_code) from None
                    total += PyBytes_GET_SIZE(pb)
                b = b if type(b) is bytes else bytes(b)
                total += BATCH_FIXED_LENGTH + PyBytes_GET_SIZE(b)
                if not wait:
                    s.wait = False
                    s.waits[i] = False
                s.bodies[i] = b
                s.uniqs[i] = uniq
                if pb is not None:
                    s.props[i] = pb
            if total > self.max_message_size:
                raise self.error_type(f"the batch size over max value, MAX: {self.max_message_size} "
                                      f"(batch of {len(ms)} messages is about {total} bytes)", self.illegal_code)
        except BaseException:
            s.undo()
            raise
        s.topic = topic
        s.total = total
        return s

    cpdef list prepare_batch(self, msgs):
        """RocketMQ ``DefaultMQProducerImpl.batch`` checks + preparation of a user batch: one
        topic, no delay level or timer, no ``%RETRY%`` topic, bodies not compressed, a
        ``UNIQ_KEY`` each (kept if set), the whole within ``max_message_size``.  A refused batch
        is left as given (no ``UNIQ_KEY`` added).

        Raises
        ------
        error_type
            Any rule above broken (MESSAGE_ILLEGAL), or an empty batch.
        """
        cdef _BatchScan s = self._scan_batch(msgs)
        cdef list out = []
        cdef PreparedMessage p
        cdef Py_ssize_t i
        cdef object pb
        for i in range(len(s.ms)):
            p = PreparedMessage.__new__(PreparedMessage)
            p.msg = s.ms[i]
            p.body = s.bodies[i]
            p.sys_flag = 0
            p.uniq_id = s.uniqs[i]
            pb = s.props[i]
            p.props = _uniq_only_props(p.uniq_id) if pb is None else pb
            p.wait = s.waits[i]
            p.batchable = True
            p.size = PyBytes_GET_SIZE(p.body) + PyBytes_GET_SIZE(p.props) + BATCH_FIXED_LENGTH
            out.append(p)
        return out

    cpdef UserBatch encode_user_batch(self, msgs):
        """:meth:`prepare_batch`'s checks, and the batch's SEND_BATCH_MESSAGE body (SPEC.md §1.11)
        and comma-joined UNIQ_KEYs written in one pass over pre-sized memory, without an object
        per message (``Producer.send_batch``'s direct path).

        Raises
        ------
        error_type
            As :meth:`prepare_batch`; or a message whose encoded properties pass 32,767 bytes
            (``message i of n: properties are ...``).  A refused batch is left as given.
        """
        cdef _BatchScan s = self._scan_batch(msgs)
        cdef Py_ssize_t n = len(s.ms), i, blen, plen, k = PyBytes_GET_SIZE(_UNIQ_PROPS_PREFIX)
        cdef Py_ssize_t ids_len = n - 1, ulen
        cdef object pb, u
        cdef bint ascii = True             # every UNIQ_KEY ASCII (a user may set any str): joined in C
        for i in range(n):
            pb = s.props[i]
            u = s.uniqs[i]
            if not (PyUnicode_CheckExact(u) and PyUnicode_IS_COMPACT_ASCII(u)):
                ascii = False              # a message with a properties dict (pb set): encoded already
            ulen = PyUnicode_GET_LENGTH(u)
            plen = k + ulen + 1 if pb is None else PyBytes_GET_SIZE(pb)
            if plen > PROPERTIES_MAX_LENGTH:
                s.undo()
                raise self.error_type(f"message {i} of {n}: properties are {plen} bytes, over the "
                                      f"{PROPERTIES_MAX_LENGTH}-byte limit", self.illegal_code)
            ids_len += ulen
        cdef bytes out = PyBytes_FromStringAndSize(NULL, s.total)
        cdef unsigned char* o = <unsigned char*>PyBytes_AS_STRING(out)
        cdef str ids = PyUnicode_New(ids_len, 127) if ascii else ",".join(s.uniqs)
        cdef char* w = <char*>PyUnicode_DATA(ids)
        cdef unsigned char* pp
        cdef object m, b
        for i in range(n):
            m = s.ms[i]
            b = s.bodies[i]
            u = s.uniqs[i]
            pb = s.props[i]
            ulen = PyUnicode_GET_LENGTH(u)
            blen = PyBytes_GET_SIZE(b)
            plen = k + ulen + 1 if pb is None else PyBytes_GET_SIZE(pb)
            pp = put_batch_element(o, BATCH_FIXED_LENGTH + blen + plen,
                                   <int32_t>((<Message>m).flag if isinstance(m, Message) else m.flag),
                                   PyBytes_AS_STRING(b), blen, plen)
            if pb is None:
                _put_property(pp, _UNIQ_PROPS_PREFIX, u)
            else:
                memcpy(pp, PyBytes_AS_STRING(pb), plen)
            o = pp + plen
            if ascii:
                if i:
                    w[0] = 44       # ','
                    w += 1
                memcpy(w, PyUnicode_DATA(u), ulen)
                w += ulen
        cdef UserBatch ub = UserBatch.__new__(UserBatch)
        ub.body = out
        ub.uniq_ids = ids
        ub.msgs = s.ms
        ub.topic = s.topic
        ub.wait = s.wait
        return ub


cdef class _BatchScan:
    """What :meth:`MessagePreparer._scan_batch` read of a user batch (internal)."""
    cdef list ms, bodies, uniqs, props, waits, added, added_plain
    cdef str topic
    cdef Py_ssize_t total
    cdef bint wait

    cdef void undo(self):
        """Take back the UNIQ_KEYs the scan set (a refused batch is left as it was given)."""
        cdef dict props
        for props in self.added:
            props.pop(_UNIQ, None)
        for m in self.added_plain:
            (<Message>m)._uniq = None


cdef class UserBatch:
    """A user batch ready for the wire (:meth:`MessagePreparer.encode_user_batch`): ``body``, its
    SEND_BATCH_MESSAGE body (SPEC.md §1.11); ``uniq_ids``, the messages' UNIQ_KEYs comma-joined
    in order (the batch's ``SendResult.msg_id``); ``msgs``, the messages; ``topic``; ``wait``,
    whether every message waits for the store (WAIT_STORE_MSG_OK); ``len()``, the message count."""
    cdef readonly bytes body
    cdef readonly str uniq_ids
    cdef readonly list msgs
    cdef readonly str topic
    cdef readonly bint wait

    def __len__(self):
        return len(self.msgs)

    @property
    def first_uniq_id(self):
        """The first message's UNIQ_KEY."""
        i = self.uniq_ids.find(",")
        return self.uniq_ids if i < 0 else self.uniq_ids[:i]

    def __repr__(self):
        return f"UserBatch(topic={self.topic!r}, messages={len(self.msgs)}, bytes={len(self.body)})"


# -- batch bodies (SPEC.md §1.11) ------------------------------------------------------------------
def all_wait(preps):
    """Whether every one of ``preps`` (:class:`PreparedMessage`) waits for the store
    (WAIT_STORE_MSG_OK of their request): True for an empty list."""
    cdef PreparedMessage p
    for p in preps:
        if not p.wait:
            return False
    return True


def batch_body(list preps):
    """The SEND_BATCH_MESSAGE body of ``preps`` (:class:`PreparedMessage`): per message
    TOTALSIZE 4 | MAGIC 4 (0) | BODYCRC 4 (0) | FLAG 4 | BODYLEN 4 + BODY | PROPLEN 2 + PROPS.

    Raises
    ------
    MessageIllegalError
        Properties longer than 32767 bytes (PROPERTIES_SIZE_EXCEEDED).
    """
    cdef Py_ssize_t total = 0, n, blen, plen
    cdef PreparedMessage p
    for p in preps:
        if len(p.props) > PROPERTIES_MAX_LENGTH:
            raise MessageIllegalError(
                f"properties are {len(p.props)} bytes, over the {PROPERTIES_MAX_LENGTH}-byte limit",
                "PROPERTIES_SIZE_EXCEEDED")
        total += BATCH_FIXED_LENGTH + PyBytes_GET_SIZE(p.body) + PyBytes_GET_SIZE(p.props)
    cdef bytes out = PyBytes_FromStringAndSize(NULL, total)
    cdef unsigned char* o = <unsigned char*>PyBytes_AS_STRING(out)
    for p in preps:
        blen = PyBytes_GET_SIZE(p.body)
        plen = PyBytes_GET_SIZE(p.props)
        o = put_batch_element(o, BATCH_FIXED_LENGTH + blen + plen, <int32_t>p.msg.flag, PyBytes_AS_STRING(p.body),
                              blen, plen)
        memcpy(o, PyBytes_AS_STRING(p.props), plen)
        o += plen
    return out


# -- rows given as columns (Producer.send_async_columns) ----------------------------------------------
cdef bytes _UNIQ_PREFIX = (PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX + "\x01").encode()
cdef bytes _TAGS_PREFIX = (PROPERTY_TAGS + "\x01").encode()
cdef bytes _KEYS_PREFIX = (PROPERTY_KEYS + "\x01").encode()
# property names a row's own properties may not use: the producer sets them (or they would make
# the row unbatchable: a delay, a timer, a half message)
COLUMNS_REFUSED_PROPERTIES = frozenset(RESERVED_PROPERTIES + (PROPERTY_TRANSACTION_PREPARED, PROPERTY_SHARDING_KEY))
cdef frozenset _COLUMNS_REFUSED = COLUMNS_REFUSED_PROPERTIES
cdef tuple _ROW_KEY_TYPES = (str, int, bytes)   # sharding keys grouped by value (as many_parts' open keys)


@cython.final
cdef class RowsPart:
    """Rows of one ``send_async_columns`` call that go as one SEND_BATCH_MESSAGE: ``body`` is
    the batch body (SPEC.md §1.11) of ``n`` rows, ``nbytes`` its length, ``positions`` the rows'
    indices in the call (in the order sent), ``key`` their sharding key (None: unordered),
    ``uniq`` the rows' UNIQ_KEYs (32 hex digits each, in order).  ``len(part)`` is ``n``."""

    cdef readonly str topic
    cdef readonly object key
    cdef readonly object positions
    cdef readonly bytes body
    cdef readonly bytes uniq
    cdef readonly Py_ssize_t n
    cdef readonly Py_ssize_t nbytes

    def __len__(self):
        return self.n

    def uniq_ids(self):
        """The rows' UNIQ_KEYs (``msg_id`` of their SendResult), as a list of str."""
        return split_uniq_ids(self.uniq)

    def split(self, Py_ssize_t limit):
        """The rows as consecutive parts of at most ``limit`` body bytes each (a broker refused the
        whole as over its maxMessageSize): ``[RowsPart]`` in order, same topic and key; a row
        larger than ``limit`` is a part of its own (the broker judges it alone).

        Raises
        ------
        ValueError
            ``limit`` < 1, or the body is not ``n`` whole batch elements (SPEC.md §1.11).
        """
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        cdef const unsigned char* o = <const unsigned char*>PyBytes_AS_STRING(self.body)
        cdef Py_ssize_t total = PyBytes_GET_SIZE(self.body), at = 0, start = 0, first = 0, j = 0, size
        cdef list out = []
        while j < self.n:
            if total - at < BATCH_FIXED_LENGTH:
                raise ValueError(f"row {j} of {self.n}: truncated batch element at byte {at}")
            size = load_be32(o + at + BATCH_TOTAL_SIZE_OFFSET)
            if size < BATCH_FIXED_LENGTH or size > total - at:
                raise ValueError(f"row {j} of {self.n}: batch element of {size} bytes at byte {at}")
            if at > start and at + size - start > limit:
                out.append(self._slice(first, j, start, at))
                start, first = at, j
            at += size
            j += 1
        if at != total:
            raise ValueError(f"{total - at} bytes after the {self.n} rows' batch elements")
        if j > first:
            out.append(self._slice(first, j, start, at))
        return out

    cdef RowsPart _slice(self, Py_ssize_t a, Py_ssize_t b, Py_ssize_t lo, Py_ssize_t hi):
        cdef RowsPart part = RowsPart.__new__(RowsPart)
        part.topic = self.topic
        part.key = self.key
        part.positions = self.positions[a:b]
        part.n = b - a
        part.nbytes = hi - lo
        part.body = self.body[lo:hi]
        part.uniq = self.uniq[a * _UNIQ_LEN:b * _UNIQ_LEN]
        return part

    def __repr__(self):
        return f"RowsPart(topic={self.topic!r}, n={self.n}, nbytes={self.nbytes}, key={self.key!r})"


cpdef list split_uniq_ids(bytes uniq):
    """``uniq`` (UNIQ_KEYs of 32 ASCII hex digits each, back to back, as :class:`RowsPart` holds
    them) as a list of str, built in C.

    Raises
    ------
    ValueError
        ``uniq`` is not a whole number of ids.
    """
    cdef Py_ssize_t n = PyBytes_GET_SIZE(uniq), i
    if n % _UNIQ_LEN:
        raise ValueError(f"{n} bytes are not a whole number of {_UNIQ_LEN}-digit UNIQ_KEYs")
    cdef const char* u = PyBytes_AS_STRING(uniq)
    cdef list out = []
    cdef str s
    for i in range(n // _UNIQ_LEN):
        s = PyUnicode_New(_UNIQ_LEN, 127)
        memcpy(PyUnicode_DATA(s), u + i * _UNIQ_LEN, _UNIQ_LEN)
        out.append(s)
    return out


cpdef str join_uniq_ids(list preps):
    """The UNIQ_KEYs of ``preps`` (PreparedMessages) comma-joined, in order: a user batch's
    ``SendResult.msg_id`` (RocketMQ's batch msgId), copied in C into one str (``",".join`` of a
    list of the ids costs a list and a reference per message)."""
    cdef Py_ssize_t n = len(preps), i, total = 0, k
    cdef PreparedMessage p
    if n == 0:
        return ""
    for i in range(n):
        p = preps[i]
        if p.uniq_id is None or not PyUnicode_IS_COMPACT_ASCII(p.uniq_id):   # not a str, or not ASCII
            return ",".join([(<PreparedMessage>q).uniq_id for q in preps])
        total += PyUnicode_GET_LENGTH(p.uniq_id)
    cdef str out = PyUnicode_New(total + n - 1, 127)
    cdef char* w = <char*>PyUnicode_DATA(out)
    for i in range(n):
        p = preps[i]
        if i:
            w[0] = 44       # ','
            w += 1
        k = PyUnicode_GET_LENGTH(p.uniq_id)
        memcpy(w, PyUnicode_DATA(p.uniq_id), k)
        w += k
    return out


cdef inline const char* _utf8(object s, Py_ssize_t* n, str what) except NULL:
    """``s`` (a str) as UTF-8; a \x01 / \x02 separator inside is MessageIllegalError."""
    cdef const char* p = PyUnicode_AsUTF8AndSize(s, n)
    if _has_separator(p, n[0]):
        raise MessageIllegalError(f"{what} {s!r} contains a \\x01 or \\x02 separator")
    return p


def encode_rows(MessagePreparer preparer, str topic, list bodies, list tags, list keys, list properties,
                list sharding_keys, str key_property, Py_ssize_t batch_size, part_key):
    """Rows given as columns (one item per row in each list; a list given as None: absent for
    every row) straight into SEND_BATCH_MESSAGE bodies, without a Message or a PreparedMessage per
    row: returns ``[RowsPart]`` in the order each part was opened.

    Row ``i`` is what ``Message(topic, bodies[i], tags=tags[i], keys=keys[i],
    properties=properties[i])`` would send, with ``key_property`` = ``str(sharding_keys[i])``
    when that key is not None, and a new UNIQ_KEY; its properties in that order (SPEC.md §1.6).
    Rows of one sharding key share parts up to ``batch_size`` bytes (a row bigger than that is
    a part of its own), in the order given; unordered rows (key None) likewise.  ``part_key``
    groups keys that are not str / int / bytes, as :func:`many_parts`.  Bodies are not
    compressed (a batch's never are, as RocketMQ's).

    Raises
    ------
    preparer's error_type (MESSAGE_ILLEGAL)
        The topic is invalid, or the first bad row, its remark prefixed ``message i of n: ``:
        a body that is not bytes / bytearray / memoryview, empty or over ``max_message_size``; a
        tag or key that is not str (keys: or a list of str); properties that are not a dict, or
        that name a property the producer sets (:data:`COLUMNS_REFUSED_PROPERTIES`); a \x01 /
        \x02 separator; encoded properties over 32767 bytes.
    """
    preparer.check_topic_once(topic)
    # the columns as given: Python code this call runs (a key's __str__, __hash__ or __eq__, a
    # finalizer) may change the caller's lists, and they are read without bounds checks
    bodies = bodies[:]
    tags = None if tags is None else tags[:]
    keys = None if keys is None else keys[:]
    properties = None if properties is None else properties[:]
    sharding_keys = None if sharding_keys is None else sharding_keys[:]
    cdef Py_ssize_t n = len(bodies)
    if n == 0:
        return []
    for col in (tags, keys, properties, sharding_keys):
        if col is not None and len(<list>col) != n:
            raise ValueError(f"a column has {len(<list>col)} items for {n} bodies")
    cdef _Row* rows = <_Row*>PyMem_Calloc(n, sizeof(_Row))
    cdef _Part* groups = <_Part*>PyMem_Malloc(n * sizeof(_Part))
    if rows == NULL or groups == NULL:
        PyMem_Free(rows)
        PyMem_Free(groups)
        raise MemoryError()
    try:
        gkeys = _rows_pass(preparer, topic, bodies, tags, keys, properties, sharding_keys, key_property,
                           batch_size, part_key, rows, groups, n)
        return _rows_parts(topic, key_property, rows, groups, gkeys)
    finally:
        _release_rows(rows, n)
        PyMem_Free(rows)
        PyMem_Free(groups)


cdef struct _Row:
    # one row of encode_rows; every object pointer is a reference the row holds (pass 2 reads
    # their buffers, and Python code run in between, a GC finalizer say, could drop the columns')
    PyObject* body          # bytes
    PyObject* props         # the encoded user properties (bytes), or NULL
    PyObject* tag           # str, or NULL
    PyObject* keys          # str, or a tuple (a list of keys, copied when sized), or NULL
    PyObject* shard         # str, or NULL
    Py_ssize_t kl           # bytes of the KEYS value
    Py_ssize_t size         # the batch element's bytes
    Py_ssize_t next         # the next row of its part; -1: the last


cdef struct _Part:
    Py_ssize_t head, tail, count, nbytes      # rows head..tail (a chain), in increasing order


cdef void _release_rows(_Row* rows, Py_ssize_t n) noexcept:
    cdef Py_ssize_t i
    for i in range(n):
        Py_XDECREF(rows[i].body)
        Py_XDECREF(rows[i].props)
        Py_XDECREF(rows[i].tag)
        Py_XDECREF(rows[i].keys)
        Py_XDECREF(rows[i].shard)


cdef inline PyObject* _hold(object o) noexcept:
    Py_INCREF(o)
    return <PyObject*>o


cdef list _rows_pass(MessagePreparer preparer, str topic, list bodies, list tags, list keys, list properties,
                      list sharding_keys, str key_property, Py_ssize_t batch_size, part_key, _Row* rows,
                      _Part* groups, Py_ssize_t n):
    """encode_rows' first pass: every row checked and sized into ``rows``, and grouped into parts
    (``groups``, each a chain of rows through ``_Row.next``); returns each part's sharding key."""
    cdef Py_ssize_t i = 0, blen, plen, tl, sl, ng = 0, gi, last_g = -1, size
    cdef Py_ssize_t klen_prefix = len(key_property) + 1
    cdef Py_ssize_t tags_prefix = PyBytes_GET_SIZE(_TAGS_PREFIX), keys_prefix = PyBytes_GET_SIZE(_KEYS_PREFIX)
    cdef Py_ssize_t base = _UNIQ_LEN + PyBytes_GET_SIZE(_UNIQ_PREFIX) + 1
    cdef list gkeys = []                 # each part's sharding key
    cdef dict open_ = {}                 # grouping key -> the part rows of that key join
    cdef object b, up, t, k, sk, gk, last_gk = None, name, v
    cdef _Row* r
    cdef _Part* g
    try:
        for i in range(n):
            r = &rows[i]
            r.next = -1
            b = bodies[i]
            if type(b) is not bytes:
                if not isinstance(b, (bytes, bytearray, memoryview)):
                    raise preparer.error_type(f"message body must be bytes, got {type(b).__name__}",
                                              preparer.illegal_code)
                b = bytes(b)
            blen = PyBytes_GET_SIZE(b)
            if blen == 0:
                raise preparer.error_type("the message body length is zero", preparer.illegal_code)
            if blen > preparer.max_message_size:
                raise preparer.error_type(f"the message body size over max value, MAX: {preparer.max_message_size} "
                                          f"(body is {blen} bytes; topic {topic})", preparer.illegal_code)
            r.body = _hold(b)
            plen = base
            if properties is not None:
                up = properties[i]
                if up:
                    if not isinstance(up, dict):
                        raise preparer.error_type(f"message properties must be a dict, got {type(up).__name__}",
                                                  preparer.illegal_code)
                    for name in <dict>up:
                        if name in _COLUMNS_REFUSED or name == key_property:
                            raise preparer.error_type(
                                f"property {name!r} is set by the producer (tags / keys / sharding_keys "
                                f"columns), or needs send_async (delay, timer, wait, transaction)",
                                preparer.illegal_code)
                    up = encode_properties(up)
                    r.props = _hold(up)
                    plen += PyBytes_GET_SIZE(up)
            if tags is not None:
                t = tags[i]
                if t:
                    if type(t) is not str:
                        raise preparer.error_type(f"a tag must be a str, got {type(t).__name__}", preparer.illegal_code)
                    _utf8(t, &tl, "tag")
                    r.tag = _hold(t)
                    plen += tags_prefix + tl + 1
            if keys is not None:
                k = keys[i]
                if k:
                    if type(k) is str:
                        _utf8(k, &r.kl, "keys")
                    elif type(k) is list or type(k) is tuple:
                        k = tuple(k)             # pass 2 writes what was sized here
                        r.kl = len(<tuple>k) - 1                       # the separators
                        for name in <tuple>k:
                            if type(name) is not str:
                                raise preparer.error_type(f"a key must be a str, got {type(name).__name__}",
                                                          preparer.illegal_code)
                            _utf8(name, &tl, "key")
                            r.kl += tl
                    else:
                        raise preparer.error_type(f"keys must be a str or a list of str, got {type(k).__name__}",
                                                  preparer.illegal_code)
                    r.keys = _hold(k)
                    plen += keys_prefix + r.kl + 1
            sk = None
            if sharding_keys is not None:
                sk = sharding_keys[i]
                if sk is not None:
                    k = sk if type(sk) is str else str(sk)
                    _utf8(k, &sl, "sharding key")
                    r.shard = _hold(k)
                    plen += klen_prefix + sl + 1
            if plen > PROPERTIES_MAX_LENGTH:
                raise preparer.error_type(f"properties are {plen} bytes, over the {PROPERTIES_MAX_LENGTH}-byte limit",
                                          preparer.illegal_code)
            size = BATCH_FIXED_LENGTH + blen + plen
            r.size = size
            gk = sk if (sk is None or type(sk) in _ROW_KEY_TYPES) else part_key(topic, sk)
            # the part of the row before, when the key is the same (one dict lookup less a row)
            if last_g >= 0 and (gk is last_gk or (type(gk) is str and type(last_gk) is str and
                                                  <str>gk == <str>last_gk)):
                gi = last_g
            else:
                v = open_.get(gk)
                gi = -1 if v is None else <Py_ssize_t>v
            if gi >= 0 and groups[gi].nbytes + size > batch_size:
                gi = -1
            if gi < 0:
                gi = ng
                ng += 1
                g = &groups[gi]
                g.head = g.tail = i
                g.count = 1
                g.nbytes = size
                open_[gk] = gi
                gkeys.append(sk)
            else:
                g = &groups[gi]
                rows[g.tail].next = i
                g.tail = i
                g.count += 1
                g.nbytes += size
            last_gk = gk
            last_g = gi
    except MessageIllegalError as e:
        raise preparer.error_type(f"message {i} of {n}: {e}", preparer.illegal_code) from None
    except Exception as e:
        if isinstance(e, preparer.error_type):
            raise preparer.error_type(f"message {i} of {n}: {e.remark}", e.response_code) from e
        raise
    return gkeys


cdef list _rows_parts(str topic, str key_property, _Row* rows, _Part* groups, list gkeys):
    """encode_rows' second pass: each part's batch body and UNIQ_KEYs, written from ``rows``."""
    cdef bytes key_prefix = (key_property + "\x01").encode()
    cdef Py_ssize_t gi, i, j, m, total, blen, ul = PyBytes_GET_SIZE(_UNIQ_PREFIX), made = 0, props
    cdef Py_ssize_t ng = len(gkeys)
    cdef uint32_t ms = 0
    cdef list parts = [], positions
    cdef RowsPart part
    cdef _Row* r
    cdef _Part* g
    cdef unsigned char* o
    cdef char* u
    for gi in range(ng):
        g = &groups[gi]
        m = g.count
        total = g.nbytes
        part = RowsPart.__new__(RowsPart)
        part.topic = topic
        part.key = gkeys[gi]
        if g.tail - g.head == m - 1:           # rows in increasing order: consecutive ones
            part.positions = range(g.head, g.head + m)
        else:
            positions = [None] * m
            i = g.head
            for j in range(m):
                positions[j] = i
                i = rows[i].next
            part.positions = positions
        part.n = m
        part.nbytes = total
        part.body = PyBytes_FromStringAndSize(NULL, total)
        part.uniq = PyBytes_FromStringAndSize(NULL, m * _UNIQ_LEN)
        o = <unsigned char*>PyBytes_AS_STRING(part.body)
        u = PyBytes_AS_STRING(part.uniq)
        i = g.head
        for j in range(m):
            r = &rows[i]
            blen = PyBytes_GET_SIZE(<object>r.body)
            o = put_batch_element(o, r.size, 0, PyBytes_AS_STRING(<object>r.body), blen,
                                  r.size - BATCH_FIXED_LENGTH - blen)
            if r.props != NULL:
                props = PyBytes_GET_SIZE(<object>r.props)
                memcpy(o, PyBytes_AS_STRING(<object>r.props), props)
                o += props
            if r.tag != NULL:
                o = _put_property(o, _TAGS_PREFIX, <str>r.tag)
            if r.keys != NULL:
                if type(<object>r.keys) is str:
                    o = _put_property(o, _KEYS_PREFIX, <str>r.keys)
                else:
                    o = _put_keys(o, <object>r.keys)
            if r.shard != NULL:
                o = _put_property(o, key_prefix, <str>r.shard)
            memcpy(o, PyBytes_AS_STRING(_UNIQ_PREFIX), ul)
            if made % _IDS_PER_CLOCK_READ == 0:     # one clock read for many ids (the counter tells them apart)
                ms = _uniq_ms()
            made += 1
            _write_uniq_id_at(<char*>o + ul, ms)
            memcpy(u + j * _UNIQ_LEN, o + ul, _UNIQ_LEN)
            o[ul + _UNIQ_LEN] = 2
            o += ul + _UNIQ_LEN + 1
            i = r.next
        if o != <unsigned char*>PyBytes_AS_STRING(part.body) + total:     # the sizes of pass 1 are the bytes written
            raise AssertionError(f"encode_rows wrote {<Py_ssize_t>(o - <unsigned char*>PyBytes_AS_STRING(part.body))} "
                                 f"bytes of {total}")
        parts.append(part)
    return parts


cdef unsigned char* _put_keys(unsigned char* o, object keys) except NULL:
    """``KEYS \x01`` + the keys (a list or tuple of str) joined by KEY_SEPARATOR + ``\x02``."""
    cdef Py_ssize_t pl = PyBytes_GET_SIZE(_KEYS_PREFIX), vl
    cdef const char* v
    cdef bint first = True
    memcpy(o, PyBytes_AS_STRING(_KEYS_PREFIX), pl)
    o += pl
    for key in keys:
        if not first:
            o[0] = 32                    # KEY_SEPARATOR
            o += 1
        first = False
        v = PyUnicode_AsUTF8AndSize(key, &vl)
        memcpy(o, v, vl)
        o += vl
    o[0] = 2
    return o + 1


cdef inline unsigned char* _put_property(unsigned char* o, bytes prefix, str value) except NULL:
    """``prefix`` (``NAME \x01``) + ``value`` (UTF-8) + ``\x02`` at ``o``; returns the end."""
    cdef Py_ssize_t pl = PyBytes_GET_SIZE(prefix), vl
    cdef const char* v = PyUnicode_AsUTF8AndSize(value, &vl)
    memcpy(o, PyBytes_AS_STRING(prefix), pl)
    memcpy(o + pl, v, vl)
    o[pl + vl] = 2
    return o + pl + vl + 1


# -- completion (the producer's I/O thread) --------------------------------------------------------
from concurrent.futures import Future as _Future, InvalidStateError as _InvalidStateError
from concurrent.futures._base import FINISHED as _FINISHED, LOGGER as _LOGGER

cdef object _future_set_result = _Future.set_result
cdef object _future_set_exception = _Future.set_exception
from concurrent.futures._base import RUNNING as _RUNNING
from types import MemberDescriptorType as _MemberDescriptorType


# -- objects made field by field ---------------------------------------------------------------
# A SendFuture per send_async message and a SendResult per answered message: made through their
# classes, each costs a type call, an __init__ frame (or a setattr per field: a descriptor look-up
# each), and its completion an attribute look-up per slot read or written.  Both classes keep
# every field in a ``__slots__`` slot (an object pointer at a fixed offset in the instance,
# CPython's T_OBJECT_EX member), so for exactly these classes C allocates the instance as
# ``object.__new__`` would (the type's tp_alloc) and reads and writes the slots at their offsets,
# read once from the class's member descriptors.  A class whose fields are not all such slots, or
# that has a ``__new__`` of its own, goes through its own Python path (a :class:`_Layout` is
# None).  The C paths do what the Python ones do, field for field:
# ``tests/unit/test_slot_layouts.py``.
@cython.final
cdef class _Layout:
    """Where each named field of ``cls`` lives in its instances (byte offsets of its slots)."""
    cdef object cls
    cdef Py_ssize_t n
    cdef Py_ssize_t off[8]


cdef _Layout _layout_of(cls, tuple names):
    """The layout of ``names`` (at most 8) in instances of ``cls``, or None when one of them is
    not a writable object slot defined by ``cls`` itself, or ``cls`` makes its instances with a
    ``__new__`` other than ``object``'s, or reads or writes attributes through methods of its
    own (``__getattribute__``, ``__setattr__``: the slot path would go round them)."""
    cdef _Layout lay
    cdef PyMemberDef* m
    cdef Py_ssize_t i
    if not isinstance(cls, type) or cls.__new__ is not object.__new__ or len(names) > 8 \
            or cls.__setattr__ is not object.__setattr__ or cls.__getattribute__ is not object.__getattribute__:
        return None
    lay = _Layout.__new__(_Layout)
    lay.cls = cls
    lay.n = len(names)
    for i in range(lay.n):
        d = cls.__dict__.get(names[i])
        if type(d) is not _MemberDescriptorType:
            return None
        m = (<PyMemberDescrObject*><PyObject*>d).d_member
        if m.type != T_OBJECT_EX or m.flags & READONLY:
            return None
        lay.off[i] = m.offset
    return lay


cdef inline object _alloc(_Layout lay):
    """A new instance of ``lay.cls`` with every slot unset, as ``object.__new__(cls)`` makes it
    (tracked by the cyclic GC when the type is a GC type)."""
    cdef PyObject* o = (<_TypeObject*><PyObject*>lay.cls).tp_alloc(<void*><PyObject*>lay.cls, 0)
    if o == NULL:
        raise MemoryError()
    r = <object>o          # a new reference of ours: the cast took one more
    Py_DECREF(r)
    return r


cdef inline void _put(object obj, Py_ssize_t off, object v):
    cdef PyObject** slot = <PyObject**>((<char*><PyObject*>obj) + off)
    cdef PyObject* old = slot[0]
    Py_INCREF(v)
    slot[0] = <PyObject*>v
    Py_XDECREF(old)


cdef inline object _get(object obj, Py_ssize_t off):
    """A slot's value; AttributeError for an unset one, as the member descriptor would."""
    cdef PyObject* v = (<PyObject**>((<char*><PyObject*>obj) + off))[0]
    if v == NULL:
        raise AttributeError(f"slot at offset {off} of {type(obj).__name__} is not set")
    return <object>v


# SendFuture: the slots rmq.client.futures.SendFuture declares, in this order
cdef tuple _FUTURE_SLOTS = ("_state", "_result", "_exception", "_cb", "_cond", "_w", "_cbs")
DEF F_STATE = 0
DEF F_RESULT = 1
DEF F_EXCEPTION = 2
DEF F_CB = 3
DEF F_COND = 4
DEF F_W = 5
DEF F_CBS = 6
DEF LAYOUTS_MAX = 64                     # classes a _Layouts remembers (past it: worked out each time)


@cython.final
cdef class _Layouts:
    """The layout of ``names`` in instances of each class asked about (:func:`_layout_of`, None
    included), worked out once per class; the last class asked about is answered first (one
    class per call site in practice: SendFuture, SendResult, Pending, rmq.aio's _Batch)."""
    cdef tuple names
    cdef object last_cls
    cdef _Layout last
    cdef dict by_cls

    def __init__(self, tuple names):
        self.names = names
        self.by_cls = {}

    cdef inline _Layout of(self, cls):
        if cls is self.last_cls:
            return self.last
        cdef _Layout lay
        if cls in self.by_cls:
            lay = self.by_cls[cls]
        else:
            lay = _layout_of(cls, self.names)
            if len(self.by_cls) < LAYOUTS_MAX:
                self.by_cls[cls] = lay
        self.last_cls, self.last = cls, lay
        return lay


cdef _Layouts _FUTURE_LAYOUTS = _Layouts(_FUTURE_SLOTS)
# SendResult (a slots dataclass): its fields, in declaration order
cdef _Layouts _RESULT_LAYOUTS = _Layouts(("status", "msg_id", "message_queue", "queue_offset", "offset_msg_id",
                                          "region_id"))
cdef _Layouts _PENDING_LAYOUTS = _Layouts(("preps", "futures", "nbytes"))        # a caller-side batch
cdef _Layouts _AIO_BATCH_LAYOUTS = _Layouts(("preps", "futures", "callbacks", "nbytes"))   # rmq.aio's _Batch


cpdef new_send_future(cls, callback):
    """``cls(callback)`` for :class:`rmq.client.futures.SendFuture`, made in C: RUNNING, no
    result, exception, condition, waiters or callback list, ``callback`` its one done-callback,
    out of the cyclic GC (what ``SendFuture.__init__`` does).  Any other class is called."""
    cdef _Layout lay = _FUTURE_LAYOUTS.of(cls)
    if lay is None:
        return cls(callback)
    f = _alloc(lay)
    _put(f, lay.off[F_STATE], _RUNNING)
    _put(f, lay.off[F_RESULT], None)
    _put(f, lay.off[F_EXCEPTION], None)
    _put(f, lay.off[F_CB], callback)
    _put(f, lay.off[F_COND], None)
    _put(f, lay.off[F_W], None)
    _put(f, lay.off[F_CBS], None)
    if PyObject_GC_IsTracked(f):
        PyObject_GC_UnTrack(<void*>f)
    return f


cpdef track_done(obj):
    """Track ``obj`` in the cyclic GC again after :func:`untrack_pending` (no-op if tracked, or
    not of a GC type)."""
    if PyObject_IS_GC(obj) and not PyObject_GC_IsTracked(obj):
        PyObject_GC_Track(<void*>obj)


def pending_callback(fut, callback, ctx):
    """``(fut, callback, ctx)``, the tuple untracked like ``fut`` (:func:`untrack_pending`): an
    asyncio send_async's callback entry, held by its producer until the request ends
    (:func:`track_done` the future before the callback runs).

    ``ctx`` (a ``contextvars.Context``) stays tracked: CPython 3.11 frees a Context assuming the
    cyclic GC tracks it (``context_tp_dealloc`` untracks it with the unchecked internal macro),
    so one freed untracked crashed the interpreter -- an aio producer dropped with send_async
    messages still queued (never closed) took its entries' contexts with it
    (``tests/unit/test_aio_append.py``, the abandoned producer).  The tuple, the future
    (asyncio's and SendFuture's deallocs untrack with the checked call) may be freed untracked."""
    t = (fut, callback, ctx)
    PyObject_GC_UnTrack(<void*>t)
    return t


cpdef untrack_pending(fut):
    """Take a new :class:`rmq.client.futures.SendFuture` out of the cyclic GC until it completes
    (:func:`finish_future` tracks it again, before anything else).  A pending future is owned by
    its producer, so it cannot be cyclic garbage; untracked, the collections that a stream of
    ``send_async`` calls sets off (one gen-0 pass per 700 new futures, their survivors carried
    into gen 1 and 2) do not walk the futures in flight.  Only a GC-tracked object is untracked."""
    if PyObject_GC_IsTracked(fut):
        PyObject_GC_UnTrack(<void*>fut)


def set_results(list futures, list results, bint track):
    """``futures[i].set_result(results[i])`` for asyncio futures (rmq.aio's send_async): a None
    slot (a send_async_many message) skipped, a future its owner cancelled left as it is; each
    tracked by the cyclic GC again first when ``track`` (:func:`untrack_pending`)."""
    cdef Py_ssize_t i, n = min(len(futures), len(results))
    for i in range(n):
        f = futures[i]
        if f is None:
            continue
        if track:
            track_done(f)
        if not f.done():
            f.set_result(results[i])


cpdef finish_future(fut, result, exc):
    """Complete a :class:`rmq.client.futures.SendFuture` (its protocol: see that module):
    publish FINISHED, notify a condition if one exists, then run the callbacks.

    Raises
    ------
    concurrent.futures.InvalidStateError
        The future is already finished.
    """
    # attributes (or, for SendFuture itself, its slots at their offsets: :class:`_Layout`), never
    # fut.__dict__: materialising it races the caller's thread on CPython 3.11 (rmq.client.futures'
    # docstring).  The GIL is held from (1) to the callbacks: no Python code runs in between.
    track_done(fut)                      # pending futures are untracked (untrack_pending): a done one
                                         # may join cycles (a callback holding it), collectable again
    cdef _Layout lay = _FUTURE_LAYOUTS.of(type(fut))
    if _fget(fut, lay, F_COND, "_cond") is not None:    # someone may wait on it: the standard path
        if exc is None:
            _future_set_result(fut, result)
        else:
            _future_set_exception(fut, exc)
        return
    if _fget(fut, lay, F_STATE, "_state") == _FINISHED:
        raise _InvalidStateError(f"{fut!r} is already finished")
    _fset(fut, lay, F_RESULT, "_result", result)
    _fset(fut, lay, F_EXCEPTION, "_exception", exc)
    _fset(fut, lay, F_STATE, "_state", _FINISHED)       # (1) published before (2) looks for a condition
    cond = _fget(fut, lay, F_COND, "_cond")             # (2) a waiter / late callback appeared meanwhile
    if cond is not None:
        with cond:
            for w in fut._waiters:
                if exc is None:
                    w.add_result(fut)
                else:
                    w.add_exception(fut)
            cond.notify_all()
    cbs = _fget(fut, lay, F_CBS, "_cbs")                # (3) after (2); the list exists only when asked for
    if cbs is None:
        fn = _fget(fut, lay, F_CB, "_cb")
        if fn is not None:
            _fset(fut, lay, F_CB, "_cb", None)
            try:
                fn(fut)
            except Exception:
                _LOGGER.exception("exception calling callback for %r", fut)
        return
    for fn in cbs:
        try:
            fn(fut)
        except Exception:
            _LOGGER.exception("exception calling callback for %r", fut)


cdef inline object _fget(fut, _Layout lay, int i, str name):
    """A future's field: its slot at its offset with a layout, else the attribute."""
    return _get(fut, lay.off[i]) if lay is not None else getattr(fut, name)


cdef inline int _fset(fut, _Layout lay, int i, str name, value) except -1:
    if lay is not None:
        _put(fut, lay.off[i], value)
    else:
        setattr(fut, name, value)
    return 0


def complete_send_batch(list futures, result_type, status, list preps, mq, Py_ssize_t base, list offset_ids):
    """Message ``i`` of a caller-side batch gets a ``result_type`` (the SendResult dataclass,
    its fields set one by one as its ``__init__`` would: it has no ``__post_init__``) of queue
    offset ``base + i`` and broker id ``offset_ids[i]``, set on ``futures[i]``; a future already
    finished is skipped, and each slot of ``futures`` is set to None once its future is done
    with (a None slot is skipped).  Returns the results (not tracked by the cyclic GC: see
    below)."""
    cdef Py_ssize_t i, n = len(preps)
    cdef PreparedMessage p
    cdef list out = []
    new = result_type.__new__
    region = getattr(result_type, "region_id", "DefaultRegion")
    if not isinstance(region, str):      # a slots dataclass: the default is its field's, not a class attribute
        region = result_type.__dataclass_fields__["region_id"].default
    cdef _Layout lay = _RESULT_LAYOUTS.of(result_type)      # its slots written at their offsets
    for i in range(n):
        p = preps[i]
        if lay is not None:
            r = _alloc(lay)
        else:
            r = new(result_type)
        # a result holds an enum, strs, ints and the request's MessageQueue: never in a cycle, so
        # it stays out of the cyclic GC (one per message: 0.3 us a message of collections in
        # rmq.aio's send_async otherwise, bench/results/client.md stop 46)
        if PyObject_GC_IsTracked(r):
            PyObject_GC_UnTrack(<void*>r)
        if lay is not None:
            _put(r, lay.off[0], status)
            _put(r, lay.off[1], p.uniq_id)
            _put(r, lay.off[2], mq)
            _put(r, lay.off[3], base + i)
            _put(r, lay.off[4], offset_ids[i])
            _put(r, lay.off[5], region)
        else:
            r.status = status
            r.msg_id = p.uniq_id
            r.message_queue = mq
            r.queue_offset = base + i
            r.offset_msg_id = offset_ids[i]
            r.region_id = region
        out.append(r)
        if futures is not None:
            f = futures[i]
            if f is None:
                continue
            try:
                finish_future(f, r, None)
            except _InvalidStateError:
                pass
            # let go of it: a future nobody else holds is freed now, before a collection can see
            # it (finish_future tracked it again; the batch's list would keep it to the end)
            futures[i] = None
    return out


_OPEN_KEY_TYPES = (str, int, bytes)


@cython.final
cdef class _OpenPart:
    """A part of :func:`many_parts` being filled: its messages are the run ``start ..
    start + count`` of the call until one joins out of order (``positions`` then lists them)."""
    cdef list preps
    cdef object key
    cdef Py_ssize_t nbytes, start, count
    cdef list positions

    cdef inline void add(self, Py_ssize_t i, PreparedMessage p) except *:
        if self.positions is not None:
            self.positions.append(i)
        elif i != self.start + self.count:          # a message of another part came between
            self.positions = list(range(self.start, self.start + self.count))
            self.positions.append(i)
        self.count += 1
        self.preps.append(p)
        self.nbytes += p.size

    cdef list out(self):
        return [self.positions if self.positions is not None else list(range(self.start, self.start + self.count)),
                self.preps, self.key, self.nbytes]


cdef inline _OpenPart _open_part(Py_ssize_t i, PreparedMessage p, object key):
    cdef _OpenPart part = _OpenPart.__new__(_OpenPart)
    part.preps = [p]
    part.key = key
    part.nbytes = p.size
    part.start = i
    part.count = 1
    return part


def many_parts(list preps, list keys, Py_ssize_t batch_size, part_key):
    """Split one ``send_async_many`` call into hand-overs: ``[[positions, preps, sharding key or
    None, bytes]]`` in the order each was opened.  Batchable messages of one topic and key share
    a part up to ``batch_size`` bytes (0: batching off, one message per part); every other
    message is a part of its own, and a later message of its key opens a new part (it may not
    overtake it).  Keys group as themselves when of an open-batch type (str, int, bytes: equal
    only when their queue hash is), else by ``part_key(topic, key)``.

    Per message: no tuple, no int object and no dict look-up while the messages come in runs of
    one topic and key (the common call: one topic, no keys); a part's positions are made once,
    at the end."""
    cdef list parts = []                 # _OpenPart or a finished [positions, preps, key, bytes]
    cdef dict open_ = {}
    cdef Py_ssize_t i, n = len(preps)
    cdef PreparedMessage p
    cdef _OpenPart part, last = None     # ``last``: the part of the previous message's group
    cdef object key, gk, topic, msg, last_gk = None
    for i in range(n):
        p = preps[i]
        key = keys[i] if keys is not None else None
        msg = p.msg
        topic = (<Message>msg).topic if type(msg) is Message else msg.topic
        if key is None:
            gk = topic if keys is None else (topic, None)
        elif type(key) in _OPEN_KEY_TYPES:
            gk = (topic, key)
        else:
            gk = part_key(topic, key)
        if batch_size <= 0 or not p.batchable:
            parts.append([[i], [p], key, p.size])
            if key is not None:
                open_.pop(gk, None)
                last = None
            continue
        if last is not None and (gk is last_gk or gk == last_gk):
            part = last
        else:
            part = open_.get(gk)
        if part is None or part.nbytes + p.size > batch_size:
            part = _open_part(i, p, key)
            open_[gk] = part
            parts.append(part)
        else:
            part.add(i, p)
        last, last_gk = part, gk
    for i in range(len(parts)):
        if type(parts[i]) is _OpenPart:
            parts[i] = (<_OpenPart>parts[i]).out()
    return parts


# -- send_async's common case -------------------------------------------------------------------
@cython.final
cdef class CallerAppend:
    """``Producer.send_async``'s common case in one C call (Kafka's RecordAccumulator.append, in
    the caller's thread): prepare the message, make its future, and append both to the open
    caller-side batch of its topic (or topic and sharding key) under the producer's lock.

    The rules are those of ``Producer._append_async`` (rmq.client.producer), which stays the
    path for everything else: this call only takes the case where a batch is open and has room
    for the message, the producer is open, and ``max_pending_messages`` has room.  The lock is
    the sender's ``lock`` (its ``acquire`` / ``release``), so the I/O thread's sealing of a batch
    and its count of unanswered messages see the same states as with the Python path.

    State read: ``closed`` (the producer sets it, under the lock, when it closes); the sender's
    ``running``, ``pending`` (written: + 1), ``open`` and ``batch_size``; the open batch's
    ``preps``, ``futures`` and ``nbytes`` (written).  The sender's plain attributes are read and
    written in its instance dict (``sender.__dict__``, taken when this is made: before the
    sender's thread starts, so no other thread makes that dict at the same time, see
    rmq.client.futures), a batch's through its slots (:class:`_Layout`); a sender without such
    an attribute in its dict, or a batch of a class without such slots, takes the Python path.
    """
    cdef MessagePreparer preparer
    cdef object sender, future_type, acquire, release
    cdef dict state                     # the sender's instance dict
    cdef dict open_                     # the sender's open batches (its ``open``, never replaced)
    cdef Py_ssize_t max_pending
    cdef public bint closed
    cdef object producer_ref            # weakref.ref to the Producer (send_async's other cases)
    cdef dict switches                  # rmq.latency_trace's module dict: its ENABLED

    def __init__(self, sender, MessagePreparer preparer, future_type, Py_ssize_t max_pending,
                 producer_ref=None, dict switches=None):
        self.sender = sender
        self.preparer = preparer
        self.future_type = future_type
        self.acquire = sender.lock.acquire
        self.release = sender.lock.release
        self.state = sender.__dict__
        self.open_ = sender.open
        self.max_pending = max_pending
        self.producer_ref = producer_ref
        self.switches = switches if switches is not None else {}

    def send_async(self, msg, callback=None, *, timeout_ms=None, selector=None, arg=None, sharding_key=None,
                   queue=None):
        """``Producer.send_async`` with the Python frame of its common case left out: a producer
        without message trace, with batching on, binds this as its instance's ``send_async``
        (rmq.client.producer).  The common case (no selector, queue or timeout; no sharding key,
        or one of an open-batch type: str, int, bytes; latency tracing off) is :meth:`send`, its
        fallbacks ``Producer._send_async_rest``; every other call is the class's
        ``Producer.send_async``, whose docstring this follows (same arguments, results, errors).

        Raises
        ------
        MQClientError
            As ``Producer.send_async``; "producer ... is closed" once the producer is gone.
        """
        cdef object producer
        if selector is None and queue is None and timeout_ms is None and self.switches.get("ENABLED") is not True \
                and (sharding_key is None or type(sharding_key) is str or type(sharding_key) is int
                     or type(sharding_key) is bytes):
            r = self.send(msg, callback, sharding_key)
            if type(r) is not tuple:
                return r
            return self._producer()._send_async_rest(r, callback, sharding_key)
        producer = self._producer()
        return type(producer).send_async(producer, msg, callback, timeout_ms=timeout_ms, selector=selector, arg=arg,
                                         sharding_key=sharding_key, queue=queue)

    cdef object _producer(self):
        """The Producer (held weakly: its finalizer closes it when dropped), or MQClientError."""
        producer = self.producer_ref() if self.producer_ref is not None else None
        if producer is None:
            raise MQClientError("producer is closed")
        return producer

    def send(self, msg, callback, sharding_key=None):
        """The future of ``msg``, appended to its open batch; or ``(prepared message, future)``
        when the common case does not apply and the caller's Python path must take them (its
        future is None for a message that cannot join a batch: compressed, delayed, ...).

        A ``sharding_key`` is first set as the message's SHARDING_KEY property (``str`` of it),
        as ``selector_for`` does on the Python path.

        Raises
        ------
        error_type
            ``MessagePreparer.prepare``'s: nothing was queued.
        """
        if sharding_key is not None and isinstance(msg, Message):
            set_sharding_key(<Message>msg, sharding_key)
        cdef PreparedMessage prep = self.preparer.prepare(msg)
        if not prep.batchable:
            return prep, None
        fut = new_send_future(self.future_type, callback)
        cdef object topic = (<Message>prep.msg).topic if type(prep.msg) is Message else prep.msg.topic
        cdef object key = topic if sharding_key is None else (topic, sharding_key)
        cdef dict s = self.state
        cdef _Layout lay
        cdef Py_ssize_t pending, nbytes
        cdef bint done = False
        self.acquire()
        try:
            running, pend, limit = s.get("running"), s.get("pending"), s.get("batch_size")
            if not self.closed and running is True and pend is not None and limit is not None:
                pending = pend
                if pending < self.max_pending:
                    p = self.open_.get(key)
                    if p is not None:
                        lay = _PENDING_LAYOUTS.of(type(p))
                        if lay is not None:
                            preps, futs, nbytes = _get(p, lay.off[0]), _get(p, lay.off[1]), _get(p, lay.off[2])
                        else:
                            preps, futs, nbytes = p.preps, p.futures, p.nbytes
                        if nbytes + prep.size <= <Py_ssize_t>limit and type(preps) is list and type(futs) is list:
                            (<list>preps).append(prep)
                            (<list>futs).append(fut)
                            if lay is not None:
                                _put(p, lay.off[2], nbytes + prep.size)
                            else:
                                p.nbytes = nbytes + prep.size
                            s["pending"] = pending + 1
                            done = True
        finally:
            self.release()
        if done:
            return fut
        return prep, fut


cdef extern from "Python.h":
    object PyContext_CopyCurrent()

cdef extern from *:
    """
    /* the head of CPython's PyContext (Include/internal/pycore_context.h, 3.11 and 3.12):
       ctx_vars is the immutable HAMT of the context's variables; probed at import */
    typedef struct { PyObject_HEAD void *ctx_prev; PyObject *ctx_vars; } rmq_context_head;
    static inline PyObject *rmq_context_vars(PyObject *ctx) { return ((rmq_context_head *)ctx)->ctx_vars; }
    """
    PyObject* rmq_context_vars(object ctx)

cdef extern from "Python.h":
    ctypedef struct _ThreadState "PyThreadState":
        PyObject* context               # the thread's current Context (NULL before the first)
    _ThreadState* PyThreadState_Get()
    object PyContext_Copy(object ctx)
    int PyContext_Enter(object ctx) except -1
    int PyContext_Exit(object ctx) except -1


def _probe_context_layout():
    """Whether :func:`rmq_context_vars` reads a Context's variables here: two copies of one
    context share the HAMT it points at, a set makes another, it is a ``hamt``, and the thread
    state's ``context`` is the context being run."""
    import contextvars
    var = contextvars.ContextVar("rmq_probe")
    ctx = contextvars.Context()

    def probe():
        if PyThreadState_Get().context != <PyObject*>ctx:
            return False
        a, b = PyContext_CopyCurrent(), PyContext_CopyCurrent()
        va = rmq_context_vars(a)
        if va == NULL or va != rmq_context_vars(b) or va != rmq_context_vars(ctx) \
                or type(<object>va).__name__ != "hamt":
            return False
        var.set(1)
        c = PyContext_CopyCurrent()
        return rmq_context_vars(c) != va and rmq_context_vars(ctx) == rmq_context_vars(c) \
            and type(<object>rmq_context_vars(c)).__name__ == "hamt"

    try:
        return bool(ctx.run(probe))
    except Exception:  # noqa: BLE001 - any surprise: no sharing
        return False


cdef bint _SNAPSHOTS = _probe_context_layout()
cdef object _snapshot = None             # the last snapshot handed out (any thread: see below)


cpdef snapshot_context():
    """A ``contextvars.Context`` holding what the caller's context holds now, to run a
    send_async callback in later (as ``add_done_callback`` copies it): the one handed out last
    when the variables are the same object (contexts keep them in an immutable map, so the same
    map is the same contents), else a new copy.  A stream of send_async calls from one context
    shares one snapshot instead of keeping a copy per message in flight (each a tracked object
    the cyclic GC walks: 0.25-0.6 us a message of collections, stop 53).  The snapshot is never
    entered: run each callback in ``snapshot.copy()`` (``rmq.aio.producer._run_callbacks``), so
    what one callback sets is not seen by the next, as with a copy each.  Shared across threads:
    a snapshot with the same map holds the same values whichever thread made it.  Without the
    context layout this was built for (``_probe_context_layout``), a copy every call."""
    global _snapshot
    cdef PyObject* cur = PyThreadState_Get().context
    snap = _snapshot
    if _SNAPSHOTS and cur != NULL and snap is not None and rmq_context_vars(<object>cur) == rmq_context_vars(snap):
        return snap                      # (read in place: no copy made and dropped per call)
    copy = PyContext_CopyCurrent()
    _snapshot = copy
    return copy


def _use_snapshots(bint on):
    """Tests: turn snapshot sharing on or off (off: a copy every call, what a CPython whose
    Context layout fails the probe gets); returns the previous setting.  Turning it on where the
    probe failed is refused (ValueError)."""
    global _SNAPSHOTS, _snapshot
    if on and not _probe_context_layout():
        raise ValueError("this CPython's Context layout failed the probe: snapshots cannot be shared")
    prev, _SNAPSHOTS, _snapshot = _SNAPSHOTS, on, None
    return prev


def run_callbacks(loop, list callbacks):
    """rmq.aio send_async's callbacks of one request, in order: each ``(future, callback,
    snapshot)`` entry's future tracked by the cyclic GC again (:func:`untrack_pending`), then
    ``callback(future)`` run in a copy of the snapshot (:func:`snapshot_context`: what one
    callback sets stays its own).  An exception goes to ``loop.call_exception_handler`` as a
    done-callback's would, and the others still run; SystemExit and KeyboardInterrupt propagate."""
    for fut, cb, ctx in callbacks:
        track_done(fut)
        run_in = PyContext_Copy(ctx)
        PyContext_Enter(run_in)
        try:
            cb(fut)
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as e:  # noqa: BLE001 - a callback's bug is reported, the others still run
            loop.call_exception_handler({"message": f"Exception in send_async callback {cb!r}", "exception": e,
                                         "future": fut})
        finally:
            PyContext_Exit(run_in)


@cython.final
cdef class AioAppend:
    """``rmq.aio.Producer.send_async``'s common case in one C call: prepare the message, make its
    asyncio future (out of the cyclic GC while pending, as the Python path does) and add both to
    its topic's open batch, with the callback's entry (:func:`pending_callback`, in a copy of the
    caller's context); a batch that reaches ``batch_size`` is sealed (out of the open batches, onto
    the ready queue).

    The rules are those of ``Producer._append`` (rmq.aio.producer), which stays the path for
    everything else: this call only takes a batchable message whose topic has an open batch with
    room for it, while ``max_pending_messages`` has room.  Otherwise it returns the prepared
    message and has changed nothing; the caller's Python path goes on from there.  Runs on the
    producer's event loop thread only (the producer is not thread-safe).

    State read: the producer's ``_pending`` (written: + 1), ``_max_pending`` and ``_batch_size``
    in its instance dict, its ``_accs`` (open batches by ``(topic, None)``) and ``_ready``; the
    open batch's ``preps``, ``futures``, ``callbacks`` and ``nbytes`` (written) through its slots;
    for a keyed send, its ``_queue_turns``' map (a queue whose turn is taken is not pumped: its
    batch fills until the answer, whose end pumps it, as ``Producer._pump`` would decide).
    """
    cdef MessagePreparer preparer
    cdef dict state                     # the producer's instance dict
    cdef dict accs                      # its open batches (``_accs``, never replaced)
    cdef object ready_append            # its ``_ready.append``
    cdef object future_type, loop
    cdef object publish_info, pump      # the producer's route_cache.publish_info and _pump
    cdef dict shard_queues              # its ShardQueues' map: (topic, key type, key) -> (info, queue)
    cdef dict turns                     # its QueueTurns' map: MessageQueue -> [requests out, held deque]
    cdef Py_ssize_t turn_limit          # QueueTurns.limit (max_in_flight_per_queue)
    cdef object ready                   # its ``_ready`` deque (sealed batches)

    def __init__(self, producer, MessagePreparer preparer, future_type, loop):
        self.preparer = preparer
        self.state = producer.__dict__
        self.accs = producer._accs
        self.ready_append = producer._ready.append
        self.future_type = future_type
        self.loop = loop
        self.publish_info = producer.route_cache.publish_info
        self.pump = producer._pump
        self.shard_queues = producer._shards._queues
        turns = producer._queue_turns
        self.turns = turns._turns
        self.turn_limit = turns.limit
        self.ready = producer._ready

    def send_keyed(self, msg, callback, key):
        """send_async with a sharding ``key`` of an open-batch type (str, int, bytes): the key set
        as the message's SHARDING_KEY property (``selector_for``), the message prepared, and, when
        its topic's route and the key's queue under it are known (``ShardQueues``' map, the route
        the same object) and that queue has an open batch with room, its future added there
        (:meth:`add`) and the queue's batches pumped while ``max_in_flight`` has room (the Python
        path's ``_pump((topic, queue))``).  Otherwise the PreparedMessage, nothing else done (its
        property set, as the Python path sets it too).

        Raises
        ------
        error_type
            ``MessagePreparer.prepare``'s: nothing was queued.
        """
        if isinstance(msg, Message):
            set_sharding_key(<Message>msg, key)
        cdef PreparedMessage prep = self.preparer.prepare(msg)
        topic = (<Message>prep.msg).topic if type(prep.msg) is Message else prep.msg.topic
        info = self.publish_info(topic)
        if info is None or not info.ok:
            return prep
        hit = self.shard_queues.get((topic, type(key), key))
        if hit is None or type(hit) is not tuple or (<tuple>hit)[0] is not info:
            return prep
        mq = (<tuple>hit)[1]
        fut = self.add(prep, callback, mq)
        if fut is None:
            return prep
        if not self.ready:                   # nothing sealed: is its queue's batch free to go? (QueueTurns.busy)
            t = self.turns.get(mq)
            if t is not None and type(t) is list and len(<list>t) == 2 and type((<list>t)[0]) is int \
                    and ((<list>t)[0] >= self.turn_limit or (<list>t)[1]):
                return fut                   # it fills until its queue's answer (that end pumps it)
        inflight, most = self.state.get("_inflight"), self.state.get("_max_in_flight")
        if type(inflight) is int and type(most) is int and inflight < most:
            self.pump((topic, mq))
        return fut

    def send(self, msg, callback):
        """The future of ``msg`` (appended to its topic's open batch), or its PreparedMessage when
        the common case does not apply (nothing else done).

        Raises
        ------
        error_type
            ``MessagePreparer.prepare``'s: nothing was queued.
        """
        cdef PreparedMessage prep = self.preparer.prepare(msg)
        fut = self.add(prep, callback, None)
        return prep if fut is None else fut

    cpdef add(self, PreparedMessage prep, callback, queue):
        """The future of the prepared ``prep`` appended to the open batch of its topic and
        ``queue`` (an ordered queue, or None), or None when there is none with room for it, the
        message cannot be batched, or ``max_pending_messages`` is reached (nothing done)."""
        if not prep.batchable:
            return None
        cdef dict s = self.state
        pend, most, limit = s.get("_pending"), s.get("_max_pending"), s.get("_batch_size")
        if type(pend) is not int or type(most) is not int or type(limit) is not int or not limit:
            return None
        if pend >= most and pend > 0:
            return None                      # the caller awaits room first
        topic = (<Message>prep.msg).topic if type(prep.msg) is Message else prep.msg.topic
        key = (topic, queue)
        b = self.accs.get(key)
        if b is None:
            return None
        cdef _Layout lay = _AIO_BATCH_LAYOUTS.of(type(b))
        if lay is None:
            return None
        preps, futs, nb = _get(b, lay.off[0]), _get(b, lay.off[1]), _get(b, lay.off[3])
        if type(preps) is not list or type(futs) is not list or type(nb) is not int:
            return None
        cdef Py_ssize_t nbytes = <Py_ssize_t>nb + prep.size
        if nbytes > <Py_ssize_t>limit:
            return None                      # the Python path seals it and opens the next
        fut = self.future_type(loop=self.loop)
        if PyObject_GC_IsTracked(fut):
            PyObject_GC_UnTrack(<void*>fut)
        s["_pending"] = pend + 1
        (<list>preps).append(prep)
        (<list>futs).append(fut)
        if callback is not None:
            cbs = _get(b, lay.off[2])
            if cbs is None:
                cbs = []
                _put(b, lay.off[2], cbs)
            cbs.append(pending_callback(fut, callback, snapshot_context()))
        _put(b, lay.off[3], nbytes)
        if nbytes >= <Py_ssize_t>limit:
            del self.accs[key]
            self.ready_append(b)
        return fut
