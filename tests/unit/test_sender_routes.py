"""The thread producer's I/O thread driving rmq.client.publish_routes' calls on its events, without
sockets: its NameServer send is replaced by a recorder, and the test answers (or fails) each
request the way the thread would when the answer arrives or the NameServer gives up."""
from concurrent.futures import Future

import pytest

from rmq import Message
from rmq.client.message_accumulator import SYNC, Pending
from rmq.client.producer_request import ProducerOptions, message_preparer
from rmq.client.route import parse_route_response
from rmq.client.sender import Sender
from rmq.errors import MQClientError, RemotingTimeoutError
from rmq.protocol import RequestCode
from tests.unit.test_publish_routes import MASTER_A, NOT_EXIST, _cluster, _route


class _Scripted(Sender):
    """A Sender whose NameServer requests are kept for the test to answer, and whose broker
    connections are only recorded."""

    def __init__(self):
        super().__init__(["127.0.0.1:9876"], "pg", "client", ProducerOptions())
        self.asked: list = []          # [(request code, step)]
        self.connected: list = []

    def _ns_send(self, frame, step, tries=0):
        self.stats["route_requests"] += 1
        self.asked.append((frame.code, step))

    def _conn(self, addr):
        self.connected.append(addr)

    def answer(self, code, resp, failed=False):
        got, step = self.asked.pop(0)
        assert got == code
        step(resp, failed)


def _waiter(topic="T"):
    prep = message_preparer(ProducerOptions()).prepare(Message(topic, b"x"))
    return Pending([prep], Future(), SYNC, 1e12, 3.0)


def _wait_for_route(s, topic="T"):
    p = _waiter(topic)
    s._route_waiters.setdefault(topic, []).append(p)
    s._resolve(topic)
    return p


def test_messages_waiting_for_a_route_are_placed_once_the_look_up_ends():
    s = _Scripted()
    a, b = _wait_for_route(s), _wait_for_route(s)
    assert [code for code, _ in s.asked] == [RequestCode.GET_ROUTEINFO_BY_TOPIC]   # one look-up for both
    s.answer(RequestCode.GET_ROUTEINFO_BY_TOPIC, _route())
    assert [it.preps for req in s._ready for it in req.items] == [a.preps, b.preps]
    assert not s._route_waiters and not s._resolving and not s._routes.fetching("T")
    assert s.connected == [MASTER_A]                      # the new master is connected (heartbeat)


def test_an_unknown_topic_goes_to_a_provisional_route_through_the_cluster_info():
    s = _Scripted()
    p = _wait_for_route(s)
    s.answer(RequestCode.GET_ROUTEINFO_BY_TOPIC, NOT_EXIST)
    s.answer(RequestCode.GET_BROKER_CLUSTER_INFO, _cluster(("broker-a", {"0": MASTER_A})))
    (req,) = s._ready
    assert req.items == [p] and s._routes.any_provisional


def test_a_failed_look_up_fails_the_waiting_messages_and_the_queries():
    s = _Scripted()
    p = _wait_for_route(s)
    query = Future()
    s.query_route("T", query)                             # joins the look-up out: no second request
    assert len(s.asked) == 1
    s.answer(RequestCode.GET_ROUTEINFO_BY_TOPIC, RemotingTimeoutError("no NameServer answered"), failed=True)
    with pytest.raises(MQClientError, match="No route info of this topic: T: no NameServer answered"):
        p.future.result(0)
    with pytest.raises(MQClientError, match="No route info"):
        query.result(0)
    assert not s._ready and not s._resolving and s.stats["failed_messages"] == 1


def test_a_failed_look_up_still_places_the_messages_when_another_one_found_the_route_meanwhile():
    s = _Scripted()
    p = _wait_for_route(s)
    s.route_cache.update("T", parse_route_response(_route(), "T"))   # e.g. the periodic refresh's answer
    s.answer(RequestCode.GET_ROUTEINFO_BY_TOPIC, RemotingTimeoutError("late"), failed=True)
    assert [req.items for req in s._ready] == [[p]] and not p.future.done()


def test_a_refresh_is_not_asked_twice_while_one_is_out():
    s = _Scripted()
    s._fetch_route("T")
    s._fetch_route("T")
    assert len(s.asked) == 1
    s.answer(RequestCode.GET_ROUTEINFO_BY_TOPIC, NOT_EXIST)
    s._fetch_route("T")
    assert len(s.asked) == 1 and s.stats["route_requests"] == 2
