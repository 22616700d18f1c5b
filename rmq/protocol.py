"""The wire: one frame schema for every rmq socket, request / response codes, limits.

A message is a ZeroMQ multipart message::

    frame 0   b"RMQ1"                      protocol magic + version (MDP style)
    frame 1   msgpack map, the header      {"code", "opaque", "flag", "remark", "fields"}
    frame 2+  raw bodies                   message batches, pulled records: never re-packed

(ROUTER sockets see the peer's identity frames in front; the actor base strips
and restores them.)  The header mirrors RocketMQ's RemotingCommand (SPEC.md
Appendix A): ``code`` is a RequestCode on requests and a ResponseCode on
responses, ``opaque`` pairs a response with its request, ``flag`` bit 0 marks a
response and bit 1 a one-way request, ``fields`` holds the custom header
fields (RocketMQ's ``extFields``).  Codes keep RocketMQ's numbers and names, so
a gateway speaking RocketMQ's TCP remoting is a thin translation.

Decoding never trusts the peer: every size is bounded (MAX_* below), msgpack
runs with explicit Unpacker limits, and a malformed frame raises
:class:`ProtocolError` carrying the ResponseCode to answer with.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Optional, Sequence, Union

import msgpack

from rmq._core import wire as _wire
from rmq.errors import RmqError

PROTOCOL_MAGIC = b"RMQ1"           # frame 0: protocol name + version 1
PROTOCOL_VERSION = 1
MAX_MESSAGE_SIZE = 16 * 1024 * 1024  # whole multipart message, bytes (RocketMQ frameMaxLength)
MAX_HEADER_SIZE = 64 * 1024        # frame 1, bytes
MAX_BODY_PARTS = 64                # frames 2.. of one message
MAX_FIELDS = 256                   # entries of the header's "fields" map
MAX_REMARK_LENGTH = 4096           # characters
# msgpack Unpacker limits for a header: nothing in a header needs more
UNPACK_LIMITS = dict(max_buffer_size=MAX_HEADER_SIZE, max_str_len=MAX_HEADER_SIZE,
                     max_bin_len=MAX_HEADER_SIZE, max_array_len=4096, max_map_len=MAX_FIELDS + 8,
                     max_ext_len=0)
# msgpack.unpackb takes the same limits but the buffer's (decode checks the header's size itself)
_UNPACKB_LIMITS = {k: v for k, v in UNPACK_LIMITS.items() if k != "max_buffer_size"}
_wire.set_limits(UNPACK_LIMITS["max_str_len"], UNPACK_LIMITS["max_bin_len"], UNPACK_LIMITS["max_array_len"],
                 UNPACK_LIMITS["max_map_len"])
# encode's msgpack Packer, one per thread (a Packer is not thread-safe): msgpack.packb builds a new
# one per call, 1.07 against 0.66 us for a POP_MESSAGE header on this VM (timeit)
_PACKERS = threading.local()

FLAG_RESPONSE = 0x1                # RemotingCommand flag bit 0
FLAG_ONEWAY = 0x2                  # RemotingCommand flag bit 1


class RequestCode(IntEnum):
    """RocketMQ's RequestCode numbers (SPEC.md Appendix A), plus rmq's internal ones (>= 9000)."""
    SEND_MESSAGE = 10
    PULL_MESSAGE = 11
    QUERY_MESSAGE = 12
    QUERY_BROKER_OFFSET = 13
    QUERY_CONSUMER_OFFSET = 14
    UPDATE_CONSUMER_OFFSET = 15
    UPDATE_AND_CREATE_TOPIC = 17
    UPDATE_BROKER_CONFIG = 25
    GET_BROKER_CONFIG = 26
    GET_ALL_TOPIC_CONFIG = 21
    GET_BROKER_RUNTIME_INFO = 28
    SEARCH_OFFSET_BY_TIMESTAMP = 29
    GET_MAX_OFFSET = 30
    GET_MIN_OFFSET = 31
    GET_EARLIEST_MSG_STORETIME = 32
    VIEW_MESSAGE_BY_ID = 33
    HEART_BEAT = 34
    UNREGISTER_CLIENT = 35
    CONSUMER_SEND_MSG_BACK = 36
    END_TRANSACTION = 37
    GET_CONSUMER_LIST_BY_GROUP = 38
    CHECK_TRANSACTION_STATE = 39
    NOTIFY_CONSUMER_IDS_CHANGED = 40
    LOCK_BATCH_MQ = 41
    UNLOCK_BATCH_MQ = 42
    GET_ALL_CONSUMER_OFFSET = 43
    GET_ALL_DELAY_OFFSET = 45
    PUT_KV_CONFIG = 100
    REGISTER_BROKER = 103
    UNREGISTER_BROKER = 104
    GET_ROUTEINFO_BY_TOPIC = 105
    GET_BROKER_CLUSTER_INFO = 106
    UPDATE_AND_CREATE_SUBSCRIPTIONGROUP = 200
    GET_ALL_SUBSCRIPTIONGROUP_CONFIG = 201
    GET_TOPIC_STATS_INFO = 202
    GET_CONSUMER_CONNECTION_LIST = 203
    WIPE_WRITE_PERM_OF_BROKER = 205
    GET_ALL_TOPIC_LIST_FROM_NAMESERVER = 206
    DELETE_SUBSCRIPTIONGROUP = 207
    GET_CONSUME_STATS = 208
    DELETE_TOPIC_IN_BROKER = 215
    DELETE_TOPIC_IN_NAMESRV = 216
    RESET_CONSUMER_CLIENT_OFFSET = 220
    INVOKE_BROKER_TO_RESET_OFFSET = 222
    GET_TOPICS_BY_CLUSTER = 224
    GET_PRODUCER_CONNECTION_LIST = 204
    QUERY_TOPIC_CONSUME_BY_WHO = 300
    GET_CONSUMER_RUNNING_INFO = 307
    CONSUME_MESSAGE_DIRECTLY = 309
    SEND_MESSAGE_V2 = 310
    VIEW_BROKER_STATS_DATA = 315
    SEND_BATCH_MESSAGE = 320
    QUERY_CONSUME_QUEUE = 321
    QUERY_DATA_VERSION = 322
    ADD_WRITE_PERM_OF_BROKER = 327
    GET_ALL_PRODUCER_INFO = 328
    # RocketMQ 5 POP consumption (RequestCode.java)
    POP_MESSAGE = 200050
    ACK_MESSAGE = 200051
    CHANGE_MESSAGE_INVISIBLETIME = 200053
    BATCH_ACK_MESSAGE = 200151
    # RocketMQ 5 controller mode (RequestCode.java; rmq.controller)
    BROKER_HEARTBEAT = 904                 # broker -> controllers: liveness, epoch, max offset
    CONTROLLER_ALTER_SYNC_STATE_SET = 1001  # master -> controller: its new SyncStateSet
    CONTROLLER_ELECT_MASTER = 1002         # admin -> controller: elect (optionally a given broker id)
    CONTROLLER_REGISTER_BROKER = 1003      # broker -> controller: its replica id, the current master
    CONTROLLER_GET_REPLICA_INFO = 1004     # broker / admin -> controller: master, epoch, SyncStateSet
    CONTROLLER_GET_METADATA_INFO = 1005    # admin -> controller: the controllers, who leads
    CONTROLLER_GET_SYNC_STATE_DATA = 1006  # admin -> controller: SyncStateSets and replicas of broker sets
    # rmq internal (actor to actor), outside RocketMQ's range
    ACTOR_BEAT = 9000              # actor -> supervisor liveness
    APPEND_ANNOUNCE = 9001         # broker -> reput/flush: CommitLog end offset
    FLUSH_REQUEST = 9002           # broker -> flush: make offset X durable
    FLUSH_ANNOUNCE = 9003          # flush -> broker: durable offset
    DISPATCH_ANNOUNCE = 9004       # reput -> broker: dispatched offset + queue arrivals
    CLEAN_ANNOUNCE = 9005          # cleaner -> broker: CommitLog min offset, DISK_FULL
    HA_HANDSHAKE = 9010            # slave ha -> master ha: epoch history + max offset; reply: start/truncate
    HA_PUSH = 9011                 # master ha -> slave ha: CommitLog bytes from an offset
    HA_REPORT = 9012               # slave ha -> master ha: max offset applied (the ack)
    HA_ANNOUNCE = 9013             # ha -> broker: slave acks (master) / link state (slave)
    HA_APPEND = 9014               # slave ha -> slave broker: bytes to append verbatim
    HA_TRUNCATE = 9015             # slave ha -> slave broker: cut the diverged tail, restart
    GET_LATENCY_TRACE = 9020       # client -> broker: hop events of rmq.latency_trace (bench --trace)
    GET_HALF_MESSAGES = 9021       # admin -> broker: pending transactions (rmq admin halfMessages)
    GET_TIMER_PENDING = 9022       # admin -> broker: pending timer messages (rmq admin timers)


class ResponseCode(IntEnum):
    """RocketMQ's ResponseCode numbers (SPEC.md Appendix A)."""
    SUCCESS = 0
    SYSTEM_ERROR = 1
    SYSTEM_BUSY = 2
    REQUEST_CODE_NOT_SUPPORTED = 3
    TRANSACTION_FAILED = 4
    FLUSH_DISK_TIMEOUT = 10
    SLAVE_NOT_AVAILABLE = 11
    FLUSH_SLAVE_TIMEOUT = 12
    MESSAGE_ILLEGAL = 13
    SERVICE_NOT_AVAILABLE = 14
    VERSION_NOT_SUPPORTED = 15
    NO_PERMISSION = 16
    TOPIC_NOT_EXIST = 17
    TOPIC_EXIST_ALREADY = 18
    PULL_NOT_FOUND = 19
    PULL_RETRY_IMMEDIATELY = 20
    PULL_OFFSET_MOVED = 21
    QUERY_NOT_FOUND = 22
    SUBSCRIPTION_PARSE_FAILED = 23
    SUBSCRIPTION_NOT_EXIST = 24
    SUBSCRIPTION_NOT_LATEST = 25
    SUBSCRIPTION_GROUP_NOT_EXIST = 26
    FILTER_DATA_NOT_EXIST = 27
    FILTER_DATA_NOT_LATEST = 28
    TRANSACTION_SHOULD_COMMIT = 200
    TRANSACTION_SHOULD_ROLLBACK = 201
    TRANSACTION_STATE_UNKNOW = 202
    NO_MESSAGE = 208               # POP: an ack / invisible-time change for a message no longer in flight
    POLLING_FULL = 209
    POLLING_TIMEOUT = 210
    FLOW_CONTROL = 215
    # RocketMQ 5 controller mode (ResponseCode.java)
    CONTROLLER_FENCED_MASTER_EPOCH = 2000
    CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH = 2001
    CONTROLLER_INVALID_MASTER = 2002
    CONTROLLER_INVALID_REPLICAS = 2003
    CONTROLLER_MASTER_NOT_AVAILABLE = 2004
    CONTROLLER_INVALID_REQUEST = 2005
    CONTROLLER_BROKER_NOT_ALIVE = 2006
    CONTROLLER_NOT_LEADER = 2007
    CONTROLLER_BROKER_METADATA_NOT_EXIST = 2008


class ProtocolError(RmqError):
    """A frame that cannot be served; ``code`` is the ResponseCode to answer with."""

    def __init__(self, remark: str, code: int = ResponseCode.SYSTEM_ERROR, opaque: int = 0):
        super().__init__(remark)
        self.code = int(code)
        self.remark = remark
        self.opaque = opaque


Body = Union[bytes, bytearray, memoryview]


@dataclass
class Frame:
    """One request or response (RocketMQ RemotingCommand).

    Attributes
    ----------
    code : int
        RequestCode (request) or ResponseCode (response).
    opaque : int
        Request id, echoed by the response.
    flag : int
        FLAG_RESPONSE / FLAG_ONEWAY bits.
    remark : str
        Human-readable detail, set on errors.
    fields : dict
        Custom header fields (str keys; msgpack-able values).
    bodies : list of bytes-like
        Raw parts after the header.
    """
    code: int
    opaque: int = 0
    flag: int = 0
    remark: str = ""
    fields: dict = field(default_factory=dict)
    bodies: list = field(default_factory=list)

    @property
    def is_response(self) -> bool:
        return bool(self.flag & FLAG_RESPONSE)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flag & FLAG_ONEWAY)

    def response(self, code: int = ResponseCode.SUCCESS, remark: str = "",
                 fields: Optional[dict] = None, bodies: Optional[list] = None) -> "Frame":
        """The response to this request (same opaque, response flag)."""
        return Frame(int(code), self.opaque, FLAG_RESPONSE, remark, fields or {}, bodies or [])


def encode(frame: Frame) -> list:
    """Frame -> multipart parts (bodies passed through untouched).

    Raises
    ------
    ProtocolError
        The header or the whole message would exceed the limits.
    """
    remark = frame.remark
    # the common case in C (rmq._core.wire: msgpack's bytes); anything else takes msgpack's Packer
    header = _wire.encode_header(frame.code, frame.opaque, frame.flag,
                                 remark if type(remark) is not str or len(remark) <= MAX_REMARK_LENGTH
                                 else remark[:MAX_REMARK_LENGTH], frame.fields)
    if header is None:
        header = _pack_header(frame)
        if len(header) > MAX_HEADER_SIZE:
            _PACKERS.packer = msgpack.Packer(use_bin_type=True)   # its buffer grew past the limit: not kept
    if len(header) > MAX_HEADER_SIZE:
        raise ProtocolError(f"header of {len(header)} bytes exceeds {MAX_HEADER_SIZE}", ResponseCode.SYSTEM_ERROR)
    if len(frame.bodies) > MAX_BODY_PARTS:
        raise ProtocolError(f"{len(frame.bodies)} body parts exceed {MAX_BODY_PARTS}")
    total = len(header) + sum(map(len, frame.bodies))
    if total > MAX_MESSAGE_SIZE:
        raise ProtocolError(f"message of {total} bytes exceeds {MAX_MESSAGE_SIZE}")
    return [PROTOCOL_MAGIC, header, *frame.bodies]


def _pack_header(frame: Frame) -> bytes:
    """encode's header through msgpack's Packer (what rmq._core.wire does not write)."""
    try:
        packer = _PACKERS.packer
    except AttributeError:
        packer = _PACKERS.packer = msgpack.Packer(use_bin_type=True)
    try:
        header = packer.pack({"code": int(frame.code), "opaque": int(frame.opaque), "flag": int(frame.flag),
                              "remark": frame.remark[:MAX_REMARK_LENGTH], "fields": frame.fields})
    except BaseException:
        packer.reset()                # nothing of a failed header is left for the next one
        raise
    return header


def decode(parts: Sequence) -> Frame:
    """Multipart parts (after any routing envelope) -> Frame.

    Accepts bytes or zmq.Frame parts.

    Raises
    ------
    ProtocolError
        Wrong magic (VERSION_NOT_SUPPORTED), missing or oversized header,
        too many parts, malformed msgpack or header fields (SYSTEM_ERROR).
        ``opaque`` is filled in when the header could be read.
    """
    n = len(parts)
    if 2 <= n <= MAX_BODY_PARTS + 2 and _wire.magic_is(parts[0], PROTOCOL_MAGIC):
        # the common case in C (rmq._core.wire); anything it does not take gets the checks below
        h = _wire.decode_header(parts[1], MAX_HEADER_SIZE, MAX_FIELDS)
        if h is not None:
            return Frame(h[0], h[1], h[2], h[3], h[4], [_buffer(p) for p in parts[2:]] if n > 2 else [])
    if n < 2:
        raise ProtocolError(f"truncated message: {n} part(s), need the magic and a header")
    if n - 2 > MAX_BODY_PARTS:
        raise ProtocolError(f"{n - 2} body parts exceed {MAX_BODY_PARTS}")
    magic = _bytes(parts[0])
    if magic != PROTOCOL_MAGIC:
        raise ProtocolError(f"unknown protocol {magic[:16]!r}, expected {PROTOCOL_MAGIC!r}",
                            ResponseCode.VERSION_NOT_SUPPORTED)
    raw = _bytes(parts[1])
    if len(raw) > MAX_HEADER_SIZE:
        raise ProtocolError(f"header of {len(raw)} bytes exceeds {MAX_HEADER_SIZE}")
    try:
        header = msgpack.unpackb(raw, raw=False, strict_map_key=True, **_UNPACKB_LIMITS)
    except msgpack.ExtraData:
        raise ProtocolError("trailing bytes after the msgpack header") from None
    except (msgpack.OutOfData, msgpack.FormatError, msgpack.StackError,
            ValueError, TypeError, UnicodeDecodeError) as e:
        raise ProtocolError(f"malformed msgpack header: {type(e).__name__}: {e}") from None
    if not isinstance(header, dict):
        raise ProtocolError(f"header must be a map, got {type(header).__name__}")
    opaque = header.get("opaque", 0)
    if not isinstance(opaque, int) or isinstance(opaque, bool):
        raise ProtocolError("header field 'opaque' must be an int")
    code = header.get("code")
    if not isinstance(code, int) or isinstance(code, bool):
        raise ProtocolError("header field 'code' must be an int", opaque=opaque)
    flag = header.get("flag", 0)
    if not isinstance(flag, int) or isinstance(flag, bool):
        raise ProtocolError("header field 'flag' must be an int", opaque=opaque)
    remark = header.get("remark", "")
    if not isinstance(remark, str):
        raise ProtocolError("header field 'remark' must be a str", opaque=opaque)
    fields = header.get("fields", {})
    if not isinstance(fields, dict) or len(fields) > MAX_FIELDS:
        raise ProtocolError(f"header field 'fields' must be a map of at most {MAX_FIELDS} entries",
                            opaque=opaque)
    return Frame(code, opaque, flag, remark, fields, [_buffer(p) for p in parts[2:]])


def peek_header(magic_part: Any, header_part: Any) -> tuple:
    """``(code, opaque, flag)`` of a message's magic and header parts, without building a Frame
    (the broker's cheap refusal of late sends).

    Raises
    ------
    ProtocolError
        Wrong magic, oversized or malformed header, or code / opaque / flag not ints.
    """
    if _bytes(magic_part) != PROTOCOL_MAGIC:
        raise ProtocolError("unknown protocol", ResponseCode.VERSION_NOT_SUPPORTED)
    raw = _bytes(header_part)
    if len(raw) > MAX_HEADER_SIZE:
        raise ProtocolError(f"header of {len(raw)} bytes exceeds {MAX_HEADER_SIZE}")
    try:
        header = msgpack.unpackb(raw, raw=False, strict_map_key=True, **_UNPACKB_LIMITS)
    except (msgpack.OutOfData, msgpack.FormatError, msgpack.StackError,
            ValueError, TypeError, UnicodeDecodeError) as e:
        raise ProtocolError(f"malformed msgpack header: {type(e).__name__}: {e}") from None
    if not isinstance(header, dict):
        raise ProtocolError("header must be a map")
    code, opaque, flag = header.get("code"), header.get("opaque", 0), header.get("flag", 0)
    for v in (code, opaque, flag):
        if not isinstance(v, int) or isinstance(v, bool):
            raise ProtocolError("header fields code / opaque / flag must be ints")
    return code, opaque, flag


def _bytes(p: Any) -> bytes:
    if isinstance(p, bytes):
        return p
    b = getattr(p, "bytes", None)     # zmq.Frame
    return b if isinstance(b, bytes) else bytes(p)


def _buffer(p: Any):
    """Body parts stay zero-copy: zmq.Frame -> its buffer (memoryview)."""
    if isinstance(p, (bytes, bytearray, memoryview)):
        return p
    buf = getattr(p, "buffer", None)
    return buf if buf is not None else bytes(p)


# msgpack limits for structured bodies (route data, topic tables): maps / arrays may be large, bins not
BODY_UNPACK_LIMITS = dict(max_str_len=64 * 1024, max_bin_len=0,
                          max_array_len=1 << 20, max_map_len=1 << 20, max_ext_len=0)


def pack_body(obj) -> bytes:
    """msgpack of a structured body (str keys, bin type for bytes)."""
    return msgpack.packb(obj, use_bin_type=True)


def unpack_body(frame: Frame, index: int = 0, max_bin_len: int = 0) -> object:
    """Body part ``index`` of ``frame`` as msgpack, with bounded unpacking (BODY_UNPACK_LIMITS; bin
    values up to ``max_bin_len`` bytes, none by default).

    Raises
    ------
    ProtocolError
        Missing part or malformed msgpack; the remark names the body part.
    """
    if len(frame.bodies) <= index:
        raise ProtocolError(f"missing body part {index}", opaque=frame.opaque)
    limits = BODY_UNPACK_LIMITS if not max_bin_len else {**BODY_UNPACK_LIMITS, "max_bin_len": max_bin_len}
    try:
        return msgpack.unpackb(bytes(frame.bodies[index]), raw=False, strict_map_key=True, **limits)
    except (msgpack.ExtraData, msgpack.FormatError, msgpack.StackError, msgpack.OutOfData,
            ValueError, TypeError, UnicodeDecodeError) as e:
        raise ProtocolError(f"body part {index} is not valid msgpack: {type(e).__name__}: {e}",
                            opaque=frame.opaque) from None


def endpoint(addr: str) -> str:
    """``host:port`` -> ``tcp://host:port``; full ZeroMQ endpoints pass through."""
    return addr if "://" in addr else f"tcp://{addr}"


def configure_socket(sock):
    """rmq's options on every socket: linger 0 and libzmq's own message size limit
    (a bigger message is dropped by libzmq before it reaches Python).  Returns ``sock``."""
    import zmq
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_SIZE + 1024)
    return sock


def dealer(ctx, addr=None, auth=None):
    """A configured DEALER (client side of every rmq request), connected to ``addr`` if given.

    ``auth``: CURVE client keys (:func:`rmq.security.client_auth`: a ClientAuth, a
    ``(client_secret_key_file, server_public_key_file)`` pair, or None for the one
    registered for ``ctx`` or else the ``RMQ_AUTH_CLIENT_KEY`` / ``RMQ_AUTH_SERVER_KEY``
    environment).  Without any, the socket is plain (CURVE off, the default)."""
    import zmq
    from rmq import security
    s = configure_socket(ctx.socket(zmq.DEALER))
    a = security.client_auth(auth if auth is not None else security.context_auth(ctx))
    if a is not None and (addr is None or endpoint(addr).startswith("tcp://")):
        a.apply(s)
    if addr is not None:
        s.connect(endpoint(addr))
    return s


def field_int(frame: Frame, name: str, default: Optional[int] = None, lo: Optional[int] = None,
              hi: Optional[int] = None) -> int:
    """An int header field, checked; ProtocolError (SYSTEM_ERROR) naming the field otherwise."""
    v = frame.fields.get(name, default)
    if v is None:
        raise ProtocolError(f"missing header field {name!r}", opaque=frame.opaque)
    if not isinstance(v, int) or isinstance(v, bool):
        raise ProtocolError(f"header field {name!r} must be an int, got {type(v).__name__}", opaque=frame.opaque)
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        raise ProtocolError(f"header field {name!r}={v} outside [{lo}, {hi}]", opaque=frame.opaque)
    return v


def field_str(frame: Frame, name: str, default: Optional[str] = None, max_len: int = 4096) -> str:
    """A str header field, checked; ProtocolError naming the field otherwise."""
    v = frame.fields.get(name, default)
    if v is None:
        raise ProtocolError(f"missing header field {name!r}", opaque=frame.opaque)
    if not isinstance(v, str):
        raise ProtocolError(f"header field {name!r} must be a str, got {type(v).__name__}", opaque=frame.opaque)
    if len(v) > max_len:
        raise ProtocolError(f"header field {name!r} is {len(v)} characters, over {max_len}", opaque=frame.opaque)
    return v
