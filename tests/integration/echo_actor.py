"""A minimal actor for tests of the actor base (run as a real process)."""
import os
import sys

import zmq

from rmq.actors.actor import Actor
from rmq.common import malloc_tuning
from rmq.protocol import Frame, RequestCode


class EchoActor(Actor):
    name = "echo"

    def on_start(self):
        self.sock = self.socket(zmq.ROUTER, bind="tcp://127.0.0.1:*")
        self.serve(self.sock)
        self.handle(RequestCode.HEART_BEAT, lambda f, r: f.response(fields=f.fields, bodies=list(f.bodies)))
        self.handle(RequestCode.QUERY_MESSAGE, self.boom)
        self.handle(RequestCode.PULL_MESSAGE, self.deferred)
        # what Actor.run set up for malloc (None: nothing called tune_malloc)
        self.handle(RequestCode.GET_BROKER_RUNTIME_INFO,
                    lambda f, r: f.response(fields={"malloc": malloc_tuning.applied()}))
        self.parked = []
        self.add_timer(50, self.release)
        print("ready", self.sock.getsockopt_string(zmq.LAST_ENDPOINT), flush=True)

    def boom(self, frame, reply):
        raise RuntimeError("handler exploded")

    def deferred(self, frame, reply):
        self.parked.append(reply)          # answered by the timer

    def release(self):
        for r in self.parked:
            r.send(Frame(0, remark="later"))
        self.parked = []

    def on_stop(self):
        with open(os.path.join(self.store_path, "stopped"), "w") as f:
            f.write("ok")


if __name__ == "__main__":
    EchoActor(sys.argv[1]).run()
