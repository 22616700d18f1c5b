"""Shared by the remoting proxy's integration tests: start ``rmq proxy`` as a process, talk to it in
raw RocketMQ remoting frames (:mod:`rmq.proxy.remoting`), read the JSON-ish bodies fastjson writes."""
import itertools
import json
import os
import socket
import struct
import subprocess
import sys
from contextlib import contextmanager

from rmq.launch import child_env, python_argv
from rmq.proxy.remoting import SERIALIZE_JSON, RemotingCommand, decode, encode

_opaque = itertools.count(1000)
CPP_CLIENT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cpp_client.py")


def cpp(*args, timeout=180) -> dict:
    """Run tests/integration/cpp_client.py (the official C++ client) with ``args``; its JSON output.
    A non-zero exit fails the calling test with the client's stderr."""
    r = subprocess.run([sys.executable, CPP_CLIENT, *map(str, args)], capture_output=True, text=True,
                       timeout=timeout)
    assert r.returncode == 0, f"C++ client {args[0]} failed ({r.returncode}): {r.stderr[-2000:]}"
    return json.loads(r.stdout)


@contextmanager
def running_proxy(namesrv_addr: str):
    """``rmq proxy`` on an ephemeral port in front of ``namesrv_addr``; yields its ``host:port``."""
    p = subprocess.Popen(python_argv("rmq.cli", "proxy", "--namesrv-addr", namesrv_addr, "--listen-port", "0",
                                     "--grpc-listen-port", "0"),
                         stdout=subprocess.PIPE, text=True, env=child_env())
    try:
        line = p.stdout.readline().split()
        assert line and line[0] == "proxy", f"the proxy did not start: {line}"
        yield line[1]
    finally:
        p.terminate()
        code = p.wait(10)
        p.stdout.close()
    assert code == 0                                        # SIGTERM: a clean stop


def connect(addr: str) -> socket.socket:
    host, port = addr.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=10)


def _read_exactly(s, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = s.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


def read_frame(s) -> RemotingCommand:
    n = struct.unpack(">i", _read_exactly(s, 4))[0]
    return decode(_read_exactly(s, n))


def request(s, code: int, fields=None, body: bytes = b"", stype: int = SERIALIZE_JSON, flag: int = 0,
            language: str = "JAVA", version: int = 407) -> RemotingCommand:
    """Send one request on socket ``s``; read and return its answer (same opaque, checked)."""
    opaque = next(_opaque)
    s.sendall(encode(RemotingCommand(code, opaque, flag, None, {k: str(v) for k, v in (fields or {}).items()},
                                     body, language, version, stype)))
    r = read_frame(s)
    assert (r.opaque, r.is_response, r.serialize_type) == (opaque, True, stype), r
    return r


def call(addr: str, code: int, fields=None, body: bytes = b"", stype: int = SERIALIZE_JSON, **kw) -> RemotingCommand:
    """:func:`request` on a connection of its own."""
    with connect(addr) as s:
        return request(s, code, fields, body, stype, **kw)


# -- fastjson's text ------------------------------------------------------------------------------------
class FastjsonReader:
    """Reads what fastjson writes: JSON plus objects and numbers as object keys (a
    ``HashMap<MessageQueue, ...>`` / ``HashMap<Long, ...>``).  An object key becomes a tuple of its
    sorted (name, value) pairs, so ``dict(key)`` gives it back."""

    def __init__(self, text: str):
        self.t, self.i = text, 0

    def parse(self):
        v = self.value()
        self.ws()
        assert self.i == len(self.t), f"trailing text at {self.i}: {self.t[self.i:self.i + 40]!r}"
        return v

    def ws(self):
        while self.i < len(self.t) and self.t[self.i] in " \t\r\n":
            self.i += 1

    def value(self):
        self.ws()
        c = self.t[self.i]
        if c == "{":
            self.i += 1
            out = {}
            self.ws()
            if self.t[self.i] == "}":
                self.i += 1
                return out
            while True:
                k = self.value()
                if isinstance(k, dict):
                    k = tuple(sorted(k.items()))
                self.ws()
                assert self.t[self.i] == ":", f"':' expected at {self.i}"
                self.i += 1
                out[k] = self.value()
                self.ws()
                c = self.t[self.i]
                self.i += 1
                if c == "}":
                    return out
                assert c == ",", f"',' expected at {self.i - 1}"
        if c == "[":
            self.i += 1
            out = []
            self.ws()
            if self.t[self.i] == "]":
                self.i += 1
                return out
            while True:
                out.append(self.value())
                self.ws()
                c = self.t[self.i]
                self.i += 1
                if c == "]":
                    return out
                assert c == ",", f"',' expected at {self.i - 1}"
        v, end = json.JSONDecoder().raw_decode(self.t, self.i)
        self.i = end
        return v


def fastjson(body: bytes):
    return FastjsonReader(body.decode("utf-8")).parse()


def mq_table(table: dict) -> dict:
    """``{MessageQueue: v}`` as read by :func:`fastjson` -> ``{(topic, brokerName, queueId): v}``."""
    out = {}
    for k, v in table.items():
        d = dict(k)
        out[(d["topic"], d["brokerName"], d["queueId"])] = v
    return out


def properties(d: dict) -> str:
    """A message's properties string (``key \\x01 value \\x02``, MessageDecoder.messageProperties2String)."""
    return "".join(f"{k}\x01{v}\x02" for k, v in d.items())


def encode_messages(messages) -> bytes:
    """MessageDecoder.encodeMessages of ``[(body, properties dict, flag)]``: per message TOTALSIZE,
    MAGICCODE 0, BODYCRC 0, FLAG, BODY length + body, PROPERTIES (int16) length + properties."""
    out = b""
    for body, props, flag in messages:
        p = properties(props).encode()
        size = 4 + 4 + 4 + 4 + 4 + len(body) + 2 + len(p)
        out += struct.pack(">iiiii", size, 0, 0, flag, len(body)) + body + struct.pack(">h", len(p)) + p
    return out
