"""Benchmarks of the egress proxy against direct connections to the same loopback server.

Measured (candidate and baseline interleaved in ABBA order, in the same run):

1. Throughput of a 100 MB download (`GET /bytes/N`, `Connection: close`) through the
   proxy, as plain HTTP in absolute form and through a CONNECT tunnel, against the same
   download straight from the server. Goal: at least 50% of the direct speed.
2. Latency of a small request (a 100-byte body), from `connect()` to the server's close,
   through the proxy (plain HTTP and CONNECT) against direct: the median of many, and the
   difference, which is what the proxy adds per request (accept, parse, policy decision,
   resolver, upstream connect, relay).

The server and the client are separate processes (as the remote site and the sandboxed
child are in real use), so they do not share this process's interpreter lock with the
proxy; the proxy runs here, on a listener this script hands to `EgressProxy.serve`, with
the test-only resolver mapping `bench.test` to 127.0.0.1. Why ratios: absolute figures
depend on the machine; each is reported against a baseline measured in the same run.

Run: `.venv/bin/python benchmarks/bench_egress.py [--json] [--mb 100] [-n 10] [--small 200]`.
Everything binds 127.0.0.1 and is stopped at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

try:
    import sandbox_kernel_ext  # noqa: F401
except ImportError:  # run from a checkout without the package installed
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import fmt_ns
from sandbox_kernel_ext.policy.egress import EgressFilter
from sandbox_kernel_ext.policy.models import NetworkEgressRule
from sandbox_kernel_ext.runner.trusted.egress_proxy import EgressProxy

PYTHON = os.path.realpath(sys.executable)
SMALL_BYTES = 100
MODES = {"http": "plain HTTP", "connect": "CONNECT tunnel"}

# Answers `GET /bytes/N` with N bytes and closes; prints its port, then serves until stdin
# closes.
SERVER = r"""
import socket, sys, threading
CHUNK = memoryview(bytes(range(256)) * 4096)  # 1 MiB
def serve(conn):
    with conn:
        head = b""
        while b"\r\n\r\n" not in head:
            data = conn.recv(65536)
            if not data:
                return
            head += data
        size = int(head.split(b" ", 2)[1].rsplit(b"/", 1)[1])
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % size)
        while size > 0:
            size -= conn.send(CHUNK[: min(size, len(CHUNK))])
def accept(listener):
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        threading.Thread(target=serve, args=(conn,), daemon=True).start()
listener = socket.create_server(("127.0.0.1", 0), backlog=128)
print(listener.getsockname()[1], flush=True)
threading.Thread(target=accept, args=(listener,), daemon=True).start()
sys.stdin.read()
"""

# Reads "MODE SIZE" lines (MODE: direct, http, connect) and answers "NS BYTES": the time
# from connect() to the server's close, and the bytes of the response (head included).
CLIENT = r"""
import socket, sys, time
server_port, proxy_port = int(sys.argv[1]), int(sys.argv[2])
buffer = bytearray(1 << 20)
view = memoryview(buffer)
def fetch(mode, size):
    t0 = time.perf_counter_ns()
    port = server_port if mode == "direct" else proxy_port
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    target = f"/bytes/{size}"
    if mode == "http":
        target = f"http://bench.test:{server_port}{target}"
    elif mode == "connect":
        sock.sendall(f"CONNECT bench.test:{server_port} HTTP/1.1\r\n\r\n".encode())
        reply = b""
        while b"\r\n\r\n" not in reply:
            reply += sock.recv(4096)
        assert reply.startswith(b"HTTP/1.1 200"), reply
        assert reply.endswith(b"\r\n\r\n"), reply
    sock.sendall(f"GET {target} HTTP/1.1\r\nHost: bench.test\r\nConnection: close\r\n\r\n".encode())
    total = 0
    while count := sock.recv_into(view):
        total += count
    sock.close()
    return time.perf_counter_ns() - t0, total
for line in sys.stdin:
    mode, size = line.split()
    ns, total = fetch(mode, int(size))
    print(ns, total, flush=True)
"""


class Client:
    """The client process: one fetch per request line."""

    def __init__(self, server_port: int, proxy_port: int) -> None:
        self.proc = subprocess.Popen(
            [PYTHON, "-I", "-c", CLIENT, str(server_port), str(proxy_port)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip

    def fetch(self, mode: str, size: int) -> int:
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(f"{mode} {size}\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the client process died fetching {mode} {size}")
        ns, total = map(int, line.split())
        if total < size:
            raise RuntimeError(f"{mode}: got {total} bytes for a {size}-byte body")
        return ns

    def close(self) -> None:
        stop(self.proc)


def stop(proc: subprocess.Popen) -> None:
    if proc.stdin:
        proc.stdin.close()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if proc.stdout:
        proc.stdout.close()


def abba(candidate: Callable[[], None], baseline: Callable[[], None], rounds: int) -> None:
    """Alternate candidate and baseline so that neither always goes first."""
    for i in range(rounds):
        first, second = (candidate, baseline) if i % 2 == 0 else (baseline, candidate)
        first()
        second()


def measure(client: Client, mode: str, size: int, rounds: int) -> tuple[list[int], list[int]]:
    ours: list[int] = []
    direct: list[int] = []
    client.fetch(mode, size)  # warm-up
    client.fetch("direct", size)
    abba(lambda: ours.append(client.fetch(mode, size)),
         lambda: direct.append(client.fetch("direct", size)), rounds)  # fmt: skip
    return ours, direct


def spread(samples: list[float]) -> dict:
    ordered = sorted(samples)
    return {"median": round(statistics.median(ordered), 3), "min": round(ordered[0], 3),
            "max": round(ordered[-1], 3), "n": len(ordered)}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--mb", type=int, default=100, help="download size in MB (default 100)")
    parser.add_argument("-n", "--runs", type=int, default=10,
                        help="interleaved rounds of the download (default 10)")  # fmt: skip
    parser.add_argument("--small", type=int, default=200,
                        help="interleaved rounds of the small request (default 200)")  # fmt: skip
    args = parser.parse_args()
    started = time.monotonic()
    size = args.mb * 1_000_000
    server = subprocess.Popen([PYTHON, "-I", "-c", SERVER], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    rule = NetworkEgressRule(
        domain="bench.test", private_networks=["127.0.0.1/32"], rate_limit_per_min=10**9
    )
    decisions: list[dict] = []
    proxy = EgressProxy(
        EgressFilter([rule]), sandbox_id="bench", on_decision=decisions.append,
        resolver=lambda host, port: ["127.0.0.1"],
    )  # fmt: skip
    client = None
    try:
        assert server.stdout
        server_port = int(server.stdout.readline())
        listener = socket.create_server(("127.0.0.1", 0), backlog=128)
        proxy.serve(listener)
        client = Client(server_port, listener.getsockname()[1])
        rows, detail = [], {}
        for mode in ("http", "connect"):
            ours, direct = measure(client, mode, size, args.runs)
            speed = size / statistics.median(ours) * 1e3  # bytes/ns * 1e3 = MB/s
            base = size / statistics.median(direct) * 1e3
            rows.append({
                "measure": f"{args.mb} MB download, {MODES[mode]}",
                "unit": "MB/s", "ours": round(speed, 1), "baseline": round(base, 1),
                "ratio": round(speed / base, 2), "goal": ">= 0.50x", "met": speed / base >= 0.5,
            })  # fmt: skip
            detail[f"download_{mode}_ms"] = {
                "ours": spread([x / 1e6 for x in ours]), "direct": spread([x / 1e6 for x in direct])
            }
        for mode in ("http", "connect"):
            ours, direct = measure(client, mode, SMALL_BYTES, args.small)
            median, base = statistics.median(ours), statistics.median(direct)
            rows.append({
                "measure": f"small request, {MODES[mode]}",
                "unit": "ns", "ours": round(median), "baseline": round(base),
                "ratio": round(median / base, 2), "goal": "info", "met": None,
                "added_ns": round(median - base),
            })  # fmt: skip
            detail[f"small_{mode}_us"] = {"ours": spread([x / 1e3 for x in ours]),
                                          "direct": spread([x / 1e3 for x in direct])}  # fmt: skip
        counts = proxy.counts
    finally:
        if client is not None:
            client.close()
        proxy.close()
        stop(server)
    result = {
        "python": platform.python_version(), "platform": platform.platform(),
        "cpus": os.cpu_count(), "rows": rows, "detail": detail, "proxy_counts": counts,
        "runtime_s": round(time.monotonic() - started, 1),
    }  # fmt: skip
    if args.json:
        print(json.dumps(result, indent=2, ensure_ascii=False))
        return 0
    print(f"Python {result['python']} on {result['platform']}, {result['cpus']} CPUs")
    print()
    print_table(rows)
    print()
    for row in rows:
        if "added_ns" in row:
            print(f"added per request, {row['measure'].split(', ')[1]}: {fmt_ns(row['added_ns'])}")
    print(f"proxy decisions: {counts}; runtime {result['runtime_s']} s")
    return 0


def print_table(rows: list[dict]) -> None:
    def shown(value: float, unit: str) -> str:
        return f"{value:,.1f} MB/s" if unit == "MB/s" else fmt_ns(value)

    headers = ("measure", "proxy", "direct", "ratio", "goal", "met")
    lines = [
        (row["measure"], shown(row["ours"], row["unit"]), shown(row["baseline"], row["unit"]),
         f"{row['ratio']:.2f}x", row["goal"],
         "-" if row["met"] is None else ("yes" if row["met"] else "NO"))
        for row in rows
    ]  # fmt: skip
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(headers)]

    def cells(values: tuple[str, ...]) -> str:
        return "| " + " | ".join(
            f"{v:<{w}}" if i in (0, 4) else f"{v:>{w}}"
            for i, (v, w) in enumerate(zip(values, widths))
        ) + " |"

    print(cells(headers))
    print("|" + "|".join("-" * (w + 2) if i in (0, 4) else "-" * (w + 1) + ":"
                         for i, w in enumerate(widths)) + "|")  # fmt: skip
    for line in lines:
        print(cells(line))


if __name__ == "__main__":
    sys.exit(main())
