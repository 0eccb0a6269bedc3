"""Scenario throughput (this machine): 1 GiB single-connection downloads with curl (speed, server
CPU s/GiB) and a 10 KiB file with wrk over 64 keep-alive connections, ktlsd against nginx."""

import os
import random

from .clients import download_runs, wrk_rps
from .servers import Ktlsd, Nginx
from .stats import median, size_name, versus_table
from .system import log, make_file


def download_servers(args, work, http2=False):
    """ktlsd and nginx over a root holding big.bin (1 GiB, 64 MiB with --quick) and
    10k.bin, for the download scenarios; returns (servers, big's size)."""
    root = os.path.join(work, "www")
    os.makedirs(root)
    big = 1 << 30 if not args.quick else 64 << 20
    make_file(os.path.join(root, "big.bin"), big)
    make_file(os.path.join(root, "10k.bin"), 10 * 1024)
    extra = ["--record-size", args.record_size] if args.record_size else []
    return [Ktlsd("ktlsd", args.ktlsd, root, 18443, work, extra), Nginx("nginx", root, 18444, work, http2=http2)], big


def scenario_throughput(args, work):
    servers, big = download_servers(args, work)
    try:
        log(f"download: {big >> 20} MiB x {args.runs} runs each, interleaved")
        dl = download_runs(servers, "big.bin", big, args.runs)
        rps = {s.name: [] for s in servers}
        rounds = max(1, args.runs // 3)
        for i in range(rounds):
            for s in random.sample(servers, len(servers)):
                rps[s.name].append(wrk_rps(s, "10k.bin", 64, args.duration, threads=1)[0])
            log(f"  wrk round {i + 1}/{rounds}: " + ", ".join(f"{n} {v[-1]:.0f} req/s" for n, v in rps.items()))
    finally:
        for s in servers:
            s.stop()
    k, n = dl["ktlsd"], dl["nginx"]
    rows = [
        (f"{size_name(big)} download speed, median MB/s", median(k["speed"]), median(n["speed"]), ">= 1.0"),
        ("server CPU s per GiB, median", median(k["cpu_per_gib"]), median(n["cpu_per_gib"]), "<= 1.0"),
        (f"10 KiB wrk -c64 {args.duration}s, median req/s", median(rps["ktlsd"]), median(rps["nginx"]), ">= 1.2"),
    ]
    return versus_table(rows), {"download": dl, "wrk": rps}
