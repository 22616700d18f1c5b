"""SendAttempts (rmq.client.send_attempts): RocketMQ sendDefaultImpl's rules for one request,
driven by hand with a real RouteCache and MQFaultStrategy and a clock passed in - no I/O."""
import pytest

from rmq.client.message import MessageQueue
from rmq.client.producer import ProducerOptions
from rmq.client.route import MQFaultStrategy, RouteCache, TopicRouteData
from rmq.client.send_attempts import SendAttempts
from rmq.errors import MQBrokerError, MQClientError, RemotingError, RemotingTimeoutError
from rmq.protocol import ResponseCode

ROUTE = {"queueDatas": [{"brokerName": b, "readQueueNums": 2, "writeQueueNums": 2, "perm": 6}
                        for b in ("a", "b")],
         "brokerDatas": [{"brokerName": "a", "cluster": "c", "brokerAddrs": {"0": "127.0.0.1:1"}},
                         {"brokerName": "b", "cluster": "c", "brokerAddrs": {"0": "127.0.0.1:2"}}]}
OPTS = ProducerOptions()


def _world():
    cache = RouteCache()
    cache.update("T", TopicRouteData.from_wire(ROUTE, "T"))
    return cache, MQFaultStrategy()


def test_a_retry_goes_to_the_other_broker_and_the_send_ends_with_the_success():
    cache, fault = _world()
    att = SendAttempts("T", 1, None, 3, 100.0, 103.0)
    mq, addr = att.target(100.0, cache, fault)
    assert att.attempt == 1 and att.sent_at == 100.0 and addr == cache.find_broker_addr(mq.broker_name)
    first = mq.broker_name
    assert att.failed(RemotingTimeoutError("no answer"), 100.5, fault, OPTS) is None    # retried
    mq2, _ = att.target(100.5, cache, fault)
    assert mq2.broker_name != first and att.attempt == 2 and att.brokers_sent == [first, mq2.broker_name]
    att.answered(100.6, fault)


def _fail_twice(first: Exception, second: Exception, queues: int = 4) -> Exception:
    """Two attempts (timesTotal 2) that fail with ``first`` then ``second``: the final error."""
    cache, fault = _world()
    att = SendAttempts("T", queues, None, 2, 100.0, 103.0)
    att.target(100.0, cache, fault)
    assert att.failed(first, 100.1, fault, OPTS) is None
    att.target(100.1, cache, fault)
    return att.failed(second, 100.2, fault, OPTS)


def test_attempts_run_out_into_rocketmqs_final_error():
    final = _fail_twice(RemotingError("down"), RemotingError("down again"))
    assert isinstance(final, RemotingError) and "Send [2] times, still failed" in str(final)
    assert final.__cause__ is not None and "down again" in str(final.__cause__)


def test_a_code_that_is_not_retryable_ends_the_send_as_it_is():
    cache, fault = _world()
    att = SendAttempts("T", 1, None, 3, 100.0, 103.0)
    att.target(100.0, cache, fault)
    refused = MQBrokerError("message illegal", ResponseCode.MESSAGE_ILLEGAL, "127.0.0.1:1")
    assert ResponseCode.MESSAGE_ILLEGAL not in OPTS.retry_response_codes
    assert att.failed(refused, 100.1, fault, OPTS) is refused


def test_a_send_the_broker_shed_as_busy_is_retried_on_the_other_broker():
    """SYSTEM_BUSY ([TIMEOUT_CLEAN_QUEUE] / [REJECTREQUEST]: the send was not stored) is in
    RocketMQ 5's retryResponseCodes: the next attempt goes to the other broker."""
    from rmq.client.producer_request import RETRY_RESPONSE_CODES
    assert ResponseCode.SYSTEM_BUSY in RETRY_RESPONSE_CODES and ResponseCode.SYSTEM_BUSY in OPTS.retry_response_codes
    cache, fault = _world()
    att = SendAttempts("T", 1, None, 3, 100.0, 103.0)
    mq, _ = att.target(100.0, cache, fault)
    busy = MQBrokerError("[TIMEOUT_CLEAN_QUEUE]broker busy, start flow control for a while, period in queue: 232ms",
                         ResponseCode.SYSTEM_BUSY, "127.0.0.1:1")
    assert att.failed(busy, 100.3, fault, OPTS) is None
    assert att.target(100.3, cache, fault)[0].broker_name != mq.broker_name


def test_a_fixed_queue_gets_one_attempt_and_its_failure_as_it_is():
    cache, fault = _world()
    fixed = MessageQueue("T", "b", 1)
    att = SendAttempts("T", 1, fixed, 1, 100.0, 103.0)
    assert att.target(100.0, cache, fault) == (fixed, "127.0.0.1:2")
    err = RemotingTimeoutError("no answer")
    assert att.failed(err, 100.2, fault, OPTS) is err


def test_no_time_left_no_route_or_no_master_fail_before_sending():
    cache, fault = _world()
    late = SendAttempts("T", 3, None, 3, 100.0, 101.0)
    with pytest.raises(RemotingTimeoutError, match=r"send of 3 message\(s\) to topic T timed out after 1000 ms "
                                                   r"before it could be sent"):
        late.target(101.0, cache, fault)
    assert late.attempt == 0
    with pytest.raises(MQClientError, match="No route info of this topic: U"):
        SendAttempts("U", 1, None, 3, 100.0, 103.0).target(100.0, cache, fault)
    with pytest.raises(MQClientError, match=r"The broker\[c\] not exist"):
        SendAttempts("T", 1, MessageQueue("T", "c", 0), 1, 100.0, 103.0).target(100.0, cache, fault)


def test_the_deadline_passing_during_an_attempt_ends_the_send_after_it():
    cache, fault = _world()
    att = SendAttempts("T", 1, None, 3, 100.0, 101.0)
    att.target(100.0, cache, fault)
    final = att.failed(RemotingTimeoutError("slow"), 101.0, fault, OPTS)     # no time left to retry
    assert isinstance(final, RemotingTimeoutError) and "Send [1] times" in str(final)


def test_a_dropped_connection_keeps_its_type_in_the_final_error():
    from rmq.errors import RemotingConnectionClosedError
    final = _fail_twice(RemotingConnectionClosedError("closed"), RemotingConnectionClosedError("closed again"),
                        queues=1)
    assert type(final) is RemotingConnectionClosedError and "Send [2] times" in str(final)
