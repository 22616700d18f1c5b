"""RocketMQ ACL 1.0 for the remoting proxy (rmq.proxy.acl): signatures as RocketMQ's clients make
them, permission parsing and checks (RocketMQ's messages), white address patterns, the file
re-read on change with the last good one kept, the admin's atomic edits, and every limit."""
import base64
import hashlib
import hmac
import json
import os
import stat
import time

import pytest
import yaml

from rmq.broker_conf import proxy_settings
from rmq.protocol import RequestCode, ResponseCode
from rmq.proxy import acl as A
from rmq.proxy.remoting import RemotingCommand

AK, SK = "RocketMQ", "12345678"
PEER = "127.0.0.1:50000"


def by_hand(fields: dict, body: bytes, secret: str) -> str:
    """RocketMQ's algorithm written out: TreeMap of the ext fields but Signature, values joined,
    body appended, HmacSHA1 with the secret key, Base64."""
    content = "".join(fields[k] for k in sorted(fields) if k != "Signature").encode() + body
    return base64.b64encode(hmac.new(secret.encode(), content, hashlib.sha1).digest()).decode()


# -- signatures ----------------------------------------------------------------------------------------
def test_hmac_sha1_primitive_matches_rfc2202():
    # RFC 2202 test case 2 (HMAC-SHA1): key "Jefe" -> effcdf6ae5eb2fa2d27416d5f184df9c259a7c79
    assert base64.b64decode(A.cal_signature(b"what do ya want for nothing?", "Jefe")).hex() == \
        "effcdf6ae5eb2fa2d27416d5f184df9c259a7c79"


def test_signature_vector_by_hand():
    fields = {"topic": "topicB", "queueId": "1", "AccessKey": AK}
    # TreeMap order: AccessKey < queueId < topic -> "RocketMQ" + "1" + "topicB", then the body
    assert A.combine_request_content(fields, b"hello") == b"RocketMQ1topicBhello"
    assert A.cal_signature(b"RocketMQ1topicBhello", SK) == "IKmFitYyabRdqp5zF3sL9MkVQy4="
    assert by_hand(fields, b"hello", SK) == "IKmFitYyabRdqp5zF3sL9MkVQy4="
    # AclSignerTest.calSignatureTest's input
    assert A.cal_signature(b"RocketMQ", SK) == "IUc8rrO/0gDch8CjObLQsW2rsiA="


def test_signature_excludes_itself_and_covers_every_other_field():
    f = A.sign_fields({"topic": "T", "queueId": "3", "OnsChannel": ""}, b"\x00body", AK, SK)
    assert f["AccessKey"] == AK and f["Signature"] == by_hand(f, b"\x00body", SK)
    assert A.combine_request_content(f, b"") == A.combine_request_content({**f, "Signature": "other"}, b"")
    g = A.sign_fields({}, b"", AK, SK, security_token="tok")
    assert A.combine_request_content(g, b"") == (AK + "tok").encode()


def test_java_treemap_order_is_utf16_code_units():
    # Java orders by UTF-16 code unit: U+FF5E (one unit) sorts after U+1F600 (surrogates D83D...)
    fields = {"\uff5e": "a", "\U0001f600": "b"}
    assert A.combine_request_content(fields, b"") == b"ba"


def test_unique_key_query_flag_is_not_signed_by_old_clients():
    f = {"AccessKey": AK, A.UNIQUE_MSG_QUERY_FLAG: "true"}
    assert A.combine_request_content(f, b"", version=A.V4_9_3_ORDINAL) == AK.encode()
    assert A.combine_request_content(f, b"", version=A.V4_9_3_ORDINAL + 1) == (AK + "true").encode()


def test_empty_secret_cannot_sign():
    with pytest.raises(A.AclError):
        A.cal_signature(b"x", "")


# -- permissions ---------------------------------------------------------------------------------------
def test_perm_parsing():
    assert [A.parse_perm(x) for x in ("PUB", "SUB", "PUB|SUB", "SUB|PUB", "DENY", " PUB ", "pub", "ANY", None)] == \
        [A.PUB, A.SUB, A.PUB | A.SUB, A.PUB | A.SUB, A.DENY, A.PUB, A.DENY, A.DENY, A.DENY]
    assert A.parse_resource_perms(["topicA=DENY", "topicB=PUB|SUB", "topicC=SUB"], True) == \
        {"topicA": A.DENY, "topicB": A.PUB | A.SUB, "topicC": A.SUB}
    assert A.parse_resource_perms(["groupA=SUB"], False) == {"%RETRY%groupA": A.SUB}
    with pytest.raises(A.AclError, match="Parse resource permission failed for topic:topicA"):
        A.parse_resource_perms(["topicA"], True)
    A.check_resource_perms(["a=DENY", "b=PUB|SUB"])
    with pytest.raises(A.AclError, match="The expected permissions are"):
        A.check_resource_perms(["a=ALL"])
    with pytest.raises(A.AclError, match="The expected resource format is 'Res=Perm'"):
        A.check_resource_perms(["a=PUB=SUB"])


def test_check_permission_rules():
    assert A.check_permission(A.PUB, A.PUB | A.SUB) and not A.check_permission(A.PUB, A.SUB)
    assert not A.check_permission(A.SUB, A.DENY | A.SUB)                 # DENY wins
    assert A.check_permission(A.ANY, A.SUB) and not A.check_permission(A.ANY, A.DENY)


def cmd(code, fields=None, body=b"", ak=AK, sk=SK):
    f = dict(fields or {})
    if ak is not None:
        f = A.sign_fields(f, body, ak, sk)
    return RemotingCommand(int(code), ext_fields=f, body=body)


def test_request_resources():
    assert A.request_resources(cmd(RequestCode.SEND_MESSAGE, {"topic": "T"})) == {"T": A.PUB}
    assert A.request_resources(cmd(RequestCode.SEND_MESSAGE_V2, {"b": "T", "a": "P"})) == {"T": A.PUB}
    assert A.request_resources(cmd(RequestCode.SEND_BATCH_MESSAGE, {"b": "T"})) == {"T": A.PUB}
    # a retry topic is its group's: SUB on the group
    assert A.request_resources(cmd(RequestCode.SEND_MESSAGE, {"topic": "%RETRY%G"})) == {"%RETRY%G": A.SUB}
    assert A.request_resources(cmd(RequestCode.PULL_MESSAGE, {"topic": "T", "consumerGroup": "G"})) == \
        {"T": A.SUB, "%RETRY%G": A.SUB}
    assert A.request_resources(cmd(RequestCode.CONSUMER_SEND_MSG_BACK, {"group": "G"})) == {"%RETRY%G": A.SUB}
    assert A.request_resources(cmd(RequestCode.UPDATE_CONSUMER_OFFSET, {"topic": "T", "consumerGroup": "G"})) == \
        {"T": A.SUB, "%RETRY%G": A.SUB}
    for code in (RequestCode.UNREGISTER_CLIENT, RequestCode.GET_CONSUMER_LIST_BY_GROUP):
        assert A.request_resources(cmd(code, {"consumerGroup": "G"})) == {"%RETRY%G": A.SUB}
    hb = json.dumps({"clientID": "c", "consumerDataSet": [
        {"groupName": "G", "subscriptionDataSet": [{"topic": "T"}, {"topic": "%RETRY%G"}]}]}).encode()
    assert A.request_resources(cmd(RequestCode.HEART_BEAT, body=hb)) == {"%RETRY%G": A.SUB, "T": A.SUB}
    assert A.request_resources(cmd(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"})) == {}
    with pytest.raises(A.AclError, match="heartbeat body"):
        A.request_resources(cmd(RequestCode.HEART_BEAT, body=b"[1]"))


# -- white addresses -------------------------------------------------------------------------------------
@pytest.mark.parametrize("pattern,yes,no", [
    ("", [], ["127.0.0.1"]),
    ("*", ["1.2.3.4", "::1"], []),
    ("*.*.*.*", ["10.0.0.1"], []),
    ("192.168.0.*", ["192.168.0.1", "192.168.0.255"], ["192.168.1.1"]),
    ("192.168.1.10-20", ["192.168.1.10", "192.168.1.20"], ["192.168.1.9", "192.168.1.21"]),
    ("10.10.*.*", ["10.10.3.4"], ["10.11.3.4"]),
    ("10.1-2.*.*", ["10.2.9.9"], ["10.3.0.0"]),
    ("1.1.1.{1,2,3}", ["1.1.1.2"], ["1.1.1.4"]),
    ("127.0.0.1,127.0.0.2", ["127.0.0.2"], ["127.0.0.3"]),
    ("127.0.0.1", ["127.0.0.1"], ["127.0.0.2", "not-an-ip"]),
    ("::1", ["::1", "0:0:0:0:0:0:0:1"], ["::2", "127.0.0.1"]),
    ("1:ac41:9987::bb22:666:{1,2}", ["1:ac41:9987:0:0:bb22:666:2"], ["1:ac41:9987::bb22:666:3"]),
    ("1:2:3:*", ["1:2:3:4::"], ["1:2:4::"]),
    ("fe80::1-ff", ["fe80::a"], ["fe80::100"]),
])
def test_white_address_patterns(pattern, yes, no):
    m = A.AddressMatcher(pattern)
    assert all(m.match(a) for a in yes), pattern
    assert not any(m.match(a) for a in no), pattern


@pytest.mark.parametrize("bad", ["1.2.3", "300.1.1.1", "*.1.1.1", "1.1.1.5-3", "1.1.1.1-300", "1.1.{1,2}",
                                 "nonsense", "1.1.1.{1,x}", "1:*:3"])
def test_bad_white_addresses_are_refused(bad):
    with pytest.raises(A.AclError):
        A.AddressMatcher(bad)


# -- the validator ---------------------------------------------------------------------------------------
DOC = {
    "globalWhiteRemoteAddresses": ["10.10.103.*"],
    "accounts": [
        {"accessKey": AK, "secretKey": 12345678, "whiteRemoteAddress": None, "admin": False,
         "defaultTopicPerm": "DENY", "defaultGroupPerm": "SUB",
         "topicPerms": ["topicA=DENY", "topicB=PUB|SUB", "topicC=SUB"],
         "groupPerms": ["groupA=DENY", "groupB=PUB|SUB", "groupC=SUB"]},
        {"accessKey": "rocketmq2", "secretKey": "12345678", "whiteRemoteAddress": "192.168.1.*", "admin": True},
    ]}


def load(path):
    with open(path) as f:
        return yaml.safe_load(f)


def write(path, doc):
    tmp = str(path) + ".tmp"
    with open(tmp, "w") as f:
        f.write(doc if isinstance(doc, str) else yaml.safe_dump(doc))
    os.replace(tmp, path)          # a new inode: the stamp changes whatever the clock's granularity


@pytest.fixture
def validator(tmp_path):
    p = tmp_path / "plain_acl.yml"
    write(p, DOC)
    return A.PlainAccessValidator(str(p))


def refused(v, c, peer=PEER) -> str:
    with pytest.raises(A.AclError) as e:
        v.check(c, peer)
    assert e.value.response_code == ResponseCode.NO_PERMISSION == 16
    return str(e.value)


def test_validate_flow_and_messages(validator):
    v = validator
    v.check(cmd(RequestCode.SEND_MESSAGE, {"topic": "topicB"}), PEER)
    v.check(cmd(RequestCode.PULL_MESSAGE, {"topic": "topicC", "consumerGroup": "groupC"}), PEER)
    v.check(cmd(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "anything"}), PEER)
    assert refused(v, cmd(RequestCode.SEND_MESSAGE, {"topic": "topicB"}, ak=None)) == "No accessKey is configured"
    assert refused(v, cmd(RequestCode.SEND_MESSAGE, {"topic": "topicB"}, ak="nobody00")) == "No acl config for nobody00"
    assert refused(v, cmd(RequestCode.SEND_MESSAGE, {"topic": "topicB"}, sk="wrong-secret")) == \
        f"Check signature failed for accessKey={AK}"
    tampered = cmd(RequestCode.SEND_MESSAGE, {"topic": "topicB"}, body=b"one")
    tampered.body = b"two"
    assert refused(v, tampered) == f"Check signature failed for accessKey={AK}"
    assert refused(v, cmd(RequestCode.SEND_MESSAGE, {"topic": "topicC"})) == "No default permission for topic:topicC"
    assert refused(v, cmd(RequestCode.SEND_MESSAGE, {"topic": "topicA"})) == "No default permission for topic:topicA"
    assert refused(v, cmd(RequestCode.SEND_MESSAGE, {"topic": "other"})) == "No default permission for topic:other"
    assert refused(v, cmd(RequestCode.PULL_MESSAGE, {"topic": "topicC", "consumerGroup": "groupA"})) == \
        "No default permission for group:groupA"
    v.check(cmd(RequestCode.PULL_MESSAGE, {"topic": "topicC", "consumerGroup": "unlisted"}), PEER)  # default SUB
    assert refused(v, cmd(RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": "x"})) == \
        f"Need admin permission for request code=17, but accessKey={AK} is not"
    # message trace: PUB on RMQ_SYS_TRACE_TOPIC passes
    v.check(cmd(RequestCode.SEND_MESSAGE, {"topic": A.RMQ_SYS_TRACE_TOPIC}), PEER)


def test_white_addresses_skip_the_checks(validator):
    unsigned = RemotingCommand(int(RequestCode.UPDATE_AND_CREATE_TOPIC), ext_fields={"topic": "x"})
    validator.check(unsigned, "10.10.103.7:1234")                      # global white list: nothing checked
    refused(validator, unsigned, "10.10.104.7:1234")
    # the account's whiteRemoteAddress: no signature needed (it still names its access key)
    validator.check(RemotingCommand(17, ext_fields={"AccessKey": "rocketmq2", "Signature": "junk"}), "192.168.1.9:1")
    assert refused(validator, RemotingCommand(17, ext_fields={"AccessKey": "rocketmq2", "Signature": "junk"}),
                   "192.168.2.9:1") == "Check signature failed for accessKey=rocketmq2"
    # an admin without resource permissions may do anything
    validator.check(cmd(17, {"topic": "x"}, ak="rocketmq2"), PEER)
    validator.check(cmd(RequestCode.SEND_MESSAGE, {"topic": "x"}, ak="rocketmq2"), PEER)


def test_bad_file_keeps_the_last_good_one(validator, caplog):
    path = validator.path
    write(path, "accounts: [ {accessKey: RocketMQ, secretKey: 1234")   # not YAML
    assert validator.maybe_reload(force=True) is False
    assert validator.reload_errors == 1 and "not YAML" in validator.last_error
    validator.check(cmd(RequestCode.SEND_MESSAGE, {"topic": "topicB"}), PEER)   # the old accounts serve
    write(path, {"accounts": [{"accessKey": AK, "secretKey": "short"}]})        # YAML, but a bad account
    assert validator.maybe_reload(force=True) is False and validator.reload_errors == 2
    assert "length should longer than 6" in validator.last_error
    assert any("last good one stays" in r.message for r in caplog.records)
    validator.check(cmd(RequestCode.SEND_MESSAGE, {"topic": "topicB"}), PEER)
    write(path, {"accounts": [{"accessKey": "another1", "secretKey": "secret12", "defaultTopicPerm": "PUB"}]})
    assert validator.maybe_reload(force=True) is True and validator.last_error is None
    assert refused(validator, cmd(RequestCode.SEND_MESSAGE, {"topic": "topicB"})) == f"No acl config for {AK}"
    validator.check(cmd(RequestCode.SEND_MESSAGE, {"topic": "topicB"}, ak="another1", sk="secret12"), PEER)


def test_reload_is_looked_at_most_every_interval(validator, monkeypatch):
    write(validator.path, {"accounts": []})
    now = time.monotonic()
    monkeypatch.setattr(A.time, "monotonic", lambda: now)
    validator._checked_at = now
    validator.check(cmd(RequestCode.SEND_MESSAGE, {"topic": "topicB"}), PEER)      # not looked at yet
    monkeypatch.setattr(A.time, "monotonic", lambda: now + A.RELOAD_CHECK_INTERVAL_S)
    assert refused(validator, cmd(RequestCode.SEND_MESSAGE, {"topic": "topicB"})) == f"No acl config for {AK}"
    assert A.RELOAD_CHECK_INTERVAL_S <= 5.0          # never slower than RocketMQ's AclFileWatchService


def test_missing_file_is_created_empty_and_refuses_everyone(tmp_path):
    p = tmp_path / "conf" / "plain_acl.yml"
    v = A.PlainAccessValidator(str(p))
    assert p.exists() and stat.S_IMODE(os.stat(p).st_mode) == A.ACL_FILE_MODE
    assert refused(v, cmd(RequestCode.SEND_MESSAGE, {"topic": "T"})) == f"No acl config for {AK}"


def test_a_bad_file_at_start_is_an_error(tmp_path):
    p = tmp_path / "plain_acl.yml"
    write(p, "- just a list")
    with pytest.raises(A.AclError, match="YAML mapping"):
        A.PlainAccessValidator(str(p))


# -- limits ----------------------------------------------------------------------------------------------
def test_key_length_limits():
    A.check_keys("x" * (A.ACCESS_KEY_MIN_LENGTH + 1), "y" * (A.SECRET_KEY_MIN_LENGTH + 1))
    for ak, sk in (("x" * A.ACCESS_KEY_MIN_LENGTH, "y" * 7), ("x" * 7, "y" * A.SECRET_KEY_MIN_LENGTH), (None, "y" * 7)):
        with pytest.raises(A.AclError, match="length should longer than 6"):
            A.check_keys(ak, sk)
    A.check_keys("x" * A.MAX_KEY_LENGTH, "y" * A.MAX_KEY_LENGTH)
    with pytest.raises(A.AclError, match="at most"):
        A.check_keys("x" * (A.MAX_KEY_LENGTH + 1), "y" * 7)
    with pytest.raises(A.AclError) as e:
        A.check_keys("abcdefg", "short")
    assert "short" not in str(e.value)                       # the secret is not echoed


def test_file_size_limit(tmp_path):
    p = tmp_path / "big.yml"
    p.write_bytes(b"accounts: []\n" + b" " * (A.MAX_ACL_FILE_BYTES - 13))
    assert A.load_acl_file(str(p)).accounts == {}
    p.write_bytes(b"accounts: []\n" + b" " * (A.MAX_ACL_FILE_BYTES - 12))
    with pytest.raises(A.AclError, match="over"):
        A.load_acl_file(str(p))


def account(i):
    return {"accessKey": f"account{i:05d}", "secretKey": "secret-key"}


def test_count_limits():
    assert len(A.parse_acl_doc({"accounts": [account(i) for i in range(A.MAX_ACCOUNTS)]}).accounts) == A.MAX_ACCOUNTS
    with pytest.raises(A.AclError, match=f"more than {A.MAX_ACCOUNTS}"):
        A.parse_acl_doc({"accounts": [account(i) for i in range(A.MAX_ACCOUNTS + 1)]})
    A.parse_acl_doc({"globalWhiteRemoteAddresses": ["127.0.0.1"] * A.MAX_WHITE_ADDRESSES})
    with pytest.raises(A.AclError, match=f"more than {A.MAX_WHITE_ADDRESSES}"):
        A.parse_acl_doc({"globalWhiteRemoteAddresses": ["127.0.0.1"] * (A.MAX_WHITE_ADDRESSES + 1)})
    half = A.MAX_RESOURCE_PERMS // 2
    ok = dict(account(0), topicPerms=[f"t{i}=PUB" for i in range(half)],
              groupPerms=[f"g{i}=SUB" for i in range(A.MAX_RESOURCE_PERMS - half)])
    assert len(A.build_account(ok).perms) == A.MAX_RESOURCE_PERMS
    with pytest.raises(A.AclError, match=f"more than {A.MAX_RESOURCE_PERMS}"):
        A.build_account(dict(ok, groupPerms=ok["groupPerms"] + ["extra=SUB"]))
    with pytest.raises(A.AclError, match=f"more than {A.MAX_RESOURCE_PERMS}"):
        A.build_account(dict(account(0), topicPerms=[f"t{i}=PUB" for i in range(A.MAX_RESOURCE_PERMS + 1)]))


def test_admin_codes_are_rocketmqs():
    assert A.ADMIN_CODES == {17, 25, 215, 200, 207}


# -- the admin's edits -----------------------------------------------------------------------------------
def test_update_and_delete_accounts(tmp_path):
    p = str(tmp_path / "acl" / "plain_acl.yml")
    assert A.update_account(p, AK, SK, default_topic_perm="DENY", topic_perms=["topicB=PUB|SUB"]) == "created"
    assert stat.S_IMODE(os.stat(p).st_mode) == A.ACL_FILE_MODE
    v = A.PlainAccessValidator(p)
    v.check(cmd(RequestCode.SEND_MESSAGE, {"topic": "topicB"}), PEER)
    assert A.update_account(p, AK, topic_perms=["topicB=SUB"], admin=True) == "updated"   # secret kept
    doc = load(p)
    (entry,) = doc["accounts"]
    assert entry["secretKey"] == SK and entry["admin"] is True and entry["topicPerms"] == ["topicB=SUB"]
    assert doc["dataVersion"][0]["counter"] == 2
    assert v.maybe_reload(force=True)
    assert refused(v, cmd(RequestCode.SEND_MESSAGE, {"topic": "topicB"})) == "No default permission for topic:topicB"
    with pytest.raises(A.AclError):
        A.update_account(p, "newaccount")                             # a new account needs its secret
    with pytest.raises(A.AclError):
        A.update_account(p, AK, topic_perms=["topicB=ALL"])
    with pytest.raises(A.AclError):
        A.update_account(p, AK, white_remote_address="300.0.0.1")
    assert load(p)["dataVersion"][0]["counter"] == 2   # refused edits wrote nothing
    assert A.delete_account(p, AK) is True and A.delete_account(p, AK) is False
    assert load(p)["accounts"] == []
    assert [f for f in os.listdir(os.path.dirname(p)) if f.endswith(".tmp")] == []


def test_admin_cli(tmp_path):
    from click.testing import CliRunner

    from rmq.admin_cli import admin
    p = str(tmp_path / "plain_acl.yml")
    r = CliRunner().invoke(admin, ["updateAclConfig", "-a", AK, "-s", SK, "--admin", "-t", "a=PUB,b=PUB|SUB",
                                   "-g", "g=SUB", "-w", "127.0.0.*", "--acl-file", p, "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output) == {"acl_file": p, "access_key": AK, "action": "created"}
    (entry,) = load(p)["accounts"]
    assert entry["admin"] is True and entry["topicPerms"] == ["a=PUB", "b=PUB|SUB"] and \
        entry["groupPerms"] == ["g=SUB"] and entry["whiteRemoteAddress"] == "127.0.0.*"
    r = CliRunner().invoke(admin, ["update-acl-config", "-a", AK, "-m", "false", "--acl-file", p])
    assert r.exit_code == 0 and load(p)["accounts"][0]["admin"] is False
    r = CliRunner().invoke(admin, ["deleteAclConfig", "-a", AK, "--acl-file", p])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(admin, ["deleteAclConfig", "-a", AK, "--acl-file", p])
    assert r.exit_code == 1 and "no account" in r.output


# -- broker.conf -----------------------------------------------------------------------------------------
def test_proxy_settings_acl(tmp_path):
    store = str(tmp_path / "store")
    assert proxy_settings({"storePathRootDir": store})["acl_file"] == ""
    for key in ("authEnable", "aclEnable"):
        s = proxy_settings({"storePathRootDir": store, "enableProxy": "true", key: "true"})
        assert s["acl_file"] == os.path.join(store, "config", "plain_acl.yml")
    s = proxy_settings({"storePathRootDir": store, "aclEnable": "true", "aclPlainFile": str(tmp_path / "x.yml")})
    assert s["acl_file"] == str(tmp_path / "x.yml")
    from rmq.broker_conf import BrokerConfError
    with pytest.raises(BrokerConfError, match="aclEnable must be true or false"):
        proxy_settings({"aclEnable": "yes"})


# -- RocketMQ 5 gRPC clients ------------------------------------------------------------------------------
def test_grpc_authorization_header_parses_and_signs_as_the_5x_client(tmp_path):
    import hashlib as _hashlib
    import hmac as _hmac

    from rmq.proxy.acl import GRPC_AUTHORIZATION, GRPC_DATE_TIME, PUB, SUB, AclError, PlainAccessValidator
    from rmq.proxy.acl import parse_grpc_authorization as parse
    assert parse("MQv2-HMAC-SHA1 Credential=AK123456, SignedHeaders=x-mq-date-time, Signature=ab12") == \
        ("AK123456", "ab12")
    assert parse("MQv2-HMAC-SHA1 Credential=AK123456/2026/x, SignedHeaders=x-mq-date-time, Signature=ab") == \
        ("AK123456", "ab")
    for bad in ("", "Basic abc", "MQv2-HMAC-SHA1 Signature=ab", "MQv2-HMAC-SHA1 Credential=AK"):
        assert parse(bad) is None
    path = tmp_path / "acl.yml"
    path.write_text("accounts:\n- accessKey: grpcUser1\n  secretKey: grpc-secret-1\n  defaultTopicPerm: DENY\n"
                    "  defaultGroupPerm: SUB\n  topicPerms:\n  - Orders=PUB\n")
    v = PlainAccessValidator(str(path))
    when = "20261125T120000Z"
    sig = _hmac.new(b"grpc-secret-1", when.encode(), _hashlib.sha1).hexdigest()     # the client's Signature.sign
    md = {GRPC_DATE_TIME: when,
          GRPC_AUTHORIZATION: f"MQv2-HMAC-SHA1 Credential=grpcUser1, SignedHeaders=x-mq-date-time, Signature={sig}"}
    v.validate_grpc(md, "ipv4:127.0.0.1:5000", {"Orders": PUB})
    upper = dict(md, **{GRPC_AUTHORIZATION: md[GRPC_AUTHORIZATION].replace(sig, sig.upper())})
    v.validate_grpc(upper, "ipv4:127.0.0.1:5000", {"Orders": PUB})                  # hex case does not matter
    with pytest.raises(AclError, match="Check signature failed for accessKey=grpcUser1"):
        v.validate_grpc(dict(md, **{GRPC_DATE_TIME: "20261125T120001Z"}), "ipv4:127.0.0.1:5000", {})
    with pytest.raises(AclError, match="No default permission for topic:Orders"):
        v.validate_grpc(md, "ipv4:127.0.0.1:5000", {"Orders": SUB})
    with pytest.raises(AclError, match="No acl config for nobody"):
        v.validate_grpc({GRPC_AUTHORIZATION: "MQv2-HMAC-SHA1 Credential=nobody, SignedHeaders=x, Signature=0"},
                        "ipv4:127.0.0.1:5000", {})
    with pytest.raises(AclError, match="No accessKey is configured"):
        v.validate_grpc({}, "ipv4:127.0.0.1:5000", {})
