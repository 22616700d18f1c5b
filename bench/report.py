"""One-process store benchmark table: the figures the team quotes.

    python bench/report.py [--json FILE] [--rounds 3] [--touch warm|cold]
                           [--file-size BYTES] [--only SUBSTRING]

Runs every scenario of ``bench/bench_store.py`` without pytest, timing with
``time.perf_counter``.  Each round of a scenario is paired with a round of its
memcpy ceiling over the same bytes (ceiling round, then scenario round, each on
a fresh, same-kind mapping), so the ratio compares figures measured seconds
apart.  msgs/s, MB/s and the ceiling are medians of the rounds; the ratio is
median MB/s / median ceiling MB/s.  MB = 10^6 bytes.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.dirname(HERE))     # the repo root: rmq importable without installing


def _parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    ap.add_argument("--rounds", type=int, default=3, help="rounds per scenario (median), default 3")
    ap.add_argument("--touch", choices=("warm", "cold"), default=None,
                    help="warm: store file and ceiling mapping pre-touched (default); "
                         "cold: both on first-touch pages")
    ap.add_argument("--file-size", type=int, default=None,
                    help="CommitLog / ceiling mapping size in bytes (default 256 MiB)")
    ap.add_argument("--only", action="append", default=[],
                    help="run scenarios whose key contains this (repeatable), e.g. append-1024")
    return ap.parse_args()


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def main() -> int:
    args = _parse()
    # bench_store reads these at import
    if args.touch:
        os.environ["RMQ_BENCH_TOUCH"] = args.touch
    if args.file_size:
        os.environ["RMQ_BENCH_FILE_SIZE"] = str(args.file_size)
    import bench_store as bs
    from rich.console import Console
    from rich.table import Table

    console = Console() if sys.stdout.isatty() else Console(width=170)
    scenarios = [sc for sc in bs.all_scenarios() if not args.only or any(o in sc.key for o in args.only)]
    load_before = os.getloadavg()
    console.print(f"[bold]rmq store benchmark[/] - {len(scenarios)} scenarios x {args.rounds} rounds, "
                  f"touch={bs.TOUCH}, file={bs.FILE_SIZE >> 20} MiB, python {platform.python_version()}, "
                  f"{os.cpu_count()} CPU {_cpu_model()}, load {load_before[0]:.2f}")
    results = []
    t_start = time.perf_counter()
    try:
        for sc in scenarios:
            ceiling = bs.ceiling_scenario(sc.ceiling, sc.nbytes, sc.span)
            secs, csecs = [], []
            for _ in range(args.rounds):
                csecs.append(bs.time_round(ceiling))
                secs.append(bs.time_round(sc))
            med, cmed = statistics.median(secs), statistics.median(csecs)
            ceil_mb_s = sc.nbytes / cmed / bs.MB
            d = bs.derived(sc, med, ceil_mb_s)
            d.update(key=sc.key, scenario=sc.label, params=sc.params, rounds_s=[round(s, 6) for s in secs],
                     ceiling_rounds_s=[round(s, 6) for s in csecs], median_s=round(med, 6),
                     spread=round((max(secs) - min(secs)) / med, 4))
            results.append(d)
            console.print(f"  {sc.label:<44} {d['msgs_per_s']:>13,} msgs/s {d['mb_per_s']:>9,.1f} MB/s  "
                          f"ratio {d['ratio_to_ceiling']:.1%}", highlight=False)
    finally:
        bs._SharedStore.close_all()
    load_after = os.getloadavg()

    table = Table(title=f"rmq store vs memcpy ceiling (median of {args.rounds}; touch={bs.TOUCH}; "
                        f"MB = 10^6 B)")
    for col, just in (("scenario", "left"), ("msgs/s", "right"), ("MB/s", "right"),
                      ("ceiling MB/s", "right"), ("ratio to ceiling", "right"), ("target", "left"),
                      ("met?", "center"), ("spread", "right")):
        table.add_column(col, justify=just)
    for d in results:
        met = ""
        if "target_met" in d:
            met = "[green]yes[/]" if d["target_met"] else "[red]NO[/]"
        table.add_row(d["scenario"], f"{d['msgs_per_s']:,}", f"{d['mb_per_s']:,.1f}",
                      f"{d['ceiling_mb_per_s']:,.1f} ({d['ceiling']})", f"{d['ratio_to_ceiling']:.1%}",
                      d.get("target", "-"), met, f"{d['spread']:.0%}")
    console.print(table)
    console.print("ceiling: memcpy of the same bytes in 1 MiB chunks into (write) / out of (read) a "
                  "same-size MappedFile prepared the same way; MB/s of append/dispatch/get = CommitLog "
                  "record bytes, of read_raw = 20-byte units.  spread = (max - min) / median of the rounds.  "
                  f"load average {load_before[0]:.2f} -> {load_after[0]:.2f}; "
                  f"{time.perf_counter() - t_start:.0f} s.", highlight=False)
    if args.json:
        doc = {"when": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "python": platform.python_version(),
               "cpu": _cpu_model(), "cpus": os.cpu_count(), "touch": bs.TOUCH, "file_size": bs.FILE_SIZE,
               "rounds": args.rounds, "loadavg_before": load_before, "loadavg_after": load_after,
               "results": results}
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=2)
        console.print(f"wrote {args.json}")
    missed = [d["scenario"] for d in results if d.get("target_met") is False]
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
