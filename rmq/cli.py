"""The ``rmq`` command line: ``rmq demo store`` (more commands arrive with the actors)."""
from __future__ import annotations

import os
import shutil
import tempfile
import time

import click
from rich.console import Console
from rich.table import Table

console = Console()


@click.group()
@click.version_option(package_name="rmq")
def main() -> None:
    """rmq: a RocketMQ-style message broker for Python."""


@main.group()
def demo() -> None:
    """Runnable demonstrations."""


@demo.command("store")
@click.option("--store-path", type=click.Path(file_okay=False), default=None,
              help="Store directory (default: a temporary directory, removed afterwards).")
@click.option("--messages", "-n", type=click.IntRange(1, 10_000_000), default=200_000, show_default=True,
              help="Messages to write.")
@click.option("--body-size", type=click.IntRange(0, 4 * 1024 * 1024), default=100, show_default=True,
              help="Body size, bytes.")
@click.option("--queues", type=click.IntRange(1, 64), default=8, show_default=True)
@click.option("--batch", type=click.IntRange(1, 10_000), default=256, show_default=True,
              help="Messages per put_messages batch.")
def demo_store(store_path, messages, body_size, queues, batch) -> None:
    """Write, dispatch, read back, look up by key, crash-recover: the embedded store end to end."""
    from rmq._core.commitlog import encode_batch, encode_properties
    from rmq.store.message_store import MessageStore

    tmp = None
    if store_path is None:
        tmp = store_path = tempfile.mkdtemp(prefix="rmq-demo-")
    cfg = dict(mapped_file_size_commit_log=64 * 1024 * 1024, max_hash_slot_num=500_000,
               max_index_num=2_000_000, max_transfer_count_on_message_in_memory=1024,
               max_transfer_bytes_on_message_in_memory=4 * 1024 * 1024)
    table = Table(title=f"rmq embedded store: {messages:,} x {body_size} B in {store_path}")
    table.add_column("step")
    table.add_column("result", justify="right")
    table.add_column("rate", justify="right")
    try:
        body = os.urandom(body_size)
        store = MessageStore(store_path, **cfg)
        t0 = time.perf_counter()
        sent = 0
        seq = 0
        while sent < messages:
            n = min(batch, messages - sent)
            msgs = [(body, encode_properties({"TAGS": f"T{(seq + i) % 3}", "KEYS": f"order-{seq + i}",
                                              "UNIQ_KEY": f"{seq + i:032X}"}), 0) for i in range(n)]
            r = store.put_messages("DemoTopic", (seq // batch) % queues, encode_batch(msgs), count_hint=n)
            if not r.ok:
                raise click.ClickException(f"put failed: {r.status.value} {r.remark}")
            sent += n
            seq += n
        dt = time.perf_counter() - t0
        table.add_row("put_messages", f"{sent:,} msgs", f"{sent / dt:,.0f} msgs/s")
        t0 = time.perf_counter()
        dispatched = store.dispatch()
        dt = time.perf_counter() - t0
        table.add_row("dispatch (ConsumeQueue + IndexFile)", f"{dispatched:,} records", f"{dispatched / dt:,.0f} rec/s")
        t0 = time.perf_counter()
        got = 0
        for q in range(queues):
            off = 0
            while True:
                res = store.get_messages("demo", "DemoTopic", q, off, 1024)
                if not res.message_count:
                    break
                got += res.message_count
                off = res.next_begin_offset
        dt = time.perf_counter() - t0
        table.add_row("get_messages (all queues)", f"{got:,} msgs", f"{got / dt:,.0f} msgs/s")
        found = store.query_message("DemoTopic", f"order-{messages // 2}").messages()
        table.add_row("query_message by key", f"{len(found)} found", "")
        store.flush()
        # crash: drop the store without a clean shutdown, then reopen (abnormal recovery)
        store.abandon()
        t0 = time.perf_counter()
        store = MessageStore(store_path, **cfg)
        dt = time.perf_counter() - t0
        total = sum(store.get_max_offset_in_queue("DemoTopic", q) for q in range(queues))
        table.add_row("reopen after crash (abnormal recovery)", f"{total:,} msgs kept", f"{dt * 1000:,.0f} ms")
        store.shutdown()
        console.print(table)
        ok = got == messages and total == messages and len(found) == 1
        console.print("[bold green]OK[/]" if ok else "[bold red]MISMATCH[/]")
        if not ok:
            raise SystemExit(1)
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
