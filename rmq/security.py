"""Transport security: ZeroMQ CURVE with a ZAP authenticator, key files, admin keys.

Off by default: with ``authEnable`` unset every listener is plain ZeroMQ bound to
127.0.0.1 and nothing here runs per request except one set lookup for the few
restricted request codes (see :data:`RESTRICTED_CODES`).

Server side (nameserver, broker, ha; broker.conf / nameserver properties)::

    authEnable = true
    authServerKeyFile = /etc/rmq/keys/server.key_secret   # this node's key pair (shared by the cluster's nodes)
    authClientKeysDir = /etc/rmq/keys/clients             # *.key public keys allowed to connect
    authAdminKeysDir = /etc/rmq/keys/admins               # *.key public keys allowed admin commands

Every tcp ROUTER an actor binds becomes a CURVE server with ZAP domain
:data:`ZAP_DOMAIN`; a :class:`~zmq.auth.thread.ThreadAuthenticator` answers ZAP
requests from :class:`KeyRing` (the two directories plus the node key itself,
re-read when a directory changes and at least every :data:`KEYRING_TTL_S`
seconds: a key removed from the directory is refused on the next connect, and
its open connections get NO_PERMISSION on the next request).  The node refuses
to start (:class:`SecurityError`) if a key file is missing or if a CURVE server
socket would run without a live authenticator and a ZAP domain: libzmq accepts
any client knowing the server key when no ZAP domain is set.  ``CURVE_ALLOW_ANY``
is never used.  Every tcp DEALER an actor connects (broker -> nameserver,
slave broker -> master broker, slave ha -> master ha) is a CURVE client with the
node's key pair and the node key as server key: one key pair per cluster.

Client side: ``auth=ClientAuth(client_secret_key_file, server_public_key_file)``
(or a ``(client, server)`` tuple) on Producer / PushConsumer / PullConsumer /
Admin / RemotingClient, else the environment variables ``RMQ_AUTH_CLIENT_KEY``
(client secret key file) and ``RMQ_AUTH_SERVER_KEY`` (server public key file).

Authorization (enforced in :meth:`rmq.actors.actor.Actor._on_request`, before
any handler):

* :data:`ADMIN_CODES` need an admin key when CURVE is on; when it is off they
  are served only to loopback peers (the ZeroMQ ``Peer-Address`` of the request).
* :data:`NODE_CODES` (broker registration, HA handshake / reports) need the node
  key (or an admin key) when CURVE is on.
* :data:`LOCAL_CODES` (actor-to-actor announcements, HA_APPEND / HA_TRUNCATE)
  are never served on a tcp listener: only on the store directory's ipc sockets.
  The store directory is made 0700 and each ipc socket file 0600 when bound.

Key files are ``zmq.auth.create_certificates`` output: ``NAME.key`` (public) and
``NAME.key_secret`` (public + secret); ``rmq keys generate NAME`` writes them.
"""
from __future__ import annotations

import ipaddress
import logging
import os
import stat
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Tuple, Union

from rmq.errors import RmqError
from rmq.protocol import RequestCode

ZAP_DOMAIN = "rmq"
KEYRING_TTL_S = 2.0                   # directories re-read at least this often (revocation delay)
ENV_CLIENT_KEY = "RMQ_AUTH_CLIENT_KEY"
ENV_SERVER_KEY = "RMQ_AUTH_SERVER_KEY"

PROP_ENABLE = "authEnable"
PROP_SERVER_KEY_FILE = "authServerKeyFile"
PROP_CLIENT_KEYS_DIR = "authClientKeysDir"
PROP_ADMIN_KEYS_DIR = "authAdminKeysDir"
AUTH_PROPERTIES = (PROP_ENABLE, PROP_SERVER_KEY_FILE, PROP_CLIENT_KEYS_DIR, PROP_ADMIN_KEYS_DIR)

ROLE_CLIENT = "client"
ROLE_ADMIN = "admin"
ROLE_NODE = "node"

# admin commands: change topics, groups, offsets, permissions, config (RocketMQ ACL 1.0 "admin" + more)
ADMIN_CODES = frozenset(int(c) for c in (
    RequestCode.UPDATE_AND_CREATE_TOPIC, RequestCode.DELETE_TOPIC_IN_BROKER, RequestCode.DELETE_TOPIC_IN_NAMESRV,
    RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, RequestCode.DELETE_SUBSCRIPTIONGROUP,
    RequestCode.UPDATE_BROKER_CONFIG, RequestCode.WIPE_WRITE_PERM_OF_BROKER, RequestCode.ADD_WRITE_PERM_OF_BROKER,
    RequestCode.PUT_KV_CONFIG, RequestCode.RESET_CONSUMER_CLIENT_OFFSET, RequestCode.INVOKE_BROKER_TO_RESET_OFFSET,
    RequestCode.GET_LATENCY_TRACE, RequestCode.GET_HALF_MESSAGES, RequestCode.GET_TIMER_PENDING,
    RequestCode.CONTROLLER_ELECT_MASTER,
))
# node-to-node requests: only the cluster's node key (or an admin key) with CURVE on
NODE_CODES = frozenset(int(c) for c in (
    RequestCode.REGISTER_BROKER, RequestCode.UNREGISTER_BROKER, RequestCode.HA_HANDSHAKE, RequestCode.HA_REPORT,
    RequestCode.CONTROLLER_REGISTER_BROKER, RequestCode.BROKER_HEARTBEAT, RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET,
))
# actor-to-actor requests inside one broker group: ipc only, never over tcp
LOCAL_CODES = frozenset(int(c) for c in (
    RequestCode.ACTOR_BEAT, RequestCode.APPEND_ANNOUNCE, RequestCode.FLUSH_REQUEST, RequestCode.FLUSH_ANNOUNCE,
    RequestCode.DISPATCH_ANNOUNCE, RequestCode.CLEAN_ANNOUNCE, RequestCode.HA_ANNOUNCE, RequestCode.HA_APPEND,
    RequestCode.HA_TRUNCATE,
))
RESTRICTED_CODES = ADMIN_CODES | NODE_CODES | LOCAL_CODES

log = logging.getLogger("rmq.security")


class SecurityError(RmqError):
    """Security configuration that cannot be used (missing key file, no authenticator, ...)."""


# -- key files -------------------------------------------------------------------------------------
def load_secret_key(path: str) -> Tuple[bytes, bytes]:
    """``(public, secret)`` z85 keys from a ``*.key_secret`` file.

    Raises
    ------
    SecurityError
        Missing or unreadable file, or a file without a secret key.
    """
    import zmq.auth
    try:
        public, secret = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as e:
        raise SecurityError(f"cannot read secret key file {path}: {e}") from None
    if not secret:
        raise SecurityError(f"{path} holds no secret key (use the NAME.key_secret file)")
    return public, secret


def load_public_key(path: str) -> bytes:
    """The z85 public key of a ``*.key`` (or ``*.key_secret``) file.

    Raises
    ------
    SecurityError
        Missing, unreadable or malformed file.
    """
    import zmq.auth
    try:
        public, _ = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as e:
        raise SecurityError(f"cannot read public key file {path}: {e}") from None
    if not public or len(public) != 40:
        raise SecurityError(f"{path} holds no valid public key")
    return public


def generate_keys(name: str, directory: str = ".") -> Tuple[str, str]:
    """``NAME.key`` + ``NAME.key_secret`` in ``directory`` (created 0700; the secret file 0600).

    Raises
    ------
    SecurityError
        Bad name, or the files already exist (never overwritten).
    """
    import zmq.auth
    if not name or "/" in name or name.startswith(".") or name != name.strip():
        raise SecurityError(f"bad key name {name!r}")
    os.makedirs(directory, mode=0o700, exist_ok=True)
    pub = os.path.join(directory, f"{name}.key")
    sec = pub + "_secret"
    for p in (pub, sec):
        if os.path.exists(p):
            raise SecurityError(f"{p} exists: not overwritten")
    old = os.umask(0o077)
    try:
        pub, sec = zmq.auth.create_certificates(directory, name)
    finally:
        os.umask(old)
    os.chmod(sec, 0o600)
    os.chmod(pub, 0o644)
    return pub, sec


def _public_keys_in(directory: Optional[str]) -> set:
    keys: set = set()
    if not directory:
        return keys
    try:
        names = sorted(os.listdir(directory))
    except OSError as e:
        log.error("cannot list key directory %s: %s", directory, e)
        return keys
    for n in names:
        if not n.endswith(".key"):
            continue
        try:
            keys.add(load_public_key(os.path.join(directory, n)))
        except SecurityError as e:
            log.warning("ignoring key file: %s", e)
    return keys


# -- configuration -----------------------------------------------------------------------------------
def _bool(key: str, v: Any) -> bool:
    s = str(v).strip().lower()
    if s in ("true", "1", "yes"):
        return True
    if s in ("false", "0", "no", ""):
        return False
    raise SecurityError(f"{key} must be true or false, got {v!r}")


@dataclass(frozen=True)
class AuthConfig:
    """The ``auth*`` properties of a broker.conf / nameserver properties file."""
    enable: bool = False
    server_key_file: str = ""
    client_keys_dir: str = ""
    admin_keys_dir: str = ""

    @classmethod
    def from_properties(cls, props: Optional[Mapping[str, Any]]) -> "AuthConfig":
        """Checked settings; with ``authEnable=true`` the key file must hold a secret key and
        the directories must exist.

        Raises
        ------
        SecurityError
            Naming the bad property.
        """
        props = props or {}
        enable = _bool(PROP_ENABLE, props.get(PROP_ENABLE, "false"))
        cfg = cls(enable, *(os.path.expanduser(str(props.get(k, "") or "").strip())
                            for k in (PROP_SERVER_KEY_FILE, PROP_CLIENT_KEYS_DIR, PROP_ADMIN_KEYS_DIR)))
        if not enable:
            return cfg
        if not cfg.server_key_file:
            raise SecurityError(f"{PROP_ENABLE}=true needs {PROP_SERVER_KEY_FILE} (a NAME.key_secret file)")
        load_secret_key(cfg.server_key_file)
        for key, d in ((PROP_CLIENT_KEYS_DIR, cfg.client_keys_dir), (PROP_ADMIN_KEYS_DIR, cfg.admin_keys_dir)):
            if d and not os.path.isdir(d):
                raise SecurityError(f"{key}={d}: not a directory")
        return cfg


def check_auth_properties(props: Optional[Mapping[str, Any]]) -> None:
    """Validate the ``auth*`` properties (broker.conf loading); raises SecurityError."""
    AuthConfig.from_properties(props)


# -- server side -----------------------------------------------------------------------------------
class KeyRing:
    """Public key (z85) -> role, from the node key and the client / admin directories.

    Re-read when a directory's mtime changes or every :data:`KEYRING_TTL_S` seconds;
    the table is replaced atomically, so the ZAP thread and the actor loop share it."""

    def __init__(self, node_public: bytes, client_dir: str = "", admin_dir: str = "",
                 logger: Optional[logging.Logger] = None):
        self.log = logger or log
        self.node_public = node_public
        self.client_dir = client_dir
        self.admin_dir = admin_dir
        self._roles: dict = {}
        self._stamp: tuple = ()
        self._loaded_at = 0.0
        self._lock = threading.Lock()
        self.refresh(force=True)

    def _dir_stamp(self) -> tuple:
        out = []
        for d in (self.client_dir, self.admin_dir):
            try:
                st = os.stat(d) if d else None
                out.append((st.st_mtime_ns, st.st_ino) if st else None)
            except OSError:
                out.append(None)
        return tuple(out)

    def refresh(self, force: bool = False) -> None:
        stamp = self._dir_stamp()
        now = time.monotonic()
        if not force and stamp == self._stamp and now - self._loaded_at < KEYRING_TTL_S:
            return
        with self._lock:
            roles = {k: ROLE_CLIENT for k in _public_keys_in(self.client_dir)}
            roles.update({k: ROLE_ADMIN for k in _public_keys_in(self.admin_dir)})
            roles[self.node_public] = ROLE_NODE
            self._roles = roles
            self._stamp = stamp
            self._loaded_at = now

    def role_of(self, key: Union[bytes, str, None]) -> Optional[str]:
        """The role of a z85 public key (as bytes or str), None if not allowed."""
        if key is None:
            return None
        if isinstance(key, str):
            key = key.encode("ascii", "replace")
        return self._roles.get(key)

    # ZAP credentials provider (pyzmq Authenticator.configure_curve_callback)
    def callback(self, domain: str, key: bytes) -> bool:
        if domain != ZAP_DOMAIN:
            return False
        self.refresh()
        ok = self.role_of(key) is not None
        if not ok:
            self.log.warning("CURVE client key %s refused (not in %s / %s)", key.decode("ascii", "replace"),
                        self.client_dir or "-", self.admin_dir or "-")
        return ok


class ServerSecurity:
    """CURVE for one actor process: the ZAP authenticator, the node key pair, the key ring."""

    def __init__(self, cfg: AuthConfig, ctx, logger: Optional[logging.Logger] = None):
        from zmq.auth.thread import ThreadAuthenticator
        if not cfg.enable:
            raise SecurityError("ServerSecurity needs authEnable=true")
        self.cfg = cfg
        self.public, self.secret = load_secret_key(cfg.server_key_file)
        self.keyring = KeyRing(self.public, cfg.client_keys_dir, cfg.admin_keys_dir, logger)
        zap_log = logging.getLogger(f"{logger.name}.zap" if logger else "rmq.security.zap")
        zap_log.setLevel(logging.WARNING)      # pyzmq logs every ZAP decision at DEBUG
        self.authenticator = ThreadAuthenticator(ctx, log=zap_log)
        self.authenticator.start()
        self.authenticator.configure_curve_callback(ZAP_DOMAIN, credentials_provider=self.keyring)

    def running(self) -> bool:
        a = self.authenticator
        return a is not None and a.is_alive()

    def secure_server(self, sock) -> None:
        """Make ``sock`` a CURVE server with our ZAP domain.

        Raises
        ------
        SecurityError
            The authenticator is not running or the ZAP domain did not stick:
            libzmq would then accept any client that knows the server key."""
        import zmq
        if not self.running():
            raise SecurityError("CURVE on but the ZAP authenticator is not running: refusing to listen")
        sock.curve_secretkey = self.secret
        sock.curve_publickey = self.public
        sock.curve_server = 1
        sock.setsockopt(zmq.ZAP_DOMAIN, ZAP_DOMAIN.encode())
        if sock.getsockopt(zmq.ZAP_DOMAIN) != ZAP_DOMAIN.encode() or not sock.getsockopt(zmq.CURVE_SERVER):
            raise SecurityError("CURVE server socket without a ZAP domain: refusing to listen")

    def secure_client(self, sock) -> None:
        """Node-to-node client socket: our key pair, the cluster key as server key."""
        apply_client_keys(sock, self.public, self.secret, self.public)

    def stop(self) -> None:
        if self.authenticator is not None:
            try:
                self.authenticator.stop()
            except Exception:  # noqa: BLE001 - best effort on shutdown
                pass
            self.authenticator = None


NAME_FIELDS = {"topic": "topic", "groupName": "group", "group": "group", "consumerGroup": "group"}


def check_admin_names(frame) -> None:
    """Topic / group header fields of an admin request must be valid names (so no admin
    command, even a no-op one, ever sees a path-like name).

    Raises
    ------
    ProtocolError
        SYSTEM_ERROR naming the field."""
    from rmq.protocol import ProtocolError
    from rmq.common.topic_validator import check_group, check_topic
    for key, kind in NAME_FIELDS.items():
        v = frame.fields.get(key)
        if v is None:
            continue
        try:
            if not isinstance(v, str):
                raise ValueError(f"must be a str, got {type(v).__name__}")
            (check_topic if kind == "topic" else check_group)(v)
        except ValueError as e:
            raise ProtocolError(f"header field {key!r}: {e}", opaque=frame.opaque) from None


def request_role(part) -> Optional[str]:
    """The ZAP User-Id (the client's z85 public key) of a received zmq.Frame, None if absent."""
    get = getattr(part, "get", None)
    if get is None:
        return None
    try:
        return get("User-Id")
    except Exception:  # noqa: BLE001 - zmq.ZMQError: no metadata on this connection
        return None


def peer_is_loopback(part) -> bool:
    """Whether a message part received on a tcp listener (a ``zmq.Frame`` or an
    ``rmq._core.zmqc.Part``) came from a loopback peer, by its ``Peer-Address`` metadata.

    Fails closed: a part without the connection's metadata (``bytes``, or a part libzmq has no
    ``Peer-Address`` for) is not known to be local, so False. Only tcp listeners are checked
    (``Actor._denied``); ipc and inproc sockets are never asked.
    """
    get = getattr(part, "get", None)
    if get is None:
        return False
    try:
        addr = get("Peer-Address")
    except Exception:  # noqa: BLE001 - zmq.ZMQError / OSError: no metadata on this part
        return False
    return is_loopback_host(addr)


def is_loopback_host(host: str) -> bool:
    h = (host or "").strip().strip("[]")
    if h == "localhost":
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


def endpoint_host(ep: str) -> Optional[str]:
    """``tcp://HOST:PORT`` -> HOST (None for other transports)."""
    if not ep.startswith("tcp://"):
        return None
    rest = ep[len("tcp://"):]
    host = rest.rsplit(":", 1)[0] if ":" in rest else rest
    return host.strip("[]")


def secure_ipc_endpoint(ep: str, bound: bool = False) -> None:
    """ipc sockets live in the store directory: make it 0700 (before bind) and the
    socket file 0600 (after bind).  Intra-node sockets rely on this, not on CURVE."""
    if not ep.startswith("ipc://"):
        return
    path = ep[len("ipc://"):]
    target = path if bound else os.path.dirname(os.path.abspath(path))
    try:
        st = os.stat(target)
    except OSError:
        return
    if st.st_uid != os.getuid():
        return
    want = 0o600 if bound else 0o700
    if stat.S_IMODE(st.st_mode) & 0o077:
        try:
            os.chmod(target, stat.S_IMODE(st.st_mode) & ~0o077 | (want & 0o700))
        except OSError as e:
            log.warning("cannot restrict %s to %o: %s", target, want, e)


# -- client side -------------------------------------------------------------------------------------
class ClientAuth:
    """A client's CURVE keys: its own key pair and the server's public key.

    Parameters
    ----------
    client_key_file : str
        The client's ``NAME.key_secret``.
    server_key_file : str
        The server's ``NAME.key`` (or its ``.key_secret``; only the public key is read).

    Raises
    ------
    SecurityError
        A file is missing or malformed.
    """

    def __init__(self, client_key_file: str, server_key_file: str):
        self.client_key_file = client_key_file
        self.server_key_file = server_key_file
        self.public, self.secret = load_secret_key(client_key_file)
        self.server_public = load_public_key(server_key_file)

    def apply(self, sock) -> None:
        apply_client_keys(sock, self.public, self.secret, self.server_public)

    def __repr__(self) -> str:
        return f"ClientAuth({self.client_key_file!r}, {self.server_key_file!r})"


AuthLike = Union[None, ClientAuth, Tuple[str, str]]


def client_auth(auth: AuthLike = None) -> Optional[ClientAuth]:
    """``auth`` as a ClientAuth: a ClientAuth passes through, a ``(client_secret_file,
    server_public_file)`` pair is loaded, None means the environment
    (``RMQ_AUTH_CLIENT_KEY`` + ``RMQ_AUTH_SERVER_KEY``; both or neither).

    Raises
    ------
    SecurityError
        Unreadable files, or only one of the two variables set.
    """
    if isinstance(auth, ClientAuth):
        return auth
    if auth is not None:
        try:
            client, server = auth
        except (TypeError, ValueError):
            raise SecurityError("auth must be a ClientAuth or a (client_key_file, server_key_file) pair") from None
        return ClientAuth(str(client), str(server))
    return env_client_auth()


_env_cache: dict = {}


def env_client_auth() -> Optional[ClientAuth]:
    """ClientAuth from RMQ_AUTH_CLIENT_KEY / RMQ_AUTH_SERVER_KEY (cached per value pair)."""
    c = os.environ.get(ENV_CLIENT_KEY, "")
    s = os.environ.get(ENV_SERVER_KEY, "")
    if not c and not s:
        return None
    if not c or not s:
        raise SecurityError(f"set both {ENV_CLIENT_KEY} (client secret key file) and "
                            f"{ENV_SERVER_KEY} (server public key file), or neither")
    key = (c, s)
    a = _env_cache.get(key)
    if a is None:
        a = _env_cache[key] = ClientAuth(c, s)
    return a


def apply_client_keys(sock, public: bytes, secret: bytes, server_public: bytes) -> None:
    sock.curve_serverkey = server_public
    sock.curve_publickey = public
    sock.curve_secretkey = secret


def warn_if_public(ep: str, curve: bool, logger: Optional[logging.Logger] = None) -> bool:
    """Log a warning for a tcp bind on a non-loopback address; True if it is one."""
    host = endpoint_host(ep)
    if host is None or is_loopback_host(host):
        return False
    (logger or log).warning("listening on non-loopback address %s (%s)", ep,
                            "CURVE on" if curve else
                            "CURVE OFF: anyone who can reach it may send and consume; "
                            "admin commands are served to loopback peers only")
    return True


_ctx_auth: "weakref.WeakKeyDictionary" = None   # type: ignore[assignment]


def register_context(ctx, auth: AuthLike) -> None:
    """Use ``auth`` for every rmq DEALER made on ``ctx`` (a client's private zmq context)."""
    global _ctx_auth
    a = client_auth(auth) if auth is not None else None
    if a is None:
        return
    if _ctx_auth is None:
        _ctx_auth = weakref.WeakKeyDictionary()
    _ctx_auth[ctx] = a


def context_auth(ctx) -> Optional[ClientAuth]:
    """The ClientAuth registered for ``ctx`` (None: use the environment)."""
    if _ctx_auth is None:
        return None
    try:
        return _ctx_auth.get(ctx)
    except TypeError:
        return None
