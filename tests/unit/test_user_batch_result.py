"""rmq.client.producer_request.user_batch_result (``Producer.send_batch``'s direct path): a user
batch's one SendResult built straight from the broker's answer, the same as merging per-message
results gives it (rmq.aio's send_batch: ids comma-joined in the batch's order, the first queue
offset), and the same as batch_send_result (the I/O thread's path); join_uniq_ids, its C join."""
import pytest

from rmq import Message
from rmq._core.client_msg import PreparedMessage, join_uniq_ids
from rmq.client.message import SendStatus
from rmq.client.producer_request import (ProducerOptions, batch_send_result, merge_results, message_preparer,
                                         parse_send_response, send_response_fields, user_batch_result)
from rmq.common.request_header import send_response_msg_id_parts
from rmq.errors import MQBrokerError
from rmq.protocol import Frame, ResponseCode


def answer(code: int, queue_id: int, offset: int, offset_ids: list) -> Frame:
    fields, bodies = send_response_msg_id_parts(",".join(offset_ids))
    return Frame(code, fields=dict(fields, queueId=queue_id, queueOffset=offset), bodies=bodies)


@pytest.mark.parametrize("n", [1, 3, 3000])        # 3000: the offset ids ride in the body
def test_the_same_result_as_the_io_threads_merge(n):
    preps = message_preparer(ProducerOptions()).prepare_batch([Message("T", b"m%d" % i) for i in range(n)])
    offset_ids = ["%032X" % (1000 + i) for i in range(n)]
    resp = answer(ResponseCode.SUCCESS, 2, 70, offset_ids)
    got = user_batch_result(resp, "T", "broker-a", "127.0.0.1:1", preps)
    want = merge_results(parse_send_response(resp, "T", "broker-a", "127.0.0.1:1", preps))
    assert got == want
    assert got.status is SendStatus.SEND_OK and got.queue_offset == 70 and got.queue_id == 2
    assert got.msg_id.split(",") == [p.uniq_id for p in preps] and got.offset_msg_id.split(",") == offset_ids
    assert got == batch_send_result(*send_response_fields(resp, "T", "broker-a", "127.0.0.1:1", n)[:3], preps,
                                    offset_ids)


@pytest.mark.parametrize("n,ids", [(1, ["A", "B"]), (3, ["A", "B"]), (3, ["A", "B", "C", "D"]), (3, [""])])
def test_an_answer_without_one_offset_id_per_message_reads_as_the_io_threads_path_reads_it(n, ids):
    # a broker that answers fewer or more ids than messages: padded as send_response_fields pads them
    preps = message_preparer(ProducerOptions()).prepare_batch([Message("T", b"m%d" % i) for i in range(n)])
    resp = answer(ResponseCode.SUCCESS, 0, 5, ids)
    got = user_batch_result(resp, "T", "broker-a", "127.0.0.1:1", preps)
    want = merge_results(parse_send_response(resp, "T", "broker-a", "127.0.0.1:1", preps))
    assert got == want
    assert got.offset_msg_id == ("A" if n == 1 else "," * (n - 1))


def test_join_uniq_ids_matches_str_join():
    preps = message_preparer(ProducerOptions()).prepare_batch([Message("T", b"m%d" % i) for i in range(5)])
    assert join_uniq_ids(preps) == ",".join(p.uniq_id for p in preps)
    assert join_uniq_ids(preps[:1]) == preps[0].uniq_id and join_uniq_ids([]) == ""
    m = Message("T", b"x")
    odd = [PreparedMessage(m, b"x", 0, uid, False, True) for uid in ("short", "\u00e9t\u00e9-\u4e2d", "")]
    assert join_uniq_ids(odd) == "short,\u00e9t\u00e9-\u4e2d,"         # not ASCII: Python's join
    with pytest.raises(TypeError):
        join_uniq_ids([PreparedMessage(m, b"x", 0, None, False, True)])   # as ",".join raises


def test_a_refusal_raises_with_the_brokers_code_and_address():
    preps = message_preparer(ProducerOptions()).prepare_batch([Message("T", b"x"), Message("T", b"y")])
    resp = Frame(ResponseCode.MESSAGE_ILLEGAL, remark="the batch is over maxMessageSize")
    with pytest.raises(MQBrokerError, match="maxMessageSize") as ei:
        user_batch_result(resp, "T", "broker-a", "127.0.0.1:1", preps)
    assert ei.value.response_code == ResponseCode.MESSAGE_ILLEGAL and ei.value.broker_addr == "127.0.0.1:1"
