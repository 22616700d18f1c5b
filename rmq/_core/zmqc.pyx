# cython: language_level=3, embedsignature=True
"""Multipart send and receive straight through libzmq's C API, for rmq.zmqio.

pyzmq's backend ``Socket.send`` / ``recv`` cost, for every part: a Python-level call with its
argument parsing, a ``zmq.Frame`` object for each received part, a release and re-acquire of
the GIL around ``zmq_msg_send`` / ``zmq_msg_recv`` even when the call cannot block (NOBLOCK),
and a ``zmq.Again`` exception object to learn that nothing more is queued.  On a broker that
answers tens of thousands of small requests a second these are a good part of each request's
cost, and each GIL release lets another thread of the process in.

Here one call sends or receives a whole multipart message:

* non-blocking calls keep the GIL (they only move bytes between this thread and libzmq's
  pipes); a blocking call (flags without NOBLOCK) releases it as pyzmq does;
* a received part is ``bytes``, except the first part and parts of ZERO_COPY_MIN_BYTES or more,
  which are :class:`Part` objects: the libzmq message itself, read in place (buffer protocol,
  ``.bytes``, ``.buffer``) with ``get(property)`` for its connection's metadata (``Peer-Address``,
  ``User-Id``: what rmq.security reads), as ``zmq.Frame`` offers;
* :func:`recv_waiting` drains up to ``limit`` messages and returns ``[]`` when none is queued,
  without an exception;
* :func:`events` reads ZMQ_EVENTS and :func:`closed` the closed flag without pyzmq's method
  call and its ``getsockopt`` probe.

libzmq's functions are found at import in the library pyzmq's backend already loaded (dlsym
through its handle), so this module links against nothing and uses the very libzmq pyzmq
does; :func:`available` is False (and rmq.zmqio keeps pyzmq's path) when they cannot be found
or the libzmq is older than 4.  ``zmq_msg_t`` is libzmq 4's 64-byte opaque message.

A socket is used from one thread at a time, as with pyzmq.  A socket pyzmq has closed raises
``zmq.ZMQError(ENOTSOCK)`` here too (its handle is checked before each call).
"""
cimport cython
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_FillInfo, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.exc cimport PyErr_CheckSignals
from libc.stdint cimport uint64_t, uintptr_t

import zmq

ZERO_COPY_MIN_BYTES = 64 * 1024     # parts this large: received, kept in their message (Part); sent, zero-copy

cdef extern from "<dlfcn.h>" nogil:
    void *dlopen(const char *filename, int flag)
    void *dlsym(void *handle, const char *symbol)
    int RTLD_NOW
    int RTLD_NOLOAD

cdef extern from "<errno.h>" nogil:
    int EINTR
    int EAGAIN
    int ENOTSOCK


ctypedef struct zmq_msg_t:            # libzmq 4: unsigned char _[64], pointer-aligned
    uint64_t _[8]

ctypedef int (*f_msg_init)(zmq_msg_t *) noexcept nogil
ctypedef int (*f_msg_recv)(zmq_msg_t *, void *, int) noexcept nogil
ctypedef void *(*f_msg_data)(zmq_msg_t *) noexcept nogil
ctypedef size_t (*f_msg_size)(const zmq_msg_t *) noexcept nogil
ctypedef int (*f_msg_more)(const zmq_msg_t *) noexcept nogil
ctypedef int (*f_msg_close)(zmq_msg_t *) noexcept nogil
ctypedef int (*f_msg_move)(zmq_msg_t *, zmq_msg_t *) noexcept nogil
ctypedef const char *(*f_msg_gets)(const zmq_msg_t *, const char *) noexcept nogil
ctypedef int (*f_send)(void *, const void *, size_t, int) noexcept nogil
ctypedef int (*f_getsockopt)(void *, int, void *, size_t *) noexcept nogil
ctypedef int (*f_errno)() noexcept nogil
ctypedef void (*f_version)(int *, int *, int *) noexcept nogil

cdef f_msg_init _msg_init = NULL
cdef f_msg_recv _msg_recv = NULL
cdef f_msg_data _msg_data = NULL
cdef f_msg_size _msg_size = NULL
cdef f_msg_more _msg_more = NULL
cdef f_msg_close _msg_close = NULL
cdef f_msg_move _msg_move = NULL
cdef f_msg_gets _msg_gets = NULL
cdef f_send _send = NULL
cdef f_getsockopt _getsockopt = NULL
cdef f_errno _errno = NULL
cdef bint _ready = False

cdef int NOBLOCK = int(zmq.NOBLOCK)
cdef int SNDMORE = int(zmq.SNDMORE)
cdef int ZMQ_EVENTS = int(zmq.EVENTS)
cdef Py_ssize_t _ZC_MIN = ZERO_COPY_MIN_BYTES

_Again = zmq.Again
_ZMQError = zmq.ZMQError
_backend_send = zmq.backend.Socket.send     # zero-copy sends of large parts (a Frame holds the buffer)


cdef void *_sym(void *h, const char *name):
    return dlsym(h, name)


cdef bint _load():
    global _msg_init, _msg_recv, _msg_data, _msg_size, _msg_more, _msg_close, _msg_move, _msg_gets, _send, _errno
    global _getsockopt
    import zmq.backend.cython._zmq as backend
    path = backend.__file__.encode()
    cdef void *h = dlopen(path, RTLD_NOW | RTLD_NOLOAD)
    if h == NULL:
        return False
    cdef f_version version = <f_version>_sym(h, "zmq_version")
    _msg_init = <f_msg_init>_sym(h, "zmq_msg_init")
    _msg_recv = <f_msg_recv>_sym(h, "zmq_msg_recv")
    _msg_data = <f_msg_data>_sym(h, "zmq_msg_data")
    _msg_size = <f_msg_size>_sym(h, "zmq_msg_size")
    _msg_more = <f_msg_more>_sym(h, "zmq_msg_more")
    _msg_close = <f_msg_close>_sym(h, "zmq_msg_close")
    _msg_move = <f_msg_move>_sym(h, "zmq_msg_move")
    _msg_gets = <f_msg_gets>_sym(h, "zmq_msg_gets")
    _send = <f_send>_sym(h, "zmq_send")
    _getsockopt = <f_getsockopt>_sym(h, "zmq_getsockopt")
    _errno = <f_errno>_sym(h, "zmq_errno")
    if (version == NULL or _msg_init == NULL or _msg_recv == NULL or _msg_data == NULL or _msg_size == NULL
            or _msg_more == NULL or _msg_close == NULL or _msg_move == NULL or _msg_gets == NULL or _send == NULL
            or _errno == NULL or _getsockopt == NULL):
        return False
    cdef int major = 0, minor = 0, patch = 0
    version(&major, &minor, &patch)
    return major == 4


try:
    _ready = _load()
except Exception:     # noqa - no pyzmq Cython backend (e.g. the CFFI one): pyzmq's path stays
    _ready = False


def available():
    """True when libzmq's functions were found (module docstring); rmq.zmqio uses this module
    only then."""
    return _ready


cdef inline void *_handle(sock) except NULL:
    cdef uintptr_t h = <uintptr_t>sock.underlying      # pyzmq sets it to NULL when it closes the socket
    if h == 0:
        raise _ZMQError(ENOTSOCK)
    return <void *>h


def closed(sock):
    """Whether pyzmq closed ``sock`` (its handle is gone): the flag ``zmq.Socket.closed`` reads
    before its ``getsockopt`` probe, without the probe."""
    return sock.underlying == 0


def events(sock):
    """``sock``'s ZMQ_EVENTS (POLLIN | POLLOUT bits), as ``sock.getsockopt(zmq.EVENTS)``.

    Raises
    ------
    zmq.ZMQError
        The socket is closed (ENOTSOCK) or libzmq refused.
    """
    cdef void *h = _handle(sock)
    cdef int ev = 0
    cdef size_t size = sizeof(int)
    while _getsockopt(h, ZMQ_EVENTS, &ev, &size) < 0:
        err = _errno()
        if err != EINTR:
            _raise(err)
        PyErr_CheckSignals()
    return ev


cdef int _raise(int err) except -1:
    if err == EAGAIN:
        raise _Again(err)
    raise _ZMQError(err)


@cython.final
@cython.freelist(32)
cdef class Part:
    """A received part kept in its libzmq message (read in place, never copied): a buffer,
    ``len()``, ``.bytes`` (a copy), ``.buffer`` (a memoryview), and ``get(name)`` for the
    connection's metadata property ``name`` (str; ``zmq.ZMQError`` EINVAL when the connection
    has none of that name), as ``zmq.Frame``."""
    cdef zmq_msg_t msg
    cdef bint live

    def __cinit__(self):
        self.live = False

    def __dealloc__(self):
        if self.live:
            _msg_close(&self.msg)

    def __len__(self):
        return <Py_ssize_t>_msg_size(&self.msg)

    def __getbuffer__(self, Py_buffer *view, int flags):
        PyBuffer_FillInfo(view, self, _msg_data(&self.msg), <Py_ssize_t>_msg_size(&self.msg), 1, flags)

    def __releasebuffer__(self, Py_buffer *view):
        pass

    @property
    def bytes(self):
        return PyBytes_FromStringAndSize(<char *>_msg_data(&self.msg), <Py_ssize_t>_msg_size(&self.msg))

    @property
    def buffer(self):
        return memoryview(self)

    def get(self, name):
        cdef bytes key = name.encode() if isinstance(name, str) else bytes(name)
        cdef const char *v = _msg_gets(&self.msg, key)
        if v == NULL:
            _raise(_errno())
        return (<bytes>v).decode()

    def __eq__(self, other):
        if isinstance(other, Part):
            return self.bytes == (<Part>other).bytes
        if isinstance(other, bytes):
            return self.bytes == other
        return NotImplemented

    def __hash__(self):
        return hash(self.bytes)

    def __repr__(self):
        return f"Part({self.bytes[:32]!r}, {len(self)} bytes)"


cdef object _recv_one(void *h, int flags, bint first):
    """One message's parts; None when nothing is queued (NOBLOCK)."""
    cdef list parts = []
    cdef Part part
    cdef zmq_msg_t m
    cdef int rc, err
    cdef Py_ssize_t size
    cdef bint more = True
    cdef bint nonblocking = flags & NOBLOCK
    while more:
        _msg_init(&m)
        while True:
            if nonblocking:
                rc = _msg_recv(&m, h, flags)
            else:
                with nogil:
                    rc = _msg_recv(&m, h, flags)
            if rc >= 0:
                break
            err = _errno()
            if err == EINTR:
                PyErr_CheckSignals()
                continue
            _msg_close(&m)
            if err == EAGAIN and not parts:
                return None
            _raise(err)
        more = _msg_more(&m)
        size = <Py_ssize_t>_msg_size(&m)
        if first or size >= _ZC_MIN:
            # the first part (its connection's metadata) and a large one stay in the message
            part = Part.__new__(Part)
            _msg_init(&part.msg)
            _msg_move(&part.msg, &m)
            part.live = True
            parts.append(part)
        else:
            try:
                parts.append(PyBytes_FromStringAndSize(<char *>_msg_data(&m), size))
            finally:
                _msg_close(&m)
        first = False
    return parts


def recv_parts(sock, int flags=NOBLOCK):
    """Receive one multipart message: its first part a :class:`Part`, the others ``bytes``
    (a :class:`Part` when ZERO_COPY_MIN_BYTES or larger).

    Raises
    ------
    zmq.Again
        ``flags`` has NOBLOCK and no message is queued.
    zmq.ZMQError
        The socket is closed (ENOTSOCK) or libzmq refused.
    """
    cdef object out = _recv_one(_handle(sock), flags, True)
    if out is None:
        raise _Again(EAGAIN)
    return out


def recv_waiting(sock, Py_ssize_t limit):
    """Up to ``limit`` queued messages (each as :func:`recv_parts` gives it), without waiting;
    ``[]`` when none is queued.

    Raises
    ------
    zmq.ZMQError
        As :func:`recv_parts`; messages read before the error are lost with it (a socket error
        is the end of that socket).
    """
    cdef void *h = _handle(sock)
    cdef list out = []
    cdef object msg
    while len(out) < limit:
        msg = _recv_one(h, NOBLOCK, True)
        if msg is None:
            break
        out.append(msg)
    return out


def send_parts(sock, parts, int flags=NOBLOCK):
    """Send ``parts`` (bytes or any buffer: memoryview, bytearray, zmq.Frame, :class:`Part`) as
    one multipart message; parts of ZERO_COPY_MIN_BYTES or more go zero-copy through pyzmq.

    Raises
    ------
    zmq.Again
        ``flags`` has NOBLOCK and the peer's queue is full; nothing was sent when it comes from
        the first part (ZeroMQ queues a multipart message whole).
    zmq.ZMQError
        The socket is closed (ENOTSOCK) or refused (e.g. EHOSTUNREACH on a ROUTER_MANDATORY
        socket for a gone peer).
    """
    cdef void *h = _handle(sock)
    cdef Py_ssize_t i, n = len(parts)
    cdef int f, rc, err
    cdef bint nonblocking = flags & NOBLOCK
    cdef Py_buffer view
    cdef const void *buf
    cdef size_t size
    cdef object p
    for i in range(n):
        p = parts[i]
        f = flags | SNDMORE if i < n - 1 else flags
        if type(p) is bytes:
            if PyBytes_GET_SIZE(p) >= _ZC_MIN:
                _backend_send(sock, p, f, False)
                continue
            buf = PyBytes_AS_STRING(p)
            size = <size_t>PyBytes_GET_SIZE(p)
            rc = _send_retrying(h, buf, size, f, nonblocking)
        else:
            PyObject_GetBuffer(p, &view, PyBUF_SIMPLE)
            try:
                if view.len >= _ZC_MIN:
                    _backend_send(sock, p, f, False)
                    continue
                rc = _send_retrying(h, view.buf, <size_t>view.len, f, nonblocking)
            finally:
                PyBuffer_Release(&view)
        if rc < 0:
            _raise(_errno())


cdef int _send_retrying(void *h, const void *buf, size_t size, int f, bint nonblocking) except? -2:
    cdef int rc
    while True:
        if nonblocking:
            rc = _send(h, buf, size, f)
        else:
            with nogil:
                rc = _send(h, buf, size, f)
        if rc >= 0 or _errno() != EINTR:
            return rc
        PyErr_CheckSignals()
