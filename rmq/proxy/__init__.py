"""rmq's proxy for RocketMQ's own clients: the 4.x remoting protocol over TCP
(:mod:`rmq.proxy.remoting` frames, :mod:`rmq.proxy.server` forwarding).  Run it with
``rmq proxy --namesrv-addr HOST:PORT``."""
from rmq.proxy.server import PROXY_BROKER_NAME, REMOTING_LISTEN_PORT, ProxyServer, run_proxy

__all__ = ["ProxyServer", "run_proxy", "REMOTING_LISTEN_PORT", "PROXY_BROKER_NAME"]
