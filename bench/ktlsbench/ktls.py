"""Scenario ktls (VM): 32 MiB downloads from ktlsd kTLS, ktlsd userspace and nginx kTLS; with
--http2, one h2load stream per fresh connection instead of curl."""

import os
import random

from .clients import download_runs, h2_download
from .peers import Nginx
from .servers import Ktlsd, require_ktls
from .stats import median
from .system import cpu_seconds, log, make_file, tls_tx_contexts


KTLS_BENCH_SIZE = 32 << 20


def ktls_servers(args, work, http2=False):
    """The kTLS scenarios' servers, serving www/32m.bin: ktlsd with kTLS, ktlsd in user
    space, nginx with kTLS (with `http2` on its listen line when `http2`)."""
    root = os.path.join(work, "www")
    os.makedirs(root)
    make_file(os.path.join(root, "32m.bin"), KTLS_BENCH_SIZE)
    return [
        Ktlsd("ktlsd-ktls", args.ktlsd, root, 18443, work, ["--ktls", "on"]),
        Ktlsd("ktlsd-userspace", args.ktlsd, root, 18444, work, ["--ktls", "off"]),
        Nginx("nginx-ktls", root, 18445, work, ktls=True, http2=http2),
    ]


def scenario_ktls(args, work):
    size = KTLS_BENCH_SIZE
    servers = ktls_servers(args, work)
    try:
        log(f"download: 32 MiB x {args.runs} runs each, interleaved")
        dl = download_runs(servers, "32m.bin", size, args.runs)
    finally:
        for s in servers:
            s.stop()
    require_ktls(work, ["ktlsd-ktls"])
    cpu = {n: median(v["cpu_per_gib"]) for n, v in dl.items()}
    spd = {n: median(v["speed"]) for n, v in dl.items()}
    table = ["| server | download MB/s (median) | server CPU s/GiB (median) |", "|---|---|---|"]
    table += [f"| {n} | {spd[n]:.1f} | {cpu[n]:.2f} |" for n in spd]
    table += ["", f"ktlsd kTLS CPU/GiB vs ktlsd userspace: {cpu['ktlsd-ktls'] / cpu['ktlsd-userspace']:.2f}x (goal <= 0.75x)",
              f"ktlsd kTLS CPU/GiB vs nginx kTLS: {cpu['ktlsd-ktls'] / cpu['nginx-ktls']:.2f}x (goal <= 1.0x)"]
    return "\n".join(table), {"download": dl}


def scenario_ktls_h2(args, work):
    """The kTLS scenario over HTTP/2: one 32 MiB stream per connection (h2load)."""
    size = KTLS_BENCH_SIZE
    servers = ktls_servers(args, work, http2=True)
    res = {s.name: {"speed": [], "cpu_per_gib": [], "ktls_tx": []} for s in servers}
    try:
        log(f"HTTP/2 download: 32 MiB x {args.runs} runs each, interleaved")
        for i in range(args.runs):
            for s in random.sample(servers, len(servers)):
                t0, c0 = tls_tx_contexts(), cpu_seconds(s.pids())
                secs, got = h2_download(s.port, "32m.bin")
                c1, t1 = cpu_seconds(s.pids()), tls_tx_contexts()
                if got != size:
                    raise RuntimeError(f"{s.name}: got {got} bytes of {size}")
                res[s.name]["speed"].append(size / secs / 1e6)
                res[s.name]["cpu_per_gib"].append((c1 - c0) / (size / (1 << 30)))
                res[s.name]["ktls_tx"].append(None if t0 is None else t1 - t0)
            log(f"  run {i + 1}/{args.runs}: " + ", ".join(
                f"{n} {v['speed'][-1]:.0f} MB/s {v['cpu_per_gib'][-1]:.2f} s/GiB kTLS TX {v['ktls_tx'][-1]}"
                for n, v in res.items()))
    finally:
        for s in servers:
            s.stop()
    require_ktls(work, ["ktlsd-ktls"])
    for name in ("ktlsd-ktls", "ktlsd-userspace"):
        with open(os.path.join(work, f"{name}.access")) as f:
            lines = [l for l in f if "32m.bin" in l]
        if len(lines) != args.runs or not all(" HTTP/2.0\" 200 " in l for l in lines):
            raise RuntimeError(f"{name}: expected {args.runs} HTTP/2.0 200 lines, got:\n{''.join(lines)}")
    cpu = {n: median(v["cpu_per_gib"]) for n, v in res.items()}
    spd = {n: median(v["speed"]) for n, v in res.items()}
    tx = {n: "?" if None in v["ktls_tx"] else f"{sum(v['ktls_tx'])}/{len(v['ktls_tx'])}" for n, v in res.items()}
    table = ["| server (HTTP/2, h2load -n1 -c1) | download MB/s (median) | server CPU s/GiB (median) | kTLS TX contexts / connections |",
             "|---|---|---|---|"]
    table += [f"| {n} | {spd[n]:.1f} | {cpu[n]:.3f} | {tx[n]} |" for n in spd]
    table += ["", f"ktlsd kTLS CPU/GiB vs ktlsd userspace: {cpu['ktlsd-ktls'] / cpu['ktlsd-userspace']:.2f}x (goal <= 0.8x)",
              f"ktlsd kTLS CPU/GiB vs nginx kTLS: {cpu['ktlsd-ktls'] / cpu['nginx-ktls']:.2f}x (goal <= 0.9x)"]
    return "\n".join(table), {"download": res}
