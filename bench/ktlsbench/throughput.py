"""Scenario throughput (this machine): 1 GiB single-connection HTTP/1.1 downloads with curl
(speed, server CPU s/GiB) and a 10 KiB file with wrk over 64 keep-alive connections, ktlsd
against every selected peer, and the crypto limit (AEAD alone) measured in the same run."""

import os
import random

from . import crypto, peers
from .clients import download_runs, wrk_rps
from .servers import Ktlsd
from .stats import median, size_name, versus_table
from .system import log, make_file


def download_servers(args, work, http2=False):
    """ktlsd and the peers over a root holding big.bin (1 GiB, 64 MiB with --quick) and
    10k.bin, for the download scenarios; returns (servers, {peer: why it cannot run}, big's size)."""
    root = os.path.join(work, "www")
    os.makedirs(root)
    big = 1 << 30 if not args.quick else 64 << 20
    make_file(os.path.join(root, "big.bin"), big)
    make_file(os.path.join(root, "10k.bin"), 10 * 1024)
    extra = ["--record-size", args.record_size] if args.record_size else []
    ktlsd = Ktlsd("ktlsd", args.ktlsd, root, 18443, work, extra)
    try:
        others, missing = peers.start_peers(root, work, 18444, http2=http2)
    except Exception:
        ktlsd.stop()
        raise
    return [ktlsd, *others], missing, big


def peer_values(res, key, missing, reduce=median):
    """{peer: reduce(res[peer][key])} for the peers that ran, and why not for the others."""
    return {**missing, **{n: reduce(v[key]) for n, v in res.items() if n != "ktlsd"}}


def scenario_throughput(args, work):
    servers, missing, big = download_servers(args, work)
    try:
        log(f"download: {big >> 20} MiB x {args.runs} runs each, interleaved")
        dl = download_runs(servers, "big.bin", big, args.runs)
        rps, us, client = ({s.name: [] for s in servers} for _ in range(3))
        rounds = max(1, args.runs // 3)
        for i in range(rounds):
            for s in random.sample(servers, len(servers)):
                r, u = wrk_rps(s, "10k.bin", 64, args.duration, threads=1, client=client[s.name])
                rps[s.name].append(r)
                us[s.name].append(u)
            log(f"  wrk round {i + 1}/{rounds}: " + ", ".join(f"{n} {v[-1]:.0f} req/s" for n, v in rps.items()))
    finally:
        for s in servers:
            s.stop()
    aead, floor = crypto.userspace_limits(args, work)
    k = dl["ktlsd"]
    rows = [
        (f"{size_name(big)} download speed, median MB/s", median(k["speed"]), peer_values(dl, "speed", missing), ">= 1.0"),
        ("server CPU s per GiB, median", median(k["cpu_per_gib"]), peer_values(dl, "cpu_per_gib", missing), "<= 1.0"),
        (f"10 KiB wrk -c64 {args.duration}s, median req/s", median(rps["ktlsd"]),
         {**missing, **{n: median(v) for n, v in rps.items() if n != "ktlsd"}}, ">= 1.2"),
        ("server CPU us per 10 KiB request (same rounds), median", median(us["ktlsd"]),
         {**missing, **{n: median(v) for n, v in us.items() if n != "ktlsd"}}, "<= 0.83"),
    ]
    cpu = {"ktlsd": median(k["cpu_per_gib"]), **peer_values(dl, "cpu_per_gib", missing)}
    table = versus_table(rows, peers.PEERS) + "\n" + client_line("wrk -t1", client)
    table += ("The client's CPU in the downloads (curl: one thread), median cores: "
              + ", ".join(f"{n} {median(v['client_cores']):.2f}" for n, v in dl.items()) + ".\n\n")
    table += crypto.limit_lines(aead, None, cpu, floor=floor)
    return table, {"download": dl, "wrk": rps, "wrk_server_us": us, "wrk_client_cores": client,
                   "aead_limit": aead, "socket_floor": floor}


def client_line(name, client):
    """Says how much of its one thread the client used in the request-rate rounds: near 1.00,
    the client set the rate, and the servers' CPU per request tells them apart instead."""
    return (f"\nThe client's CPU in the 10 KiB rounds ({name}: one thread, so 1.00 core is its limit), "
            "median cores: " + ", ".join(f"{n} {median(v):.2f}" for n, v in client.items()) + ".\n")
