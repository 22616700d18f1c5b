"""What Prometheus metrics cost: `rmq bench produce` / `consume` / `e2e` against a broker group
with metricsExporterType=DISABLE and one with PROM (scraped every --scrape-s seconds while the
bench runs), alternating, several rounds.  Prints msgs/s per run and the median ratio on/off.

    python bench/metrics_overhead.py --rounds 3 --scenario produce,e2e

Run it on a quiet machine: the figure is a few per cent, well inside the noise of a busy one.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import urllib.request

from rmq.testing import Cluster, broker_runtime_info


def run_bench(scenario: str, namesrv: str, duration: float, out: str) -> float:
    cmd = [sys.executable, "-m", "rmq.cli", "bench", scenario, "--namesrv", namesrv, "-d", str(duration),
           "--size", "100", "--json", out, "--no-progress"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(out) as f:
        data = json.load(f)
    rates = [r for r in data.get("rows", []) if r.get("kind") == scenario and "msgs_per_s" in r]
    if not rates:
        raise SystemExit(f"no msgs_per_s in {out}")
    return float(rates[0]["msgs_per_s"])


def _walk(x):
    yield x
    if isinstance(x, dict):
        for v in x.values():
            yield from _walk(v)
    elif isinstance(x, list):
        for v in x:
            yield from _walk(v)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--scenario", default="produce,e2e")
    p.add_argument("--duration", type=float, default=5.0)
    p.add_argument("--scrape-s", type=float, default=1.0)
    a = p.parse_args()
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="rmq-metrics-bench-") as tmp:
        for rnd in range(a.rounds):
            for mode in ("off", "on") if rnd % 2 == 0 else ("on", "off"):
                conf = {"mappedFileSizeCommitLog": str(512 << 20), "maxHashSlotNum": "500000",
                        "maxIndexNum": "2000000"}
                if mode == "on":
                    conf.update(metricsExporterType="PROM", metricsPromExporterPort="0")
                store = os.path.join(tmp, f"{rnd}-{mode}")
                with Cluster(store, conf=conf) as c:
                    stop = threading.Event()
                    scrapes = [0]
                    if mode == "on":
                        url = broker_runtime_info(c.broker_addr)["metricsUrl"]

                        def scraper():
                            while not stop.wait(a.scrape_s):
                                with urllib.request.urlopen(url, timeout=10) as r:
                                    r.read()
                                scrapes[0] += 1
                        threading.Thread(target=scraper, daemon=True).start()
                    for scenario in a.scenario.split(","):
                        rate = run_bench(scenario, c.namesrv_addr, a.duration, os.path.join(tmp, "out.json"))
                        results.setdefault((scenario, mode), []).append(rate)
                        print(f"round {rnd} {scenario:8s} metrics {mode:3s}: {rate:12,.0f} msgs/s"
                              + (f" ({scrapes[0]} scrapes so far)" if mode == "on" else ""), flush=True)
                    stop.set()
    for scenario in a.scenario.split(","):
        off = statistics.median(results[(scenario, "off")])
        on = statistics.median(results[(scenario, "on")])
        print(f"{scenario}: median off {off:,.0f} msgs/s, on {on:,.0f} msgs/s: on/off = {on / off:.3f} "
              f"(cost {100 * (1 - on / off):+.1f} %)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
