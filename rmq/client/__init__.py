"""Clients that speak the wire (never the files).

How the client is laid out (issue 17's rule: each rule written once, the thread and asyncio
clients only wait differently, as psycopg 3's generators and ``waiting.py``):

- **Calls without I/O.**  A wire call is a generator that yields ``(addr, frame, timeout_ms)``
  and is sent the answer (:mod:`rmq.client.calls`, with the blocking and awaiting drivers):
  :class:`~rmq.client.consumer_api.ConsumerCalls` (routes, read-address choice, pulls, offsets,
  membership, send-back), :class:`~rmq.client.consumer.PullConsumerCalls` (single pulls,
  seeks, commits), :class:`~rmq.client.consumer.PushConsumerCalls` (rebalance, consume
  results), :class:`~rmq.client.simple_consumer.SimpleConsumerCalls` (POP), and the producers'
  route look-ups with the table of when to repeat them
  (:class:`~rmq.client.publish_routes.PublishRoutes`).  Each is tested by stepping it by hand
  (``tests/unit/test_consumer_calls.py``, ``tests/unit/test_publish_routes.py``).
- **Rules without I/O.**  :class:`~rmq.client.send_attempts.SendAttempts` (RocketMQ's
  sendDefaultImpl: queue per attempt, fault strategy, retries, the final error), the batch
  producer's defaults, options, message preparation, queue selection and the send request and
  its answer (:mod:`rmq.client.producer_request`, the per-message work in C in
  :mod:`rmq._core.client_msg`), the thread producer's accumulator and the ordered queues' turns
  (:mod:`rmq.client.message_accumulator`), :class:`~rmq.client.route.MQFaultStrategy`,
  :class:`~rmq.client.consumer_process_queue.ProcessQueue`, allocation strategies
  (:mod:`rmq.client.rebalance`), futures and their outcomes (:mod:`rmq.client.futures`).
- **Transports.**  Threads: :class:`~rmq.client.remoting.RemotingClient` (one blocking
  request per call), :class:`~rmq.client.consumer_api.RequestMux` (the pull engine's many
  requests), the producer's I/O thread (:class:`rmq.client.sender.Sender`) and its direct
  path (:mod:`rmq.client.direct`).  asyncio: :class:`rmq.aio.remoting.AsyncRemoting`, shared by
  the aio producer, the aio consumers and the proxy.
- **Drivers.**  ``rmq.client.*`` (threads) and ``rmq.aio.*`` (event loop) build on the above;
  what differs is who waits and how work is handed over (consume threads vs tasks).
"""
