"""RocketMQ 5's controller (controller mode): automatic master election per broker set.

- :mod:`rmq.controller.state`: the replicated state and its operations (ReplicasInfoManager),
  pure and deterministic;
- :mod:`rmq.controller.heartbeat`: broker liveness as one controller sees it (not replicated);
- :mod:`rmq.controller.raft`: the state replicated with pysyncobj (Raft);
- :mod:`rmq.controller.actor`: the controller process (``rmq controller``).

Only the pure modules are imported here; the actor and Raft load pysyncobj and zmq.
"""
from rmq.controller.heartbeat import DEFAULT_HEARTBEAT_TIMEOUT_MS, BrokerHeartbeatManager
from rmq.controller.state import FIRST_BROKER_ID, NO_MASTER, ControllerState, Result

__all__ = ["ControllerState", "Result", "NO_MASTER", "FIRST_BROKER_ID", "BrokerHeartbeatManager",
           "DEFAULT_HEARTBEAT_TIMEOUT_MS"]
