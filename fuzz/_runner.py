"""Shared ``main`` of the atheris entry points, with a libFuzzer-less fallback.

``python fuzz/fuzz_X.py -max_total_time=60 [corpus_dir]`` runs atheris (libFuzzer)
when it is installed (``pip install -e .[fuzz]``); otherwise, or with
``--fallback``, a seeded random-bytes + mutation loop over the same target for
the same time.  Either way it prints RELIABILITY.md's figure:
``fuzz execs / crashes / hangs: N / C / H``.
"""
from __future__ import annotations

import logging
import os
import random
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

HANG_S = 10.0


def _want_fallback() -> bool:
    return "--fallback" in sys.argv


def instrumented():
    """Context manager for the target's imports: atheris coverage instrumentation of the
    Python code (rmq.protocol, msgpack's fallback, fuzz.targets) when atheris runs.
    The Cython core is native code: libFuzzer sees it only through its Python callers."""
    import contextlib
    if _want_fallback():
        return contextlib.nullcontext()
    try:
        import atheris
    except ImportError:
        return contextlib.nullcontext()
    return atheris.instrument_imports()


def _arg(argv, name, default):
    for a in argv:
        if a.startswith(f"-{name}="):
            return type(default)(a.split("=", 1)[1])
    return default


def mutate(rng: random.Random, seeds: list, max_len: int) -> bytes:
    """A seed with a few random edits, or random bytes."""
    if seeds and rng.random() < 0.8:
        b = bytearray(rng.choice(seeds))
        for _ in range(rng.randrange(1, 6)):
            op = rng.randrange(5)
            if op == 0 and b:
                b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
            elif op == 1 and b:
                b[rng.randrange(len(b))] = rng.randrange(256)
            elif op == 2 and b:
                del b[rng.randrange(len(b)):]
            elif op == 3:
                i = rng.randrange(len(b) + 1)
                b[i:i] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 16)))
            elif op == 4 and len(b) > 4:
                i = rng.randrange(len(b) - 4)
                b[i:i + 4] = rng.choice([b"\xff\xff\xff\xff", b"\x7f\xff\xff\xff", b"\x00\x00\x00\x00",
                                         b"\x80\x00\x00\x00"])
        return bytes(b[:max_len])
    return bytes(rng.randrange(256) for _ in range(rng.randrange(max_len)))


def fallback(target, seeds: list, seconds: float, seed: int, max_len: int) -> int:
    rng = random.Random(seed)
    execs = crashes = hangs = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        data = mutate(rng, seeds, max_len)
        t0 = time.monotonic()
        try:
            target(data)
        except Exception as e:  # noqa: BLE001 - a finding
            crashes += 1
            path = os.path.join(os.getcwd(), f"crash-{type(e).__name__}-{execs}")
            with open(path, "wb") as f:
                f.write(data)
            print(f"CRASH {type(e).__name__}: {e} (input saved to {path})", flush=True)
        if time.monotonic() - t0 > HANG_S:
            hangs += 1
        execs += 1
    print(f"fuzz execs / crashes / hangs: {execs} / {crashes} / {hangs}  (seeded random loop, seed {seed})",
          flush=True)
    return 1 if crashes or hangs else 0


def main(target, seeds: list, max_len: int = 4096) -> int:
    logging.disable(logging.CRITICAL)          # recovery warnings would drown the output
    argv = sys.argv[1:]
    use_fallback = "--fallback" in argv
    argv = [a for a in argv if a != "--fallback"]
    seconds = _arg(argv, "max_total_time", 60)
    try:
        import atheris
    except ImportError:
        atheris = None
    if atheris is None or use_fallback:
        if atheris is None:
            print("atheris not installed: seeded random-bytes fallback", flush=True)
        return fallback(target, seeds, seconds, _arg(argv, "seed", 1), max_len)
    execs = [0]
    t_end = time.monotonic() + seconds

    def one(data: bytes) -> None:
        execs[0] += 1
        target(data)
        if time.monotonic() >= t_end:     # our own stop, so the figure is printed (libFuzzer _exits)
            print(f"fuzz execs / crashes / hangs: {execs[0]} / 0 / 0  (atheris)", flush=True)
            os._exit(0)

    # seed corpus: a directory argument is libFuzzer's corpus; add ours when none is given
    if not any(not a.startswith("-") for a in argv):
        import tempfile
        d = tempfile.mkdtemp(prefix=f"rmq-{os.path.splitext(os.path.basename(sys.argv[0]))[0]}-corpus-")
        for i, s in enumerate(seeds):
            with open(os.path.join(d, f"seed-{i}"), "wb") as f:
                f.write(s)
        argv.append(d)
    if not any(a.startswith("-max_len=") for a in argv):
        argv.append(f"-max_len={max_len}")
    if not any(a.startswith("-timeout=") for a in argv):
        argv.append(f"-timeout={int(HANG_S)}")
    argv = [a for a in argv if not a.startswith("-max_total_time=")] + [f"-max_total_time={int(seconds) + 30}"]
    atheris.Setup([sys.argv[0], *argv], one)
    atheris.Fuzz()       # exits the process on a crash or a hang (libFuzzer prints the input)
    return 0
