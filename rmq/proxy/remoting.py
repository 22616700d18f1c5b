"""RocketMQ 4.x "remoting" frames: the TCP protocol of RocketMQ's own clients (layout:
``../shared/REMOTING.md`` §Frame; RocketMQ ``remoting/.../protocol/RemotingCommand.java``,
``RocketMQSerializable.java``, ``SerializeType.java``, ``LanguageCode.java``).

A frame on the wire, big endian::

    int32 length               = 4 + headerLength + bodyLength (the prefix itself not counted)
    int32 serializeType << 24 | headerLength
    header                     JSON (type 0) or RocketMQ's binary header (type 1)
    body

This module is sans-I/O: :func:`encode` gives the bytes of a frame (prefix included),
:func:`decode` reads one frame's bytes after the prefix.  Malformed input raises
:class:`RemotingFrameError` and nothing else.
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from typing import Optional

# NettySystemConfig ``com.rocketmq.remoting.frameMaxLength`` (16 MiB): a longer frame closes the
# connection, as RocketMQ's NettyDecoder does
MAX_FRAME_BYTES = 16 * 1024 * 1024
SERIALIZE_JSON, SERIALIZE_ROCKETMQ = 0, 1
FLAG_RESPONSE = 0x1                   # RemotingCommand RPC_TYPE bit
FLAG_ONEWAY = 0x2                     # RPC_ONEWAY bit
# LanguageCode ordinals (the binary header carries the ordinal, JSON the name)
LANGUAGES = ("JAVA", "CPP", "DOTNET", "PYTHON", "DELPHI", "ERLANG", "RUBY", "OTHER", "HTTP", "GO", "PHP",
             "OMS", "RUST")
SERVER_VERSION = 407                  # MQVersion.Version.V4_9_7 ordinal (V4_9_3 = 399; 433 is V5_1_0): what a 4.9 broker answers with

_U32 = struct.Struct(">I")
_BIN_FIXED = struct.Struct(">hBhii")  # code, language, version, opaque, flag


class RemotingFrameError(ValueError):
    """A frame that cannot be read: the connection it came on is closed (RocketMQ does the same)."""


@dataclass
class RemotingCommand:
    """One request or response (``RemotingCommand``).

    ``ext_fields`` are strings both ways (the C++ client ignores values that are not strings);
    ``serialize_type`` is the header type the frame came in, and the one its answer goes back in
    (``NettyRemotingAbstract``: a response uses its request's type).
    """
    code: int
    opaque: int = 0
    flag: int = 0
    remark: Optional[str] = None
    ext_fields: dict = field(default_factory=dict)
    body: bytes = b""
    language: str = "JAVA"
    version: int = SERVER_VERSION
    serialize_type: int = SERIALIZE_JSON

    @property
    def is_response(self) -> bool:
        return bool(self.flag & FLAG_RESPONSE)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flag & FLAG_ONEWAY)

    def response(self, code: int = 0, remark: Optional[str] = None, ext_fields: Optional[dict] = None,
                 body: bytes = b"") -> "RemotingCommand":
        """The answer to this request: same opaque and header type, RESPONSE flag, values as strings."""
        return RemotingCommand(int(code), self.opaque, FLAG_RESPONSE, remark,
                               {k: _str(v) for k, v in (ext_fields or {}).items() if v is not None}, body,
                               "JAVA", SERVER_VERSION, self.serialize_type)


def _str(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


# -- encode ---------------------------------------------------------------------------------------------
def encode(cmd: RemotingCommand) -> bytes:
    """The frame's bytes, length prefix included, in ``cmd.serialize_type``.

    Raises
    ------
    RemotingFrameError
        The frame would be over MAX_FRAME_BYTES, or an unknown serialize type.
    """
    if cmd.serialize_type == SERIALIZE_JSON:
        doc = {"code": cmd.code, "language": cmd.language, "version": cmd.version, "opaque": cmd.opaque,
               "flag": cmd.flag, "serializeTypeCurrentRPC": "JSON"}
        if cmd.remark is not None:
            doc["remark"] = cmd.remark
        if cmd.ext_fields:
            doc["extFields"] = {k: _str(v) for k, v in cmd.ext_fields.items()}
        header = json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    elif cmd.serialize_type == SERIALIZE_ROCKETMQ:
        header = _encode_binary_header(cmd)
    else:
        raise RemotingFrameError(f"unknown serialize type {cmd.serialize_type}")
    body = bytes(cmd.body or b"")
    length = 4 + len(header) + len(body)
    if length > MAX_FRAME_BYTES:
        raise RemotingFrameError(f"frame of {length} bytes is over the {MAX_FRAME_BYTES}-byte limit")
    return _U32.pack(length) + _U32.pack((cmd.serialize_type << 24) | len(header)) + header + body


def _encode_binary_header(cmd: RemotingCommand) -> bytes:
    lang = LANGUAGES.index(cmd.language) if cmd.language in LANGUAGES else LANGUAGES.index("OTHER")
    out = [_BIN_FIXED.pack(cmd.code, lang, cmd.version, cmd.opaque, cmd.flag)]
    remark = (cmd.remark or "").encode("utf-8") if cmd.remark is not None else b""
    out.append(_U32.pack(len(remark)) + remark)
    ext = bytearray()
    for k, v in cmd.ext_fields.items():
        kb, vb = str(k).encode("utf-8"), _str(v).encode("utf-8")
        ext += struct.pack(">h", len(kb)) + kb + _U32.pack(len(vb)) + vb
    out.append(_U32.pack(len(ext)) + bytes(ext))
    return b"".join(out)


# -- decode ---------------------------------------------------------------------------------------------
def check_length(length: int) -> None:
    """Validate a frame's length prefix before reading the frame.

    Raises
    ------
    RemotingFrameError
        Under 4 (no header-length word) or over MAX_FRAME_BYTES.
    """
    if length < 4:
        raise RemotingFrameError(f"frame length {length} is under 4 bytes")
    if length > MAX_FRAME_BYTES:
        raise RemotingFrameError(f"frame length {length} is over the {MAX_FRAME_BYTES}-byte limit")


def decode(data: bytes) -> RemotingCommand:
    """One frame from its bytes after the length prefix (``len(data)`` = the prefix's value).

    Raises
    ------
    RemotingFrameError
        A header length past the frame, an unknown serialize type, a JSON header that is not a JSON
        object with an integer ``code``, or a truncated binary header.
    """
    if len(data) < 4:
        raise RemotingFrameError("frame shorter than its header-length word")
    word = _U32.unpack_from(data, 0)[0]
    stype, hlen = word >> 24, word & 0xFFFFFF
    if 4 + hlen > len(data):
        raise RemotingFrameError(f"header length {hlen} is past the frame's {len(data) - 4} bytes")
    header, body = data[4:4 + hlen], bytes(data[4 + hlen:])
    if stype == SERIALIZE_JSON:
        cmd = _decode_json_header(header)
    elif stype == SERIALIZE_ROCKETMQ:
        cmd = _decode_binary_header(header)
    else:
        raise RemotingFrameError(f"unknown serialize type {stype}")
    cmd.serialize_type = stype
    cmd.body = body
    return cmd


def _decode_json_header(header: bytes) -> RemotingCommand:
    try:
        doc = json.loads(bytes(header).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise RemotingFrameError(f"header is not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise RemotingFrameError("JSON header is not an object")
    try:
        code = int(doc["code"])
        opaque = int(doc.get("opaque", 0))
        flag = int(doc.get("flag", 0))
        version = int(doc.get("version", 0))
    except (KeyError, TypeError, ValueError):
        raise RemotingFrameError("JSON header needs integer code, opaque, flag and version") from None
    ext = doc.get("extFields") or {}
    if not isinstance(ext, dict):
        raise RemotingFrameError("extFields is not an object")
    remark = doc.get("remark")
    language = doc.get("language", "OTHER")
    if isinstance(language, int):
        language = LANGUAGES[language] if 0 <= language < len(LANGUAGES) else "OTHER"
    return RemotingCommand(code, opaque, flag, None if remark is None else str(remark),
                           {str(k): _str(v) for k, v in ext.items() if v is not None},
                           language=str(language), version=version)


def _decode_binary_header(h: bytes) -> RemotingCommand:
    try:
        code, lang, version, opaque, flag = _BIN_FIXED.unpack_from(h, 0)
        pos = _BIN_FIXED.size
        rlen = _U32.unpack_from(h, pos)[0]
        pos += 4
        if pos + rlen > len(h):
            raise RemotingFrameError("remark past the header")
        remark = bytes(h[pos:pos + rlen]).decode("utf-8") if rlen else None
        pos += rlen
        elen = _U32.unpack_from(h, pos)[0]
        pos += 4
        end = pos + elen
        if end > len(h):
            raise RemotingFrameError("extFields past the header")
        ext = {}
        while pos < end:
            klen = struct.unpack_from(">h", h, pos)[0]
            pos += 2
            if klen < 0 or pos + klen > end:
                raise RemotingFrameError("extFields key past its block")
            k = bytes(h[pos:pos + klen]).decode("utf-8")
            pos += klen
            vlen = _U32.unpack_from(h, pos)[0]
            pos += 4
            if pos + vlen > end:
                raise RemotingFrameError("extFields value past its block")
            ext[k] = bytes(h[pos:pos + vlen]).decode("utf-8")
            pos += vlen
    except (struct.error, UnicodeDecodeError) as e:
        raise RemotingFrameError(f"truncated or malformed binary header: {e}") from None
    language = LANGUAGES[lang] if lang < len(LANGUAGES) else "OTHER"
    return RemotingCommand(code, opaque, flag, remark, ext, language=language, version=version)


__all__ = ["RemotingCommand", "RemotingFrameError", "encode", "decode", "check_length", "MAX_FRAME_BYTES",
           "SERIALIZE_JSON", "SERIALIZE_ROCKETMQ", "FLAG_RESPONSE", "FLAG_ONEWAY"]
