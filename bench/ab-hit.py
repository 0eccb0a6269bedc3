#!/usr/bin/python3
"""Server CPU per 10 KiB cache hit (HTTP/1.1), two or more ktlsd binaries side by side:
for each round the binaries run in a random order, each started fresh behind the proxy
scenario's origin and configuration (bench/ktlsbench/proxy.py: 2 workers, access log off),
warmed, then `wrk -t1 -c64` on the hit for DUR seconds (default 4) while `perf stat -e
task-clock` counts the server's CPU. Prints each run, each binary's median, and the median
of the per-round ratios against the first binary (pairs share the round's conditions).

    bench/ab-hit.py NAME=BINARY NAME=BINARY... [ROUNDS=14 DUR=4 in the environment]
"""
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ktlsbench import proxy, servers  # noqa: E402
from ktlsbench.servers import Ktlsd  # noqa: E402
from ktlsbench.system import make_file  # noqa: E402

bins = dict(a.split("=", 1) for a in sys.argv[1:])
if len(bins) < 2:
    sys.exit(__doc__)
rounds, dur = int(os.environ.get("ROUNDS", "14")), os.environ.get("DUR", "4")
work = tempfile.mkdtemp()
servers.WORKERS = 2
servers.make_cert(work)
root, oroot = os.path.join(work, "www"), os.path.join(work, "origin")
for d in ("cache", "pass", "slow"):
    os.makedirs(os.path.join(oroot, d))
    make_file(os.path.join(oroot, d, "10k.bin"), 10 * 1024)
os.makedirs(root)
origin = proxy.Origin("origin", oroot, proxy.ORIGIN_PORT, work)
res = {k: [] for k in bins}
try:
    for rnd in range(rounds):
        for name, b in random.sample(list(bins.items()), len(bins)):
            w = os.path.join(work, f"{name}{rnd}")
            os.makedirs(w)
            k = Ktlsd("ktlsd", b, root, proxy.KTLSD_PORT, w, ["--config", proxy.ktlsd_config(w)])
            try:
                proxy.warm(k, "cache-status", lambda v: v.startswith("ktlsd; hit"))
                out_perf = os.path.join(w, "perf.txt")
                perf = subprocess.Popen(["perf", "stat", "-x,", "-e", "task-clock", "-p",
                                         ",".join(map(str, k.pids())), "-o", out_perf])
                time.sleep(0.3)
                out = subprocess.run(["wrk", "-t1", "-c64", f"-d{dur}s", f"https://127.0.0.1:{k.port}/cache/10k.bin"],
                                     capture_output=True, text=True).stdout
                perf.send_signal(2)
                perf.wait()
                n = int(re.search(r"(\d+) requests in", out).group(1))
                ms = float(re.search(r"^([\d.]+),msec,task-clock", open(out_perf).read(), re.M).group(1))
                res[name].append(ms * 1000 / n)
                print(f"{name} round {rnd}: {ms * 1000 / n:.2f} us/hit ({n} hits)", flush=True)
            finally:
                k.stop()
finally:
    origin.stop()
names = list(bins)
for name, v in res.items():
    print(f"{name}: median {statistics.median(v):.2f} us/hit")
for n in names[1:]:
    r = [a / b for a, b in zip(res[n], res[names[0]])]
    print(f"{n}/{names[0]}: median of per-round ratios {statistics.median(r):.3f} ({' '.join(f'{x:.2f}' for x in r)})")
