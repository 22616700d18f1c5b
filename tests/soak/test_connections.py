"""RMQ_SOAK_CONNECTIONS (1,000) concurrent client connections (issue 16, "Soak and overload").

Half Producers, half PullConsumers, spread over RMQ_SOAK_CONNECTION_PROCS (4) worker processes;
every client instance has its own sockets (a Producer its I/O thread's, a PullConsumer its
RemotingClient's), so each is a connection of its own to the NameServer and to the broker.  All
are created and connected together and held open while the broker is measured:

1. each producer sends RMQ_SOAK_CONNECTION_MSGS (5) messages (``send_async``, all producers at
   once); a refusal with a response code (e.g. SYSTEM_BUSY) is retried (up to 5 times) and
   counted, anything else (a timeout, no answer) counts as unclear;
2. each consumer fetches the topic's queues (NameServer) and an offset (broker);
3. with everything connected: the broker's ESTABLISHED connections, RSS and descriptors;
4. the consumers read back every acknowledged message by its queue offset (one pull each);
5. everything closes; the broker's connections and descriptors must come back down.

All of it RMQ_SOAK_CONNECTION_ROUNDS (3) times, with new processes each round: what the first
round leaves in the broker's heap (allocator arenas, ZeroMQ's pools) is the memory baseline, and
the later rounds must not add to it beyond the RSS tolerance (a leak per connection would, round
after round).

Fails on: an unclear outcome (a timeout); a message not acknowledged or not read back intact;
fewer broker connections than clients; the broker's descriptors not back within FD_GROWTH_SLACK
of the start once the clients closed (a leak per connection); its anonymous RSS after the last
round past the tolerance over the first round's; an actor exiting.
"""
import pytest

from tests.soak.harness import (
    CONNECTION_MSGS,
    CONNECTION_PROCS,
    CONNECTION_ROUNDS,
    CONNECTIONS,
    FD_GROWTH_SLACK,
    RSS_GROWTH_FACTOR,
    RSS_GROWTH_SLACK,
    mib,
    proc_memory,
    rss_flat,
    soak_cluster,
    start_all,
    tcp_connections,
    wait_until,
    workers,
)

TOPIC = "Connections"
ROUNDS = CONNECTION_ROUNDS       # connect-all / close-all rounds
SETTLE_TIMEOUT_S = 120        # connections established / closed, as the broker sees them, within this


def split(n: int, parts: int) -> list:
    return [n // parts + (1 if i < n % parts else 0) for i in range(parts)]


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_thousand_client_connections(tmp_path):
    log_dir = tmp_path / "workers"
    n_prod = CONNECTIONS // 2
    n_cons = CONNECTIONS - n_prod
    problems = []
    rounds = []
    with soak_cluster(tmp_path / "store", topics=(TOPIC,)) as c, workers() as started:
        actors = {"broker": (c.procs["broker"].pid, int(c.broker_addr.rsplit(":", 1)[1])),
                  "nameserver": (c.namesrv.pid, int(c.namesrv_addr.rsplit(":", 1)[1]))}
        bpid, bport = actors["broker"]

        def measure() -> dict:
            return {n: (proc_memory(pid), tcp_connections(pid, port)) for n, (pid, port) in actors.items()}

        before = measure()
        for rnd in range(ROUNDS):
            specs = [(f"clients-{rnd}-{i}", {"role": "connections", "namesrv": c.namesrv_addr, "topic": TOPIC,
                                              "wid": rnd * CONNECTION_PROCS + i, "producers": p, "consumers": q,
                                              "msgs": CONNECTION_MSGS})
                     for i, (p, q) in enumerate(zip(split(n_prod, CONNECTION_PROCS),
                                                    split(n_cons, CONNECTION_PROCS)))]
            ws = start_all(started, specs, log_dir, ready_timeout=900)
            wait_until(lambda: tcp_connections(bpid, bport) >= CONNECTIONS, SETTLE_TIMEOUT_S,
                       f"{CONNECTIONS} client connections established at the broker")
            during = measure()
            for w in ws:
                w.send("readback")
            readback = [w.wait("readback", 900) for w in ws]
            for w in ws:
                w.send("close")
            for w in ws:
                w.wait("done", 300)
                w.close()
            wait_until(lambda: tcp_connections(bpid, bport) <= before["broker"][1], SETTLE_TIMEOUT_S,
                       "the broker's client connections closed")
            try:
                wait_until(lambda: proc_memory(bpid)["fds"] <= before["broker"][0]["fds"] + FD_GROWTH_SLACK,
                           SETTLE_TIMEOUT_S, "the broker's descriptors back down")
            except AssertionError as e:
                problems.append(f"round {rnd + 1}: {e}")
            rounds.append(([w.ready for w in ws], readback, during, measure()))
        dead = {n: ap.proc.poll() for n, ap in c.procs.items() if ap.proc.poll() is not None}

    print(f"\nconnections: {n_prod:,} Producers + {n_cons:,} PullConsumers in {CONNECTION_PROCS} processes, all "
          f"connected at once, {ROUNDS} rounds (new processes each)")
    prev = before
    for rnd, (ready, readback, during, after) in enumerate(rounds, 1):
        expected = sum(r["expected"] for r in ready)
        acked = sum(r["acked"] for r in ready)
        refused: dict = {}
        unclear: dict = {}
        for r in ready + readback:
            for src, dst in ((r.get("refused", {}), refused), (r.get("unclear", {}), unclear)):
                for k, v in src.items():
                    dst[k] = dst.get(k, 0) + v
        read_ok = sum(r["read_ok"] for r in readback)
        missing = sum(r["missing"] for r in readback)
        print(f"connections: round {rnd}: set up in {max(r['setup_s'] for r in ready):.1f} s; broker connections "
              f"{during['broker'][1]:,} (NameServer {during['nameserver'][1]:,}), after closing "
              f"{after['broker'][1]} ({after['nameserver'][1]}); {acked:,} of {expected:,} sends acknowledged, "
              f"{read_ok:,} read back intact; refused with a code (then retried) {refused or 0}; "
              f"unclear (timeouts, ...) {unclear or 0}")
        for name in actors:
            (m0, _), (m1, k1), (m2, _) = prev[name], during[name], after[name]
            per_conn = (m1["rss"] - m0["rss"]) / max(k1, 1) / 1024
            print(f"connections: round {rnd}: {name:<10} RSS MiB before the round/with {k1:,} connected/after "
                  f"{mib(m0['rss'])}/{mib(m1['rss'])}/{mib(m2['rss'])} (anonymous {mib(m0['anon'])}/"
                  f"{mib(m1['anon'])}/{mib(m2['anon'])}; {per_conn:,.1f} KiB per connection), open fds "
                  f"{m0['fds']}/{m1['fds']:,}/{m2['fds']}")
            if m2["fds"] > before[name][0]["fds"] + FD_GROWTH_SLACK:
                problems.append(f"round {rnd}: {name}: {m2['fds']} descriptors after the clients closed, "
                                f"{before[name][0]['fds']} before the first round")
        prev = after
        if unclear:
            problems.append(f"round {rnd}: outcomes without a clear answer: {unclear}; first errors "
                            f"{[e for r in ready for e in r['first_errors']][:3]}")
        if acked != expected:
            problems.append(f"round {rnd}: {expected - acked} sends never acknowledged (refusals: {refused})")
        if missing or read_ok != acked:
            problems.append(f"round {rnd}: {missing} acknowledged messages not read back intact: "
                            f"{[b for r in readback for b in r['bad']][:3]}")
        if during["broker"][1] < CONNECTIONS:
            problems.append(f"round {rnd}: the broker saw {during['broker'][1]} connections, fewer than the "
                            f"{CONNECTIONS} clients")
    # memory: what the first round left is the baseline (allocator arenas, ZeroMQ's pools); the later
    # rounds must not add to it beyond the tolerance (a leak per connection would, round after round)
    for name in actors:
        base, last = rounds[0][3][name][0]["anon"], rounds[-1][3][name][0]["anon"]
        print(f"connections: {name} anonymous RSS after round 1 {mib(base)} MiB, after round {ROUNDS} {mib(last)} MiB")
        if not rss_flat(base, last):
            problems.append(f"{name}: anonymous RSS {mib(base)} MiB after round 1, {mib(last)} MiB after round "
                            f"{ROUNDS} (tolerance x{RSS_GROWTH_FACTOR} + {mib(RSS_GROWTH_SLACK)} MiB)")
    if dead:
        problems.append(f"actors exited: {dead}")
    assert not problems, "\n".join(problems)
