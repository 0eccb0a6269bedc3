"""Scenario h2 (this machine): the throughput scenario over HTTP/2 with h2load, every peer with
HTTP/2 on (nginx `listen ... ssl http2`), and the crypto limit (AEAD alone) in the same run."""

import random

from . import crypto, peers
from .clients import h2load
from .stats import median, size_name, versus_table
from .system import children_cpu_seconds, cpu_seconds, log
from .throughput import client_line, download_servers, peer_values


def scenario_h2(args, work):
    servers, missing, big = download_servers(args, work, http2=True)
    res = {s.name: {"rps": [], "us": [], "client": [], "client_bulk": [], "speed": [], "cpu_per_gib": []} for s in servers}
    try:
        for i in range(args.runs):
            for s in random.sample(servers, len(servers)):
                url = f"https://127.0.0.1:{s.port}/"
                c0, w0 = cpu_seconds(s.pids()), children_cpu_seconds()
                secs, done, _ = h2load(["-c16", "-m32", f"-D{args.duration}", url + "10k.bin"])
                res[s.name]["rps"].append(done / secs)
                res[s.name]["us"].append((cpu_seconds(s.pids()) - c0) * 1e6 / done)
                res[s.name]["client"].append((children_cpu_seconds() - w0) / secs)
                c0, w0 = cpu_seconds(s.pids()), children_cpu_seconds()
                secs, _, _ = h2load(["-n1", "-c1", url + "big.bin"])
                c1 = cpu_seconds(s.pids())
                res[s.name]["client_bulk"].append((children_cpu_seconds() - w0) / secs)
                res[s.name]["speed"].append(big / secs / 1e6)
                res[s.name]["cpu_per_gib"].append((c1 - c0) / (big / (1 << 30)))
            log(f"  run {i + 1}/{args.runs}: " + ", ".join(
                f"{n} {v['rps'][-1]:.0f} req/s {v['speed'][-1]:.0f} MB/s {v['cpu_per_gib'][-1]:.2f} s/GiB"
                for n, v in res.items()))
    finally:
        for s in servers:
            s.stop()
    # h2load fails unless ALPN chose h2, so every number above is HTTP/2.
    aead, floor = crypto.userspace_limits(args, work)
    k = res["ktlsd"]
    rows = [
        (f"10 KiB h2load -c16 -m32 -D{args.duration}, median req/s", median(k["rps"]),
         peer_values(res, "rps", missing), ">= 1.2"),
        ("server CPU us per 10 KiB request (same runs), median", median(k["us"]), peer_values(res, "us", missing),
         "<= 0.83"),
        (f"{size_name(big)} single stream h2load -n1 -c1, median MB/s", median(k["speed"]),
         peer_values(res, "speed", missing), ">= 1.0"),
        ("server CPU s per GiB, median", median(k["cpu_per_gib"]), peer_values(res, "cpu_per_gib", missing), "<= 1.0"),
    ]
    cpu = {"ktlsd": median(k["cpu_per_gib"]), **peer_values(res, "cpu_per_gib", missing)}
    table = versus_table(rows, peers.PEERS, "measure (HTTP/2)") + "\n"
    table += client_line("h2load -t1", {n: v["client"] for n, v in res.items()})
    table += ("The client's CPU in the single-stream downloads, median cores: "
              + ", ".join(f"{n} {median(v['client_bulk']):.2f}" for n, v in res.items()) + ".\n\n")
    table += crypto.limit_lines(aead, None, cpu, floor=floor)
    return table, {**res, "aead_limit": aead, "socket_floor": floor}
