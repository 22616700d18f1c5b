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
        self.handle(RequestCode.QUERY_CONSUMER_OFFSET, self.at_end)
        self.turn_replies = []
        # what Actor.run set up for malloc (None: nothing called tune_malloc)
        self.handle(RequestCode.GET_BROKER_RUNTIME_INFO,
                    lambda f, r: f.response(fields={"malloc": malloc_tuning.applied()}))
        self.parked = []
        self.add_timer(50, self.release)
        print("ready", self.sock.getsockopt_string(zmq.LAST_ENDPOINT), flush=True)

    def boom(self, frame, reply):
        raise RuntimeError("handler exploded")

    def at_end(self, frame, reply):
        """Answered by a callable run at the end of its turn (Actor.at_turn_end), "alone" when it is
        not part of one; field ``boom``: a callable that raises is registered first."""
        if frame.fields.get("boom"):
            self.at_turn_end(self.explode)
        if not self.turn_replies and not self.at_turn_end(self.answer_turn):
            return frame.response(remark="alone")
        self.turn_replies.append((frame, reply))
        return None

    def answer_turn(self):
        replies, self.turn_replies = self.turn_replies, []
        for frame, reply in replies:
            reply.send(frame.response(remark="turn end", fields={"n": len(replies)}))

    def explode(self):
        raise RuntimeError("turn end exploded")

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
