"""``rmq bench latency --trace``: join the hop events of :mod:`rmq.latency_trace` per message.

Every stamp is a CLOCK_MONOTONIC reading taken where the hop happens (producer, broker, reput,
consumer: one clock for the machine), so a hop is a difference of two readings, never an estimate.
A message enters the breakdown only when every one of its stamps was found; how many did is
reported (``traced`` of ``delivered``).

Hops, in path order (``HOPS``; the names the issue gives them):

==================  =========================================================================
client enqueue      send call -> the message handed to the producer's I/O thread
client I/O thread   -> its request written to the broker's socket
to broker           -> the broker's send handler started on it (transport, and the wait behind
                    the requests the broker's loop handles before it)
broker append       -> appended to the CommitLog (checks, encode, append)
to reput            -> reput's poll returned with the append announcement (PUB/SUB hop; the
                    broker announces after its poll turn)
reput dispatch      -> ConsumeQueue entries written (reput's 1 ms coalescing included)
dispatch announce   -> the broker read reput's DISPATCH_ANNOUNCE
long-poll wake      -> the pull reply with the message was built (a held pull woken; for a pull
                    that was not held: the wait for the consumer's next pull).  A pull answered
                    from the append itself (wakePullOnAppendEnable) skips the three reput hops
                    (0 for that message): its wake is counted from the append
to consumer         -> the consumer's pull response decoded
process queue       -> put in the process queue and handed to the consume pool (push, aio)
listener call       -> the listener was called (poll: ``poll`` returned)
==================  =========================================================================
"""
from __future__ import annotations

import bisect
from collections import defaultdict

HOPS = ("client enqueue", "client I/O thread", "to broker", "broker append", "to reput", "reput dispatch",
        "dispatch announce", "long-poll wake", "to consumer", "process queue", "listener call")


def _pct(sorted_vals: list, q: float) -> float:
    if not sorted_vals:
        return float("nan")
    i = min(len(sorted_vals) - 1, max(0, int(round(q * (len(sorted_vals) - 1)))))
    return sorted_vals[i]


class _BrokerIndex:
    """Broker events of one run, searchable by (topic, queueId, queue offset)."""

    def __init__(self, events: list):
        self.appends: dict = defaultdict(list)      # (topic, qid) -> [(first, n, recv, appended)]
        self.dispatch: dict = defaultdict(list)     # (topic, qid) -> [(max, r_rx, r_done, b_rx)] in arrival order
        self.pulls: dict = defaultdict(list)        # (topic, qid, queue offset) -> [(offset, next, arrived, replied, held)]
        for ev in events:
            kind, key = ev[0], (ev[1], ev[2])
            if kind == "append":
                self.appends[key].append(tuple(ev[3:7]))
            elif kind == "dispatch":
                self.dispatch[key].append(tuple(ev[3:7]))
            elif kind == "pull":
                p = tuple(ev[3:8])
                for qoff in range(p[0], p[1]):           # a pull reply covers [offset, nextBeginOffset)
                    self.pulls[(ev[1], ev[2], qoff)].append(p)
        for v in self.appends.values():
            v.sort()
        self._append_firsts = {k: [a[0] for a in v] for k, v in self.appends.items()}
        self._dispatch_max = {}
        for k, v in self.dispatch.items():
            run_max, maxes = 0, []
            for d in v:                              # a running max: bisect needs it non-decreasing
                run_max = max(run_max, d[0])
                maxes.append(run_max)
            self._dispatch_max[k] = maxes

    def append(self, key, qoff):
        firsts = self._append_firsts.get(key)
        if not firsts:
            return None
        i = bisect.bisect_right(firsts, qoff) - 1
        if i < 0:
            return None
        a = self.appends[key][i]
        return a if a[0] <= qoff < a[0] + a[1] else None

    def dispatched(self, key, qoff):
        maxes = self._dispatch_max.get(key)
        if not maxes:
            return None
        i = bisect.bisect_right(maxes, qoff)         # first announcement whose max offset covers qoff
        return self.dispatch[key][i] if i < len(maxes) else None

    def pull(self, key, qoff, after_ns: int):
        best = None
        for p in self.pulls.get((*key, qoff), ()):
            if p[3] >= after_ns and (best is None or p[3] < best[3]):
                best = p
        return best


def breakdown(deliveries: list, client_events: list, broker_events: list, mode: str) -> dict:
    """Per-hop figures of the messages whose every stamp was found.

    Parameters
    ----------
    deliveries : list of (uniq, topic, queue_id, queue_offset, t0_ns, delivered_ns)
    client_events : rmq.latency_trace events of the producer and the consumer processes
    broker_events : the broker's (GET_LATENCY_TRACE)
    mode : "push", "aio" or "poll" (poll has no process-queue hop)

    Returns
    -------
    dict
        ``{"traced": n, "held": n, "via_reput": n, "hops": [{"hop", "mean_us", "p50_us", "p99_us",
        "share"}], "total": {...}}``; ``share`` is the hop's mean over the total mean (means add up,
        percentiles do not).  A message answered from the append (the broker's
        wakePullOnAppendEnable) has 0 for the three reput hops; ``via_reput`` counts the others.
    """
    first: dict = {}
    for ev in client_events:
        kind = ev[0]
        if kind in ("p_enq", "p_write", "c_rx", "c_submit"):
            first.setdefault((kind, ev[1]), ev[2])
    idx = _BrokerIndex(broker_events)
    rows: list = []
    held = via_reput = 0
    for uniq, topic, qid, qoff, t0, t_done in deliveries:
        key = (topic, qid)
        a = idx.append(key, qoff)
        d = idx.dispatched(key, qoff)
        p_enq, p_write = first.get(("p_enq", uniq)), first.get(("p_write", uniq))
        c_rx, c_sub = first.get(("c_rx", uniq)), first.get(("c_submit", uniq))
        if a is None or p_enq is None or p_write is None or c_rx is None:
            continue
        pl = idx.pull(key, qoff, a[3])
        if pl is None or (mode != "poll" and c_sub is None):
            continue
        held += bool(pl[4])
        if d is not None and d[3] <= pl[3]:          # woken by reput's announcement
            via_reput += 1
            mid = [d[1] - a[3], d[2] - d[1], d[3] - d[2], pl[3] - d[3]]
        else:                                        # answered from the append itself
            mid = [0, 0, 0, pl[3] - a[3]]
        hops = [p_enq - t0, p_write - p_enq, a[2] - p_write, a[3] - a[2], *mid]
        if mode != "poll":
            hops += [c_rx - pl[3], c_sub - c_rx, t_done - c_sub]
        else:
            hops += [c_rx - pl[3], t_done - c_rx]
        rows.append(hops + [t_done - t0])
    names = list(HOPS) if mode != "poll" else [h for h in HOPS if h != "process queue"]
    out = {"traced": len(rows), "held": held, "via_reput": via_reput, "hops": []}
    if not rows:
        return out
    total_mean = sum(r[-1] for r in rows) / len(rows)
    for j, name in enumerate(names + ["total"]):
        vals = sorted(r[j] for r in rows)
        mean = sum(vals) / len(vals)
        h = {"hop": name, "mean_us": mean / 1e3, "p50_us": _pct(vals, 0.5) / 1e3, "p99_us": _pct(vals, 0.99) / 1e3,
             "share": mean / total_mean if total_mean else float("nan")}
        if name == "total":
            out["total"] = h
        else:
            out["hops"].append(h)
    return out


def format_breakdown(path: str, bd: dict, delivered: int) -> list:
    """Lines for the console: one per hop, then the total."""
    lines = [f"  trace of {path}: {bd['traced']:,} of {delivered:,} messages with every stamp "
             f"({bd['held']:,} woke a held pull, {bd.get('via_reput', 0):,} of them after reput's announcement)"]
    for h in bd["hops"] + ([bd["total"]] if "total" in bd else []):
        lines.append(f"    {h['hop']:<20} mean {h['mean_us']:>9,.1f} us  p50 {h['p50_us']:>9,.1f}  "
                     f"p99 {h['p99_us']:>9,.1f}  {h['share'] * 100:5.1f} %")
    return lines
