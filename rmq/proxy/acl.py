"""RocketMQ ACL 1.0 ("plain ACL") for the remoting proxy's clients.

CURVE does not apply to raw TCP, so with ``authEnable=true`` (or ``aclEnable=true``, RocketMQ 4.x's
name; ``rmq proxy --acl-file``) the proxy authenticates RocketMQ's own 4.x clients as a RocketMQ
broker / 5.x proxy does, against keys in a YAML file the admin manages (``rmq admin
updateAclConfig`` / ``deleteAclConfig``).  Facts from apache/rocketmq 4.9.8 ``acl/`` and 5.1.4
``proxy/``; each rule below names its source.

The client (``AclClientRPCHook.doBeforeRequest``; the C++ client's ``ClientRPCHook``) adds
``AccessKey`` (and an optional ``SecurityToken``; the C++ client an ``OnsChannel``) to the request's
ext fields, then ``Signature`` = Base64(HmacSHA1(secretKey, content)) where content is the values
of every ext field but ``Signature``, in key order (a TreeMap), concatenated without separators,
followed by the body bytes (``AclUtils.combineRequestContent``, ``AclSigner``).

The server (``PlainAccessValidator.parse`` + ``PlainPermissionManager.validate``):

1. a peer matching ``globalWhiteRemoteAddresses`` passes, nothing else checked;
2. no ``AccessKey``: ``No accessKey is configured``; an unknown one: ``No acl config for AK``;
3. a peer matching the account's ``whiteRemoteAddress`` passes;
4. a wrong signature: ``Check signature failed for accessKey=AK``;
5. a send of ``RMQ_SYS_TRACE_TOPIC`` (message trace) passes;
6. the admin codes (:data:`ADMIN_CODES`) need ``admin: true``; then each resource the request
   names needs its permission (:func:`request_resources`), from the account's ``topicPerms`` /
   ``groupPerms`` entry, else its ``defaultTopicPerm`` / ``defaultGroupPerm`` (DENY when unset):
   ``No default permission for topic:T`` / ``group:G``.

A failed check answers NO_PERMISSION (16) with that message as the remark (5.x proxy,
``AbstractRemotingActivity.writeErrResponse``: ``AclException`` -> ``ResponseCode.NO_PERMISSION``,
``t.getMessage()``; a 4.9 broker answered SYSTEM_ERROR with the exception's text).

The file is re-read when it changes (RocketMQ's ``AclFileWatchService`` polls its mtime every
5 s; here a request looks at most every :data:`RELOAD_CHECK_INTERVAL_S`); a file that does not
parse or check keeps the last good accounts and logs why.

Known weaknesses of ACL 1.0 (``../shared/RELIABILITY.md``): no timestamp or nonce, so a captured
request validates again; values are joined without separators; a white address skips the
signature.  Keep the proxy on loopback (its default) or behind TLS termination.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import json
import logging
import os
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

from rmq.common import mix_all
from rmq.common.mix_all import RETRY_GROUP_TOPIC_PREFIX
from rmq.common.topic_validator import RMQ_SYS_TRACE_TOPIC
from rmq.errors import MQClientError
from rmq.protocol import RequestCode, ResponseCode

log = logging.getLogger("rmq.proxy.acl")

# -- names (SessionCredentials, AclConstants; MixAll's and TopicValidator's: rmq.common) -----------------
ACCESS_KEY = "AccessKey"                      # SessionCredentials.ACCESS_KEY
SIGNATURE = "Signature"                       # SessionCredentials.SIGNATURE
SECURITY_TOKEN = "SecurityToken"              # SessionCredentials.SECURITY_TOKEN
UNIQUE_MSG_QUERY_FLAG = "_UNIQUE_KEY_QUERY"   # MixAll.UNIQUE_MSG_QUERY_FLAG: not signed by clients <= 4.9.3
V4_9_3_ORDINAL = 399                          # MQVersion.Version.V4_9_3.ordinal() (5.1.4 PlainAccessResource.parse)

CONFIG_GLOBAL_WHITE_ADDRS = "globalWhiteRemoteAddresses"   # AclConstants
CONFIG_ACCOUNTS = "accounts"
CONFIG_ACCESS_KEY = "accessKey"
CONFIG_SECRET_KEY = "secretKey"
CONFIG_WHITE_ADDR = "whiteRemoteAddress"
CONFIG_ADMIN_ROLE = "admin"
CONFIG_DEFAULT_TOPIC_PERM = "defaultTopicPerm"
CONFIG_DEFAULT_GROUP_PERM = "defaultGroupPerm"
CONFIG_TOPIC_PERMS = "topicPerms"
CONFIG_GROUP_PERMS = "groupPerms"
CONFIG_DATA_VERSION = "dataVersion"

# -- permissions (Permission.java) ----------------------------------------------------------------------
DENY, ANY, PUB, SUB = 1, 1 << 1, 1 << 2, 1 << 3
PERM_NAMES = {"PUB": PUB, "SUB": SUB, "PUB|SUB": PUB | SUB, "SUB|PUB": PUB | SUB, "DENY": DENY}
# Permission.ADMIN_CODE: only an ``admin: true`` account may send these
ADMIN_CODES = frozenset(int(c) for c in (RequestCode.UPDATE_AND_CREATE_TOPIC, RequestCode.UPDATE_BROKER_CONFIG,
                                         RequestCode.DELETE_TOPIC_IN_BROKER,
                                         RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
                                         RequestCode.DELETE_SUBSCRIPTIONGROUP))

# -- limits ---------------------------------------------------------------------------------------------
ACCESS_KEY_MIN_LENGTH = 6          # AclConstants: an accessKey must be LONGER than this
SECRET_KEY_MIN_LENGTH = 6          # AclConstants: a secretKey must be longer than this
MAX_KEY_LENGTH = 256               # rmq: longest accessKey / secretKey accepted
MAX_ACL_FILE_BYTES = 4 * 1024 * 1024   # rmq: a longer ACL file is refused (kept last good)
MAX_ACCOUNTS = 10_000              # rmq: accounts in one file
MAX_RESOURCE_PERMS = 10_000        # rmq: topicPerms + groupPerms entries of one account
MAX_WHITE_ADDRESSES = 1_000        # rmq: globalWhiteRemoteAddresses entries
RELOAD_CHECK_INTERVAL_S = 1.0      # rmq: a request stats the file at most this often (RocketMQ polls every 5 s)
ACL_FILE_MODE = 0o600              # rmq: the file holds secret keys; written owner-only
DEFAULT_ACL_FILE_NAME = "plain_acl.yml"   # RocketMQ's conf/plain_acl.yml (rocketmq.acl.plain.file)


class AclError(MQClientError):
    """A failed check or a bad ACL file (RocketMQ ``AclException``).  ``str()`` is RocketMQ's
    message alone, which the proxy sends as the NO_PERMISSION answer's remark."""

    def __init__(self, message: str, response_code: int = int(ResponseCode.NO_PERMISSION)):
        super().__init__(message, response_code)

    def __str__(self) -> str:
        return self.remark


# -- signatures -----------------------------------------------------------------------------------------
def cal_signature(data: bytes, secret_key: str) -> str:
    """Base64(HmacSHA1(secret_key as UTF-8, data)) (``AclSigner.calSignature``; the C++ client's
    ``spas_sign``, SIGN_HMACSHA1).

    Raises
    ------
    AclError
        An empty secret key (Java's ``SecretKeySpec`` refuses it: ``AclSignerTest``).
    """
    if not secret_key:
        raise AclError("[10015:signature-failed] unable to calculate a request signature. error=Empty key")
    return base64.b64encode(hmac.new(secret_key.encode("utf-8"), data, hashlib.sha1).digest()).decode("ascii")


def combine_request_content(fields: dict, body: bytes, version: int = 1 << 30) -> bytes:
    """What a request's signature covers: the values of ``fields`` but ``Signature``, in key order
    (Java's TreeMap: UTF-16 code unit order), concatenated, then ``body``
    (``AclUtils.combineRequestContent``).  ``_UNIQUE_KEY_QUERY`` is left out for a client whose
    ``version`` is at most V4_9_3 (5.1.4 ``PlainAccessResource.parse``)."""
    skip_unique = version <= V4_9_3_ORDINAL
    parts = [fields[k] for k in sorted(fields, key=_java_order)
             if k != SIGNATURE and not (skip_unique and k == UNIQUE_MSG_QUERY_FLAG)]
    return "".join("null" if v is None else str(v) for v in parts).encode("utf-8") + bytes(body or b"")


def _java_order(key: str) -> bytes:
    return key.encode("utf-16-be")      # String.compareTo compares UTF-16 code units


def sign_fields(fields: dict, body: bytes, access_key: str, secret_key: str,
                security_token: Optional[str] = None) -> dict:
    """``fields`` plus ``AccessKey`` (, ``SecurityToken``) and their ``Signature``, as
    ``AclClientRPCHook.doBeforeRequest`` sends them (for tests and rmq-side tools)."""
    out = dict(fields)
    out[ACCESS_KEY] = access_key
    if security_token is not None:
        out[SECURITY_TOKEN] = security_token
    out[SIGNATURE] = cal_signature(combine_request_content(out, body), secret_key)
    return out


# -- permissions ----------------------------------------------------------------------------------------
def parse_perm(text: Any) -> int:
    """``PUB``, ``SUB``, ``PUB|SUB`` / ``SUB|PUB``, ``DENY``; anything else (and None) is DENY
    (``Permission.parsePermFromString``)."""
    if text is None:
        return DENY
    return PERM_NAMES.get(str(text).strip(), DENY)


def check_permission(needed: int, owned: int) -> bool:
    """``Permission.checkPermission``: DENY wins; ANY needs PUB or SUB; else a common bit."""
    if owned & DENY:
        return False
    if needed & ANY:
        return bool(owned & (PUB | SUB))
    return bool(needed & owned)


def retry_topic(group: Optional[str]) -> Optional[str]:
    """``%RETRY%<group>``: the name a group's permission is kept under (``MixAll.getRetryTopic``)."""
    return None if group is None else mix_all.retry_topic(group)


def is_retry_topic(name: Optional[str]) -> bool:
    return name is not None and mix_all.is_retry_topic(name)


def print_resource(resource: str) -> str:
    """``group:G`` for a retry topic, else ``topic:T`` (``PlainAccessResource.printStr``)."""
    if is_retry_topic(resource):
        return "group:" + resource[len(RETRY_GROUP_TOPIC_PREFIX):]
    return "topic:" + resource


def parse_resource_perms(entries: Any, is_topic: bool) -> dict:
    """``["topicA=DENY", "topicB=PUB|SUB"]`` -> ``{resource: perm}``; groups are keyed by their
    retry topic (``Permission.parseResourcePerms``).

    Raises
    ------
    AclError
        An entry that is not ``Res=Perm`` (RocketMQ's message), or over MAX_RESOURCE_PERMS entries.
    """
    if not entries:
        return {}
    if isinstance(entries, str) or not isinstance(entries, list):
        raise AclError(f"{CONFIG_TOPIC_PERMS if is_topic else CONFIG_GROUP_PERMS} must be a list of Res=Perm")
    if len(entries) > MAX_RESOURCE_PERMS:
        raise AclError(f"more than {MAX_RESOURCE_PERMS} resource permissions in one account")
    out = {}
    for e in entries:
        items = [x for x in str(e).split("=") if x]          # StringUtils.split drops empty tokens
        if len(items) != 2:
            raise AclError(f"Parse resource permission failed for {'topic' if is_topic else 'group'}:{e}")
        name = items[0].strip()
        out[name if is_topic else retry_topic(name)] = parse_perm(items[1])
    return out


def check_resource_perms(entries: Iterable[str]) -> None:
    """Each entry ``Res=Perm`` with a known permission (``Permission.checkResourcePerms``: what
    updateAclConfig accepts).

    Raises
    ------
    AclError
        RocketMQ's messages.
    """
    for e in entries or ():
        items = [x for x in str(e).split("=") if x]
        if len(items) != 2:
            raise AclError(f"Parse Resource format error for {e}.\n"
                           f"The expected resource format is 'Res=Perm'. For example: topicA=SUB")
        if items[1].strip() != "DENY" and parse_perm(items[1]) == DENY:
            raise AclError(f"Parse resource permission error for {e}.\n"
                           f"The expected permissions are 'SUB' or 'PUB' or 'SUB|PUB' or 'PUB|SUB'.")


# -- white remote addresses (RemoteAddressStrategyFactory) ----------------------------------------------
class AddressMatcher:
    """One ``whiteRemoteAddress`` / global white address (``RemoteAddressStrategyFactory``):

    * blank: matches nothing; ``*``, ``*.*.*.*``, ``*:*:*:*:*:*:*:*``: everything;
    * ``1.1.1.{1,2}`` / ``1:2::{a,b}``, or ``a,b,c``: any of the addresses;
    * ``192.168.1.*``, ``192.168.1.1-20``, ``10.10.*.*``, ``1:2:3:*``: exact leading parts, then one
      part in a range (``*`` = all), the parts after it anything;
    * else one IPv4 / IPv6 address.

    Raises
    ------
    AclError
        A pattern RocketMQ refuses (not an address, a range outside 0..255 / 0..ffff, a wildcard
        in the first part).
    """

    def __init__(self, pattern: Any):
        self.pattern = "" if pattern is None else str(pattern).strip()
        p = self.pattern
        self.kind, self.addrs, self.range = "none", frozenset(), None
        if not p:
            return
        if p in ("*", "*.*.*.*", "*:*:*:*:*:*:*:*"):
            self.kind = "all"
        elif p.endswith("}"):
            sep = ":" if ":" in p else "."
            head, _, last = p.rpartition(sep)
            if not last.startswith("{") or (sep == "." and len(p.split(".")) < 4):
                raise AclError(f"MultipleRemoteAddressStrategy netaddress examine scope Exception netaddress {p}")
            self.kind, self.addrs = "set", frozenset(_norm_ip(head + sep + x.strip(), p)
                                                    for x in last[1:-1].split(",") if x.strip())
        elif "," in p:
            self.kind, self.addrs = "set", frozenset(_norm_ip(x.strip(), p) for x in p.split(",") if x.strip())
        elif "*" in p or "-" in p:
            self.kind, self.range = "range", _parse_range(p)
        else:
            self.kind, self.addrs = "set", frozenset((_norm_ip(p, p),))

    def match(self, ip: Optional[str]) -> bool:
        if self.kind == "none" or not ip:
            return False
        if self.kind == "all":
            return True
        try:
            addr = ipaddress.ip_address(ip.strip("[]"))
        except ValueError:
            return False
        if self.kind == "set":
            return addr.exploded.upper() in self.addrs
        version, head, lo, hi = self.range
        if addr.version != version:
            return False
        parts = _parts(addr)
        return parts[:len(head)] == head and lo <= parts[len(head)] <= hi


def _norm_ip(text: str, pattern: str) -> str:
    try:
        return ipaddress.ip_address(text).exploded.upper()
    except ValueError:
        raise AclError(f"Netaddress examine Exception netaddress is {pattern}") from None


def _parts(addr) -> list:
    if addr.version == 4:
        return [int(x) for x in str(addr).split(".")]
    return [int(x, 16) for x in addr.exploded.split(":")]


def _parse_range(p: str) -> tuple:
    """(ip version, exact leading parts, lo, hi) of a range pattern (RangeRemoteAddressStrategy)."""
    bad = AclError(f"RangeRemoteAddressStrategy netaddress examine scope Exception netaddress {p}")
    v6 = ":" in p
    if v6:
        if "*" in p and p.index("*") != len(p) - 1:      # AclUtils.IPv6AddressCheck: '*' only at the end
            raise bad
        groups = p.split(":")
    else:
        groups = p.split(".")
        if len(groups) != 4:                              # AclUtils.isScope: four parts
            raise bad
    idx = next((i for i, g in enumerate(groups) if g.strip() == "*" or "-" in g), None)
    if idx is None or idx == 0:
        raise bad
    width, top = (16, 0xFFFF) if v6 else (10, 255)
    g = groups[idx].strip()
    if g == "*":
        lo, hi = 0, top
    else:
        a, _, b = g.partition("-")
        try:
            lo, hi = int(a, width), int(b, width)
        except ValueError:
            raise bad from None
        if not (0 <= lo <= hi <= top):
            raise bad
    head_text = groups[:idx]
    try:
        if v6:
            lead = ":".join(head_text) + ":"            # "fe80::1-ff": the prefix keeps its "::"
            lead = lead if lead.endswith("::") else lead[:-1]
            total = idx if "::" not in lead else 8 - (len(groups) - idx)
            if "::" in lead:
                left, _, right = lead.partition("::")
                lp = [x for x in left.split(":") if x]
                rp = [x for x in right.split(":") if x]
                head_text = lp + ["0"] * (total - len(lp) - len(rp)) + rp
            head = [int(x, 16) for x in head_text]
            if any(not 0 <= x <= 0xFFFF for x in head) or len(head) >= 8:
                raise bad
        else:
            head = [int(x) for x in head_text]
            if any(not 0 <= x <= 255 for x in head):
                raise bad
    except ValueError:
        raise bad from None
    return (6 if v6 else 4), head, lo, hi


# -- accounts and the file --------------------------------------------------------------------------------
@dataclass
class Account:
    """One ``accounts`` entry (``PlainAccessResource`` built by ``buildPlainAccessResource``)."""
    access_key: str
    secret_key: str
    white: AddressMatcher
    admin: bool = False
    default_topic_perm: int = DENY
    default_group_perm: int = DENY
    perms: dict = field(default_factory=dict)       # resource (topic / %RETRY%group) -> perm


@dataclass
class AclConfig:
    """A parsed ACL file: global white addresses and accounts by access key."""
    white: list
    accounts: dict


def check_keys(access_key: Any, secret_key: Any) -> None:
    """``checkPlainAccessConfig``: both keys present and longer than 6 characters (and at most
    MAX_KEY_LENGTH).

    Raises
    ------
    AclError
        RocketMQ's message, the secret key not echoed.
    """
    ak = None if access_key is None else str(access_key)
    sk = None if secret_key is None else str(secret_key)
    if ak is None or sk is None or len(ak) <= ACCESS_KEY_MIN_LENGTH or len(sk) <= SECRET_KEY_MIN_LENGTH:
        raise AclError(f"The accessKey={ak} and secretKey={'<hidden>' if sk else sk} cannot be null and "
                       f"length should longer than {ACCESS_KEY_MIN_LENGTH}")
    if len(ak) > MAX_KEY_LENGTH or len(sk) > MAX_KEY_LENGTH:
        raise AclError(f"accessKey and secretKey must be at most {MAX_KEY_LENGTH} characters")


def build_account(doc: Any) -> Account:
    """An ``accounts`` entry -> :class:`Account` (``buildPlainAccessResource``).

    Raises
    ------
    AclError
        Not a mapping, bad keys, bad permission entries or white address.
    """
    if not isinstance(doc, dict):
        raise AclError(f"an {CONFIG_ACCOUNTS} entry must be a mapping, got {type(doc).__name__}")
    check_keys(doc.get(CONFIG_ACCESS_KEY), doc.get(CONFIG_SECRET_KEY))
    perms = parse_resource_perms(doc.get(CONFIG_GROUP_PERMS), is_topic=False)
    perms.update(parse_resource_perms(doc.get(CONFIG_TOPIC_PERMS), is_topic=True))
    if len(perms) > MAX_RESOURCE_PERMS:
        raise AclError(f"more than {MAX_RESOURCE_PERMS} resource permissions in one account")
    return Account(str(doc[CONFIG_ACCESS_KEY]), str(doc[CONFIG_SECRET_KEY]), AddressMatcher(doc.get(CONFIG_WHITE_ADDR)),
                   _bool(doc.get(CONFIG_ADMIN_ROLE)), parse_perm(doc.get(CONFIG_DEFAULT_TOPIC_PERM)),
                   parse_perm(doc.get(CONFIG_DEFAULT_GROUP_PERM)), perms)


def _bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    return str(v).strip().lower() == "true"        # Boolean.parseBoolean


def parse_acl_doc(doc: Any) -> AclConfig:
    """A loaded ``plain_acl.yml`` document -> :class:`AclConfig` (``PlainPermissionManager.load``;
    an empty file: no accounts).  An access key given twice: the first wins, as across RocketMQ's
    files.

    Raises
    ------
    AclError
        Not a mapping, a list that is not a list, over a limit, or a bad account.
    """
    if doc is None:
        return AclConfig([], {})
    if not isinstance(doc, dict):
        raise AclError("the ACL file must be a YAML mapping")
    white_src = doc.get(CONFIG_GLOBAL_WHITE_ADDRS) or []
    accounts_src = doc.get(CONFIG_ACCOUNTS) or []
    if not isinstance(white_src, list) or not isinstance(accounts_src, list):
        raise AclError(f"{CONFIG_GLOBAL_WHITE_ADDRS} and {CONFIG_ACCOUNTS} must be lists")
    if len(white_src) > MAX_WHITE_ADDRESSES:
        raise AclError(f"more than {MAX_WHITE_ADDRESSES} {CONFIG_GLOBAL_WHITE_ADDRS}")
    if len(accounts_src) > MAX_ACCOUNTS:
        raise AclError(f"more than {MAX_ACCOUNTS} {CONFIG_ACCOUNTS}")
    white = [AddressMatcher(w) for w in white_src]
    accounts: dict = {}
    for a in accounts_src:
        acc = build_account(a)
        if acc.access_key in accounts:
            log.warning("accessKey %s is repeated in the ACL file: the first entry wins", acc.access_key)
            continue
        accounts[acc.access_key] = acc
    return AclConfig(white, accounts)


def read_acl_file(path: str) -> Any:
    """The YAML document of ``path`` (None when empty).

    Raises
    ------
    AclError
        Unreadable, over MAX_ACL_FILE_BYTES, or not YAML.
    """
    import yaml
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_ACL_FILE_BYTES + 1)
    except OSError as e:
        raise AclError(f"cannot read ACL file {path}: {e.strerror or e}") from None
    if len(data) > MAX_ACL_FILE_BYTES:
        raise AclError(f"ACL file {path} is over {MAX_ACL_FILE_BYTES} bytes")
    try:
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)      # libyaml when PyYAML has it
        return yaml.load(data.decode("utf-8-sig"), Loader=loader) if data.strip() else None  # noqa: S506 - safe loader
    except (UnicodeDecodeError, yaml.YAMLError) as e:
        raise AclError(f"ACL file {path} is not YAML: {e}") from None


def load_acl_file(path: str) -> AclConfig:
    """:func:`read_acl_file` + :func:`parse_acl_doc`.

    Raises
    ------
    AclError
        See both.
    """
    return parse_acl_doc(read_acl_file(path))


# -- what a request needs (PlainAccessResource.parse, 5.1.4) ---------------------------------------------
def request_resources(cmd) -> dict:
    """{resource: needed perm} of a request (``PlainAccessResource.parse``):

    * SEND_MESSAGE (10): PUB on ``topic``; SEND_MESSAGE_V2 (310) / SEND_BATCH_MESSAGE (320): PUB
      on ``b``.  A ``%RETRY%G`` topic needs SUB on group G instead (RocketMQ looks G up in a field
      ``group`` / ``a``; rmq takes it from the topic, so the rule holds whatever the client names
      as its producer group);
    * CONSUMER_SEND_MSG_BACK (36): SUB on group ``group``;
    * PULL_MESSAGE (11): SUB on ``topic`` and on group ``consumerGroup``;
    * QUERY_MESSAGE (12): SUB on ``topic``;
    * HEART_BEAT (34): SUB on each consumer's group and each subscribed topic (the JSON body);
    * UNREGISTER_CLIENT (35), GET_CONSUMER_LIST_BY_GROUP (38): SUB on group ``consumerGroup``;
    * UPDATE_CONSUMER_OFFSET (15): SUB on group ``consumerGroup`` and on ``topic``;
    * anything else: no resource (the signature is still checked).

    ``%DLQ%`` topics have no rule of their own: they are topics.

    Raises
    ------
    AclError
        A HEART_BEAT body that is not HeartbeatData JSON.
    """
    f, code, need = cmd.ext_fields, cmd.code, {}

    def add(resource, perm):
        if resource is not None:
            need[resource] = perm
    if code in (RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE):
        topic = f.get("topic") if code == RequestCode.SEND_MESSAGE else f.get("b")
        if is_retry_topic(topic):
            add(topic, SUB)
        else:
            add(topic, PUB)
    elif code == RequestCode.CONSUMER_SEND_MSG_BACK:
        add(retry_topic(f.get("group")), SUB)
    elif code == RequestCode.PULL_MESSAGE:
        add(f.get("topic"), SUB)
        add(retry_topic(f.get("consumerGroup")), SUB)
    elif code == RequestCode.QUERY_MESSAGE:
        add(f.get("topic"), SUB)
    elif code == RequestCode.HEART_BEAT:
        try:
            data = json.loads(bytes(cmd.body or b"{}").decode("utf-8"))
            for c in data.get("consumerDataSet") or []:
                add(retry_topic(c.get("groupName")), SUB)
                for s in c.get("subscriptionDataSet") or []:
                    add(s.get("topic"), SUB)
        except (UnicodeDecodeError, ValueError, AttributeError, TypeError) as e:
            raise AclError(f"heartbeat body is not HeartbeatData: {e}") from None
    elif code in (RequestCode.UNREGISTER_CLIENT, RequestCode.GET_CONSUMER_LIST_BY_GROUP):
        add(retry_topic(f.get("consumerGroup")), SUB)
    elif code == RequestCode.UPDATE_CONSUMER_OFFSET:
        add(retry_topic(f.get("consumerGroup")), SUB)
        add(f.get("topic"), SUB)
    return need


def check_perm(code: int, need: dict, owned: Account) -> None:
    """``PlainPermissionManager.checkPerm``.

    Raises
    ------
    AclError
        ``Need admin permission for request code=C, but accessKey=AK is not`` /
        ``No default permission for topic:T`` (``group:G``).
    """
    if code in ADMIN_CODES and not owned.admin:
        raise AclError(f"Need admin permission for request code={code}, but accessKey={owned.access_key} is not")
    if not need or (owned.admin and not owned.perms):
        return
    for resource, perm in need.items():
        has = owned.perms.get(resource)
        if has is None:
            has = owned.default_group_perm if is_retry_topic(resource) else owned.default_topic_perm
        if not check_permission(perm, has):
            raise AclError(f"No default permission for {print_resource(resource)}")


class PlainAccessValidator:
    """The proxy's ACL: :meth:`check` each request (``PlainAccessValidator`` +
    ``PlainPermissionManager``), the accounts of ``path`` re-read when the file changes.

    Parameters
    ----------
    path : str
        The ``plain_acl.yml``.  Missing: created empty, mode ACL_FILE_MODE (RocketMQ's
        ``assureAclConfigFilesExist``): no account, so every request is refused until the admin
        adds one.

    Raises
    ------
    AclError
        The file cannot be read or checked at start (there is no last good one yet).
    """

    def __init__(self, path: str):
        self.path = os.path.abspath(os.path.expanduser(path))
        if not os.path.exists(self.path):
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, ACL_FILE_MODE)
            os.close(fd)
        self._lock = threading.Lock()
        self._stamp = self._file_stamp()
        self.config = load_acl_file(self.path)
        self._checked_at = time.monotonic()
        self.reloads = 0
        self.reload_errors = 0
        self.last_error: Optional[str] = None

    def _file_stamp(self) -> Optional[tuple]:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size, st.st_ino

    def maybe_reload(self, force: bool = False) -> bool:
        """Re-read the file if its mtime / size / inode changed (looked at most every
        RELOAD_CHECK_INTERVAL_S unless ``force``); a bad file keeps the last good accounts and is
        logged.  Returns whether new accounts were taken."""
        now = time.monotonic()
        if not force and now - self._checked_at < RELOAD_CHECK_INTERVAL_S:
            return False
        with self._lock:
            self._checked_at = now
            stamp = self._file_stamp()
            if stamp == self._stamp or stamp is None:
                return False
            self._stamp = stamp
            try:
                cfg = load_acl_file(self.path)
            except AclError as e:
                self.reload_errors += 1
                self.last_error = str(e)
                log.error("ACL file %s not taken, the last good one stays: %s", self.path, e)
                return False
            self.config = cfg
            self.reloads += 1
            self.last_error = None
            log.info("ACL file %s re-read: %d accounts, %d global white addresses", self.path,
                     len(cfg.accounts), len(cfg.white))
            return True

    def validate(self, cmd, remote_addr: str) -> None:
        """``PlainPermissionManager.validate`` of request ``cmd`` from ``remote_addr``
        (``host:port``; the host is matched, as ``PlainAccessResource.parse`` does).

        Raises
        ------
        AclError
            The check failed (module docstring, steps 1-6).
        """
        self.maybe_reload()
        cfg = self.config
        host = remote_addr.rsplit(":", 1)[0] if remote_addr and ":" in remote_addr else remote_addr
        if any(w.match(host) for w in cfg.white):
            return
        fields = cmd.ext_fields
        ak = fields.get(ACCESS_KEY)
        if ak is None:
            raise AclError("No accessKey is configured")
        owned = cfg.accounts.get(ak)
        if owned is None:
            raise AclError(f"No acl config for {ak}")
        if owned.white.match(host):
            return
        content = combine_request_content(fields, cmd.body, getattr(cmd, "version", 1 << 30))
        expected = cal_signature(content, owned.secret_key)
        if not hmac.compare_digest(expected.encode(), str(fields.get(SIGNATURE, "")).encode("utf-8")):
            raise AclError(f"Check signature failed for accessKey={ak}")
        need = request_resources(cmd)
        if need.get(RMQ_SYS_TRACE_TOPIC) == PUB:
            return
        check_perm(cmd.code, need, owned)

    def check(self, cmd, remote_addr: str) -> None:
        """:meth:`validate`, each refusal logged; what the proxy calls before handling a request.

        Raises
        ------
        AclError
            (an MQClientError with response code NO_PERMISSION) the check failed.
        """
        try:
            self.validate(cmd, remote_addr)
        except AclError as e:
            log.info("refused request code %d from %s: %s", cmd.code, remote_addr, e)
            raise


    # -- RocketMQ 5 gRPC clients ---------------------------------------------------------------------
    def validate_grpc(self, metadata: dict, remote_addr: str, need: dict) -> None:
        """The same accounts and rules for a gRPC call (RocketMQ 5 proxy, ACL 1.0 over gRPC): the
        ``authorization`` metadata ``MQv2-HMAC-SHA1 Credential=AK, SignedHeaders=x-mq-date-time,
        Signature=HEX`` (the 5.x clients' ``Signature.sign``: hex of HmacSHA1(secretKey, the
        ``x-mq-date-time`` value), compared without regard to case); ``need``: {resource: perm}
        of the call (:data:`PUB`, :data:`SUB`, :data:`ANY`; groups as ``%RETRY%<group>``).

        Raises
        ------
        AclError
            As :meth:`validate`.
        """
        self.maybe_reload()
        cfg = self.config
        host = _grpc_host(remote_addr)
        if any(w.match(host) for w in cfg.white):
            return
        auth = parse_grpc_authorization(metadata.get(GRPC_AUTHORIZATION, ""))
        if auth is None or not auth[0]:
            raise AclError("No accessKey is configured")
        ak, signature = auth
        owned = cfg.accounts.get(ak)
        if owned is None:
            raise AclError(f"No acl config for {ak}")
        if owned.white.match(host):
            return
        content = str(metadata.get(GRPC_DATE_TIME, "")).encode("utf-8")
        expected = hmac.new(owned.secret_key.encode("utf-8"), content, hashlib.sha1).hexdigest()
        if not hmac.compare_digest(expected, signature.lower()):
            raise AclError(f"Check signature failed for accessKey={ak}")
        check_perm(0, need, owned)

    def check_grpc(self, metadata: dict, remote_addr: str, need: dict) -> None:
        """:meth:`validate_grpc`, each refusal logged.

        Raises
        ------
        AclError
            The check failed.
        """
        try:
            self.validate_grpc(metadata, remote_addr, need)
        except AclError as e:
            log.info("refused gRPC call from %s: %s", remote_addr, e)
            raise


GRPC_AUTHORIZATION = "authorization"          # RocketMQ 5 client metadata (MetadataUtils / Signature)
GRPC_DATE_TIME = "x-mq-date-time"
GRPC_ALGORITHM = "MQv2-HMAC-SHA1"


def parse_grpc_authorization(value: str) -> Optional[tuple]:
    """``(access key, signature)`` of a 5.x client's ``authorization`` value, or None when it is
    not ``MQv2-HMAC-SHA1 Credential=..., SignedHeaders=..., Signature=...``."""
    algo, _, rest = str(value or "").strip().partition(" ")
    if algo != GRPC_ALGORITHM:
        return None
    parts = {}
    for item in rest.split(","):
        k, sep, v = item.strip().partition("=")
        if sep:
            parts[k] = v
    if "Credential" not in parts or "Signature" not in parts:
        return None
    return parts["Credential"].split("/", 1)[0], parts["Signature"]


def _grpc_host(peer: str) -> str:
    """The IP of a gRPC peer (``ipv4:1.2.3.4:5``, ``ipv6:[::1]:5``, or ``host:port``)."""
    p = str(peer or "")
    for prefix in ("ipv4:", "ipv6:"):
        if p.startswith(prefix):
            p = p[len(prefix):]
    host = p.rsplit(":", 1)[0] if ":" in p else p
    return host.strip("[]")


# -- the admin's edits (updateAclConfig / deleteAclConfig) ---------------------------------------------
def update_account(path: str, access_key: str, secret_key: Optional[str] = None, *,
                   white_remote_address: Optional[str] = None, admin: Optional[bool] = None,
                   default_topic_perm: Optional[str] = None, default_group_perm: Optional[str] = None,
                   topic_perms: Optional[list] = None, group_perms: Optional[list] = None) -> str:
    """Create or update account ``access_key`` in ``path`` (``PlainPermissionManager.updateAccessConfig``
    + ``createAclAccessConfigMap``: given fields replace the entry's, the rest stay; ``admin`` is
    written false when a new entry leaves it unset); ``dataVersion`` counts up.  Atomic (temp file +
    ``os.replace``, mode ACL_FILE_MODE).  Returns ``"created"`` or ``"updated"``.

    Raises
    ------
    AclError
        Bad keys (a new account needs a secret key), bad permission entries or white address, or
        the file cannot be read, parsed or written.
    """
    ak = str(access_key or "")
    doc = _read_doc(path)
    accounts = doc.setdefault(CONFIG_ACCOUNTS, []) or []
    doc[CONFIG_ACCOUNTS] = accounts
    entry = next((a for a in accounts if isinstance(a, dict) and str(a.get(CONFIG_ACCESS_KEY)) == ak), None)
    action = "updated" if entry is not None else "created"
    new = dict(entry) if entry is not None else {CONFIG_ACCESS_KEY: ak, CONFIG_ADMIN_ROLE: False}
    new[CONFIG_ACCESS_KEY] = ak
    if secret_key:
        new[CONFIG_SECRET_KEY] = str(secret_key)
    if white_remote_address is not None:
        new[CONFIG_WHITE_ADDR] = white_remote_address
    if admin is not None:
        new[CONFIG_ADMIN_ROLE] = bool(admin)
    for key, perm in ((CONFIG_DEFAULT_TOPIC_PERM, default_topic_perm), (CONFIG_DEFAULT_GROUP_PERM, default_group_perm)):
        if perm:
            if perm.strip() != "DENY" and parse_perm(perm) == DENY:
                raise AclError(f"{key} must be PUB, SUB, PUB|SUB or DENY, got {perm!r}")
            new[key] = perm.strip()
    for key, perms in ((CONFIG_TOPIC_PERMS, topic_perms), (CONFIG_GROUP_PERMS, group_perms)):
        if perms is not None:
            check_resource_perms(perms)
            new[key] = [str(p).strip() for p in perms]
    build_account(new)                       # every rule the loader applies
    if entry is not None:
        accounts[accounts.index(entry)] = new
    else:
        accounts.append(new)
    parse_acl_doc(doc)                       # the whole file still loads
    _write_doc(path, doc)
    return action


def delete_account(path: str, access_key: str) -> bool:
    """Remove account ``access_key`` from ``path`` (``PlainPermissionManager.deleteAccessConfig``);
    False when there is none.  Atomic, as :func:`update_account`.

    Raises
    ------
    AclError
        The file cannot be read, parsed or written.
    """
    doc = _read_doc(path)
    accounts = doc.get(CONFIG_ACCOUNTS) or []
    kept = [a for a in accounts if not (isinstance(a, dict) and str(a.get(CONFIG_ACCESS_KEY)) == str(access_key))]
    if len(kept) == len(accounts):
        return False
    doc[CONFIG_ACCOUNTS] = kept
    _write_doc(path, doc)
    return True


def _read_doc(path: str) -> dict:
    if not os.path.exists(path):
        return {}
    doc = read_acl_file(path)
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise AclError(f"ACL file {path} is not a YAML mapping")
    return doc


def _write_doc(path: str, doc: dict) -> None:
    """``dataVersion`` counted up (``updateAclConfigFileVersion``), then the file replaced atomically."""
    import yaml
    old = doc.get(CONFIG_DATA_VERSION)
    counter = 0
    if isinstance(old, list) and old and isinstance(old[0], dict):
        try:
            counter = int(old[0].get("counter", 0))
        except (TypeError, ValueError):
            counter = 0
    doc[CONFIG_DATA_VERSION] = [{"counter": counter + 1, "timestamp": int(time.time() * 1000)}]
    text = yaml.safe_dump(doc, sort_keys=False, default_flow_style=False, allow_unicode=True)
    path = os.path.abspath(os.path.expanduser(path))
    directory = os.path.dirname(path)
    try:
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=directory)
        try:
            os.fchmod(fd, ACL_FILE_MODE)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
                f.flush()
                from rmq._core.mapped_file import fsync_dir, fsync_file   # the one sync wrapper (journals)
                fsync_file(f.fileno(), path)
            os.replace(tmp, path)
            fsync_dir(directory)                       # the rename survives a crash too
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
    except OSError as e:
        raise AclError(f"cannot write ACL file {path}: {e.strerror or e}") from None


__all__ = ["PlainAccessValidator", "AclError", "AclConfig", "Account", "AddressMatcher", "cal_signature",
           "combine_request_content", "sign_fields", "parse_perm", "check_permission", "parse_resource_perms",
           "check_resource_perms", "request_resources", "check_perm", "parse_acl_doc", "load_acl_file",
           "update_account", "delete_account", "ADMIN_CODES", "DENY", "ANY", "PUB", "SUB"]
