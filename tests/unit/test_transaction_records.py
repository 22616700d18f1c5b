"""The sans-I/O pieces of transactions: transaction keys, half-message properties, op bodies,
END_TRANSACTION frames, check-back bodies, local-transaction states (SPEC.md §11)."""
import pytest

from rmq import LocalTransactionState, Message
from rmq.actors.transaction import (CHECK_MAX_TIME_TOPIC, HALF_TOPIC, OP_TOPIC, TRANS_GROUP, TRANSACTION_CHECK_INTERVAL_MS,
                                    TRANSACTION_CHECK_MAX, TRANSACTION_TIMEOUT_MS, _op_offsets, half_properties,
                                    is_half_request, transaction_key)
from rmq.client.transaction import (MAX_CHECK_REQUESTS, checked_message, end_transaction_frame, half_message,
                                    to_state)
from rmq.errors import MQClientError
from rmq.protocol import FLAG_ONEWAY, Frame, RequestCode


def test_rocketmq_names_and_defaults():
    assert (HALF_TOPIC, OP_TOPIC, TRANS_GROUP, CHECK_MAX_TIME_TOPIC) == (
        "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC", "CID_RMQ_SYS_TRANS", "TRANS_CHECK_MAX_TIME_TOPIC")
    assert (TRANSACTION_CHECK_INTERVAL_MS, TRANSACTION_TIMEOUT_MS, TRANSACTION_CHECK_MAX) == (30_000, 6_000, 15)
    assert (RequestCode.END_TRANSACTION, RequestCode.CHECK_TRANSACTION_STATE) == (37, 39)
    assert [s.value for s in LocalTransactionState] == ["COMMIT_MESSAGE", "ROLLBACK_MESSAGE", "UNKNOW"]
    assert MAX_CHECK_REQUESTS == 2_000


def test_transaction_key_is_uniq_key_else_first_queue_offset():
    assert transaction_key({"UNIQ_KEY": "AB"}, 7) == "AB"
    assert transaction_key({}, 7) == "@7"
    assert transaction_key({"TRAN_PREPARED_QUEUE_OFFSET": "3"}, 9) == "@3"     # a renewed copy: the first one


def test_half_properties_record_real_topic_and_drop_delay():
    p = half_properties("T", 5, {"DELAY": "3", "TRAN_MSG": "true", "KEYS": "k"})
    assert p == {"TRAN_MSG": "true", "KEYS": "k", "REAL_TOPIC": "T", "REAL_QID": "5"}


def test_is_half_request_by_sysflag_or_property():
    assert is_half_request(0x4, {}) and is_half_request(0, {"TRAN_MSG": "true"})
    assert not is_half_request(0, {}) and not is_half_request(0x8, {}) and not is_half_request(0x1, {"TRAN_MSG": "no"})


def test_op_bodies_single_and_comma_separated():
    assert _op_offsets(b"12") == [12]
    assert _op_offsets(b"1,2,,3,x") == [1, 2, 3]
    assert _op_offsets(b"") == []


def test_half_message_marks_and_refuses():
    m = half_message(Message("T", b"x"), "pg")
    assert m.properties["TRAN_MSG"] == "true" and m.properties["PGROUP"] == "pg"
    with pytest.raises(MQClientError):
        half_message(Message("T", b"x", delay_time_level=2), "pg")
    with pytest.raises(MQClientError):
        half_message("not a message", "pg")


def test_end_transaction_frame_fields():
    f = end_transaction_frame("pg", LocalTransactionState.ROLLBACK_MESSAGE, 4, 1234, "OFF", "TX", True)
    assert f.code == RequestCode.END_TRANSACTION and f.flag & FLAG_ONEWAY
    assert f.fields == {"producerGroup": "pg", "tranStateTableOffset": 4, "commitLogOffset": 1234,
                        "commitOrRollback": 12, "fromTransactionCheck": True, "msgId": "OFF", "transactionId": "TX"}
    assert end_transaction_frame("pg", LocalTransactionState.COMMIT_MESSAGE, 0, 0, "", "", False) \
        .fields["commitOrRollback"] == 8


def test_to_state_accepts_states_and_names_else_unknow():
    assert to_state(LocalTransactionState.COMMIT_MESSAGE) is LocalTransactionState.COMMIT_MESSAGE
    assert to_state("ROLLBACK_MESSAGE") is LocalTransactionState.ROLLBACK_MESSAGE
    assert to_state(None) is LocalTransactionState.UNKNOW and to_state(True) is LocalTransactionState.UNKNOW


def test_checked_message_restores_the_real_topic_and_queue():
    assert checked_message(Frame(RequestCode.CHECK_TRANSACTION_STATE)) is None
    assert checked_message(Frame(RequestCode.CHECK_TRANSACTION_STATE, bodies=[b"\x00" * 10])) is None
