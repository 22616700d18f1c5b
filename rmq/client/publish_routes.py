"""The producers' route state and NameServer look-ups, sans I/O: one table and two calls that
:class:`rmq.Producer` (its I/O thread steps the calls as answers arrive) and
:class:`rmq.aio.Producer` (awaits them) both drive (issue 17: one place for each rule).

State, per topic (:class:`PublishRoutes`; h11's ``_state.py`` rule: what moves it lives here):

- the route and publish info, in the :class:`rmq.client.route.RouteCache`;
- when its route was last asked for (``last_fetch``, in the driver's clock: monotonic or
  event-loop seconds) and how many look-ups of it are out;
- whether its publish info is *provisional*: made up from the cluster's brokers for a topic the
  NameServer does not know yet (the broker creates it on the first send), polled every
  PROVISIONAL_POLL_MS until the NameServer knows it.

When a route is asked for again:

- a send failed with TOPIC_NOT_EXIST or NO_PERMISSION (the route is wrong for sure): at once, but
  at most every ROUTE_WRONG_REFRESH_MS (the other requests of a burst that failed alike ask no more);
- a send failed in a way that puts the route in doubt (:func:`rmq.client.route.route_suspect`):
  at most every ROUTE_REFRESH_ON_FAILURE_MS;
- a send was answered on a provisional route: at most every PROVISIONAL_REFRESH_MS;
- a provisional route: every PROVISIONAL_POLL_MS (:meth:`PublishRoutes.provisional_due`);
- every known topic every ``poll_name_server_interval_ms`` (the drivers' timers, as RocketMQ's
  ``updateTopicRouteInfoFromNameServer``).

The calls (:mod:`rmq.client.calls`) yield ``(NAMESRV, frame, None)``: the driver sends the
frame to a NameServer of its list (the one that answered last first), fails over to the next
one on transport errors (:class:`rmq.errors.RemotingError`, a timeout: each NameServer waited
for :func:`rmq.client.route.namesrv_attempt_s` of the budget) and sends back the answer.  An error code from a NameServer
is the call's error, as RocketMQ's ``getTopicRouteInfoFromNameServer``.

Concurrency: one table per producer, used by its I/O thread or event loop only.
"""
from __future__ import annotations

from typing import Optional

from rmq.client.calls import Call
from rmq.client.route import (ROUTE_REFRESH_ON_FAILURE_MS, RouteCache, TopicPublishInfo, cluster_info_request,
                              parse_cluster_info, parse_route_response, route_request, route_suspect)
from rmq.errors import MQBrokerError, MQClientError, RemotingError
from rmq.protocol import Frame, ResponseCode

PROVISIONAL_REFRESH_MS = 100       # min gap between route look-ups of a topic sent to on a provisional route
PROVISIONAL_POLL_MS = 500          # route look-up period while a topic's route is provisional
NAMESRV = ""                       # the address a call yields for "a NameServer": the driver picks one
ROUTE_WRONG_REFRESH_MS = 100      # min gap between look-ups of a topic a broker said it lacks or refuses
_ROUTE_WRONG = frozenset({int(ResponseCode.TOPIC_NOT_EXIST), int(ResponseCode.NO_PERMISSION)})


def no_route_error(topic: str, why: str = "", code: int = int(ResponseCode.TOPIC_NOT_EXIST)) -> MQClientError:
    """RocketMQ's "No route info of this topic" (MQClientException), with ``why`` after it."""
    return MQClientError(f"No route info of this topic: {topic}{why}", code)


class PublishRoutes:
    """The per-topic route state of one producer (module docstring).  ``cache``: the producer's
    RouteCache, which this table fills through its calls."""

    __slots__ = ("cache", "_last_fetch", "_out", "_provisional")

    def __init__(self, cache: RouteCache) -> None:
        self.cache = cache
        self._last_fetch: dict = {}        # topic -> driver-clock seconds of the last look-up started
        self._out: dict = {}               # topic -> look-ups out
        self._provisional: set = set()     # topics given a provisional route, until known

    # -- look-ups -------------------------------------------------------------------------------
    def usable(self, topic: str) -> Optional[TopicPublishInfo]:
        """The topic's publish info when it has a writable queue, else None (look it up)."""
        info = self.cache.publish_info(topic)
        return info if info is not None and info.ok else None

    def started(self, topic: str, now: float) -> None:
        """A look-up of ``topic`` goes out (every call of this module counts as one)."""
        self._last_fetch[topic] = now
        self._out[topic] = self._out.get(topic, 0) + 1

    def ended(self, topic: str) -> None:
        """A look-up started with :meth:`started` has its answer or error."""
        n = self._out.get(topic, 0) - 1
        if n > 0:
            self._out[topic] = n
        else:
            self._out.pop(topic, None)

    def fetching(self, topic: str) -> bool:
        return topic in self._out

    def since_fetch(self, topic: str, now: float) -> float:
        """Seconds since ``topic``'s last look-up started (infinite when never)."""
        last = self._last_fetch.get(topic)
        return float("inf") if last is None else now - last

    # -- when to look again ---------------------------------------------------------------------
    # A yes counts as the start of the look-up it asks for (``last_fetch`` = ``now``): a burst of
    # failures, or of answers on a provisional route, asks once, even when the driver starts the
    # look-up later (a task).

    def refresh_after_failure(self, topic: str, exc: object, now: float) -> bool:
        """Whether a send to ``topic`` that failed with ``exc`` (an exception or an answer Frame)
        should look its route up again now (module docstring)."""
        code = exc.code if isinstance(exc, Frame) else exc.response_code if isinstance(exc, MQBrokerError) else None
        if code in _ROUTE_WRONG:
            due = self.since_fetch(topic, now) >= ROUTE_WRONG_REFRESH_MS / 1000.0
        else:
            due = route_suspect(exc) and self.since_fetch(topic, now) >= ROUTE_REFRESH_ON_FAILURE_MS / 1000.0
        if due:
            self._last_fetch[topic] = now
        return due

    def refresh_after_send(self, info: TopicPublishInfo, now: float) -> bool:
        """Whether a send answered on ``info`` should look its route up again now: on a
        provisional route, at most every PROVISIONAL_REFRESH_MS."""
        if info.provisional and self.since_fetch(info.topic, now) >= PROVISIONAL_REFRESH_MS / 1000.0:
            self._last_fetch[info.topic] = now
            return True
        return False

    def provisional_due(self, now: float) -> list:
        """The topics on a provisional route whose poll is due (PROVISIONAL_POLL_MS since the last
        look-up and none out); topics known since are forgotten here."""
        due = []
        for topic in list(self._provisional):
            info = self.cache.publish_info(topic)
            if info is None or not info.provisional:
                self._provisional.discard(topic)
            elif topic not in self._out and self.since_fetch(topic, now) >= PROVISIONAL_POLL_MS / 1000.0:
                self._last_fetch[topic] = now
                due.append(topic)
        return due

    @property
    def any_provisional(self) -> bool:
        return bool(self._provisional)

    # -- the calls ------------------------------------------------------------------------------
    def route_call(self, topic: str) -> Call:
        """GET_ROUTEINFO_BY_TOPIC: the route goes into the cache; returns it (a TopicRouteData,
        None when the NameServer does not know the topic).

        Raises (from the driver)
        ------
        MQClientError
            An error code or a malformed answer; what the driver threw (RemotingError).
        """
        resp = yield NAMESRV, route_request(topic), None
        route = parse_route_response(resp, topic)
        if route is not None:
            self.cache.update(topic, route)
        return route

    def brokers_call(self) -> Call:
        """GET_BROKER_CLUSTER_INFO: every broker group into the cache; returns them (BrokerData list).

        Raises (from the driver)
        ------
        MQClientError
            An error code or a malformed answer; what the driver threw (RemotingError).
        """
        resp = yield NAMESRV, cluster_info_request(), None
        brokers = parse_cluster_info(resp)
        self.cache.update_brokers(brokers)
        return brokers

    def publish_info_call(self, topic: str) -> Call:
        """RocketMQ's ``tryToFindTopicPublishInfo``: the topic's route from the NameServer; for a
        topic it does not know, a provisional route to every broker group with a master (the
        broker auto-creates the topic), from GET_BROKER_CLUSTER_INFO.  Returns a publish info with
        a writable queue.

        Raises
        ------
        MQClientError
            "No route info of this topic" (TOPIC_NOT_EXIST): no writable queue, or no broker with
            a master; with the cause after it when a NameServer could not be asked (transport
            error or error code < 0); an error code of the NameServer as it came.
        """
        try:
            route = yield from self.route_call(topic)
            if route is None and self.usable(topic) is None:
                brokers = yield from self.brokers_call()
                if not any(b.master_addr() for b in brokers):
                    raise no_route_error(topic, ", and the NameServer knows no broker with a master")
                self.cache.set_provisional(topic, brokers)
                self._provisional.add(topic)
        except MQClientError as e:
            if isinstance(e, RemotingError) or e.response_code < 0:
                raise no_route_error(topic, f": {e}", -1) from e
            raise
        info = self.usable(topic)
        if info is None:
            raise no_route_error(topic, " (no writable queue on a broker with a master)")
        return info


__all__ = ["PublishRoutes", "NAMESRV", "PROVISIONAL_REFRESH_MS", "PROVISIONAL_POLL_MS", "ROUTE_WRONG_REFRESH_MS",
           "no_route_error"]
