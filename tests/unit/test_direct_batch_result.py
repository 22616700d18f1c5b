"""rmq.client.direct.batch_result (batch_send_result, which the I/O thread's path uses too): a
user batch's one SendResult built straight from the broker's answer, the same as merging
per-message results gives it (rmq.aio's send_batch: ids comma-joined in the batch's order, the
first queue offset)."""
import pytest

from rmq import Message
from rmq.client.direct import batch_result
from rmq.client.message import SendStatus
from rmq.client.producer_request import ProducerOptions, merge_results, message_preparer, parse_send_response
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
    got = batch_result(resp, "T", "broker-a", "127.0.0.1:1", preps)
    want = merge_results(parse_send_response(resp, "T", "broker-a", "127.0.0.1:1", preps))
    assert got == want
    assert got.status is SendStatus.SEND_OK and got.queue_offset == 70 and got.queue_id == 2
    assert got.msg_id.split(",") == [p.uniq_id for p in preps] and got.offset_msg_id.split(",") == offset_ids


def test_a_refusal_raises_with_the_brokers_code_and_address():
    preps = message_preparer(ProducerOptions()).prepare_batch([Message("T", b"x"), Message("T", b"y")])
    resp = Frame(ResponseCode.MESSAGE_ILLEGAL, remark="the batch is over maxMessageSize")
    with pytest.raises(MQBrokerError, match="maxMessageSize") as ei:
        batch_result(resp, "T", "broker-a", "127.0.0.1:1", preps)
    assert ei.value.response_code == ResponseCode.MESSAGE_ILLEGAL and ei.value.broker_addr == "127.0.0.1:1"
