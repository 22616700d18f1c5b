"""Both push consumers (thread and asyncio) check and keep their options the same way
(PushConsumerCalls._configure): no socket is opened by a constructor."""
import pytest

from rmq import PushConsumer
from rmq.aio.consumer import AsyncPushConsumer
from rmq.client.consume_pool import CONSUME_THREAD_LIMIT
from rmq.client.consumer import ConsumeFromWhere, MessageModel
from rmq.errors import MQClientError

KINDS = pytest.mark.parametrize("kind", [PushConsumer, AsyncPushConsumer], ids=["thread", "aio"])


@KINDS
@pytest.mark.parametrize("bad, match", [
    ({"pull_batch_size": 0}, r"pull_batch_size must be in \[1, 1024\], got 0"),
    ({"pull_batch_size": 1025}, r"pull_batch_size must be in \[1, 1024\], got 1025"),
    ({"consume_message_batch_max_size": 0}, r"consume_message_batch_max_size must be in \[1, 1024\]"),
    ({"consume_thread_max": 0}, r"consume_thread_max must be in \[1, 1000\], got 0"),
    ({"consume_thread_max": CONSUME_THREAD_LIMIT + 1}, r"consume_thread_max must be in \[1, 1000\]"),
    ({"group": ""}, "consumer group must be set"),
    ({"group": "DEFAULT_CONSUMER"}, "consumer group must be set"),
    ({"message_model": "NOPE"}, "message_model"),
    ({"consume_from_where": "NOPE"}, "consume_from_where"),
])
def test_a_bad_option_is_refused_by_both(kind, bad, match):
    args = {"namesrv_addr": "127.0.0.1:1", "group": "g", **bad}
    with pytest.raises(MQClientError, match=match):
        kind(**args)


@KINDS
def test_options_are_kept_as_given_by_both(kind):
    c = kind("127.0.0.1:1", "g", "BROADCASTING", "CONSUME_FROM_FIRST_OFFSET", consume_thread_max=7,
             pull_batch_size=64, consume_message_batch_max_size=8, max_reconsume_times=3,
             consume_timestamp_ms=123, timeout_ms=4321, instance_name="inst", enable_msg_trace=True,
             custom_trace_topic="TT")
    assert c.message_model is MessageModel.BROADCASTING and not c.clustering
    assert c.consume_from_where is ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET
    assert (c.consume_thread_max, c.pull_batch_size, c.consume_message_batch_max_size) == (7, 64, 8)
    assert (c.max_reconsume_times, c.consume_timestamp_ms, c.timeout_ms) == (3, 123, 4321)
    assert c.enable_msg_trace and c.custom_trace_topic == "TT" and c._trace is None   # made at start()
    assert "inst" in c.client_id and c.group == "g" and c.namesrv_addr == "127.0.0.1:1"
