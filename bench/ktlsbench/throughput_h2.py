"""Scenario h2 (this machine): the throughput scenario over HTTP/2 with h2load, nginx with
`listen ... ssl http2`."""

import os
import random

from .clients import h2load
from .stats import median, size_name, versus_table
from .system import cpu_seconds, log
from .throughput import download_servers


def scenario_h2(args, work):
    servers, big = download_servers(args, work, http2=True)
    res = {s.name: {"rps": [], "speed": [], "cpu_per_gib": []} for s in servers}
    try:
        for i in range(args.runs):
            for s in random.sample(servers, len(servers)):
                url = f"https://127.0.0.1:{s.port}/"
                secs, done, _ = h2load(["-c16", "-m32", f"-D{args.duration}", url + "10k.bin"])
                res[s.name]["rps"].append(done / secs)
                c0 = cpu_seconds(s.pids())
                secs, _, _ = h2load(["-n1", "-c1", url + "big.bin"])
                c1 = cpu_seconds(s.pids())
                res[s.name]["speed"].append(big / secs / 1e6)
                res[s.name]["cpu_per_gib"].append((c1 - c0) / (big / (1 << 30)))
            log(f"  run {i + 1}/{args.runs}: " + ", ".join(
                f"{n} {v['rps'][-1]:.0f} req/s {v['speed'][-1]:.0f} MB/s {v['cpu_per_gib'][-1]:.2f} s/GiB"
                for n, v in res.items()))
    finally:
        for s in servers:
            s.stop()
    for s in servers[:1]:
        with open(os.path.join(work, f"{s.name}.access")) as f:
            if not any("HTTP/2.0" in l for l in f):
                raise RuntimeError(f"{s.name} served no request over HTTP/2")
    k, n = res["ktlsd"], res["nginx"]
    rows = [
        (f"10 KiB h2load -c16 -m32 -D{args.duration}, median req/s", median(k["rps"]), median(n["rps"]), ">= 1.2"),
        (f"{size_name(big)} single stream h2load -n1 -c1, median MB/s", median(k["speed"]), median(n["speed"]), ">= 1.0"),
        ("server CPU s per GiB, median", median(k["cpu_per_gib"]), median(n["cpu_per_gib"]), "<= 1.0"),
    ]
    return versus_table(rows, "measure (HTTP/2)"), res
