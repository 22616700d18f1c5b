"""RocketMQ 5's gRPC messages (package ``apache.rocketmq.v2``): ``messaging_pb2`` is generated from
``messaging.proto`` when rmq is built (setup.py, grpcio-tools' protoc)."""
