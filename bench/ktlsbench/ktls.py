"""Scenario ktls (VM): 32 MiB downloads from ktlsd kTLS, ktlsd userspace and every selected peer
that has kTLS (nginx, lighttpd: OpenSSL's KTLS option); with --http2, one h2load stream per fresh
connection instead of curl. Peers without kTLS are listed as such. The crypto limit: the
kernel's AES-GCM as kTLS uses it, and aws-lc-rs's in user space, measured in the same guest."""

import os
import random

from . import crypto, peers
from .clients import download_runs, h2_download
from .servers import Ktlsd, require_ktls
from .stats import median
from .system import cpu_seconds, log, make_file, tls_tx_contexts


KTLS_BENCH_SIZE = 32 << 20


def ktls_servers(args, work, http2=False):
    """The kTLS scenarios' servers, serving www/32m.bin: ktlsd with kTLS, ktlsd in user
    space, and the peers with kTLS (HTTP/2 on when `http2`); returns (servers, {peer: why not})."""
    root = os.path.join(work, "www")
    os.makedirs(root)
    make_file(os.path.join(root, "32m.bin"), KTLS_BENCH_SIZE)
    ours = [Ktlsd("ktlsd-ktls", args.ktlsd, root, 18443, work, ["--ktls", "on"]),
            Ktlsd("ktlsd-userspace", args.ktlsd, root, 18444, work, ["--ktls", "off"])]
    try:
        others, missing = peers.start_peers(root, work, 18445, suffix="-ktls", need_ktls=True, ktls=True, http2=http2)
    except Exception:
        for s in ours:
            s.stop()
        raise
    return ours + others, missing


def ktls_report(args, work, head, res, missing, digits):
    """The kTLS scenarios' table (a row per server with the kTLS transmit contexts its
    connections installed, peers without kTLS as such), ktlsd kTLS's CPU s/GiB against ktlsd
    userspace and each peer, and the crypto limit measured now."""
    cpu = {n: median(v["cpu_per_gib"]) for n, v in res.items()}
    spd = {n: median(v["speed"]) for n, v in res.items()}
    tx = {n: "?" if None in v["ktls_tx"] else f"{sum(v['ktls_tx'])}/{len(v['ktls_tx'])}" for n, v in res.items()}
    table = [head, "|---|---|---|---|"]
    table += [f"| {n} | {spd[n]:.1f} | {cpu[n]:.{digits}f} | {tx[n]} |" for n in spd]
    table += [f"| {n} | n/a ({why}) | - | - |" for n, why in missing.items()]
    goal_us, goal_peer = (0.8, 0.9) if args.http2 else (0.75, 1.0)
    table += ["", f"ktlsd kTLS CPU/GiB vs ktlsd userspace: {cpu['ktlsd-ktls'] / cpu['ktlsd-userspace']:.2f}x "
                  f"(goal <= {goal_us}x)"]
    for n in list(spd)[2:]:
        table.append(f"ktlsd kTLS CPU/GiB vs {n}: {cpu['ktlsd-ktls'] / cpu[n]:.2f}x"
                     + (f" (goal <= {goal_peer}x)" if n == "nginx-ktls" else ""))
    table += [f"ktlsd kTLS CPU/GiB vs {n}: n/a ({why})" for n, why in missing.items()]
    aead, floor = crypto.userspace_limits(args, work)
    kernel = crypto.kernel_ktls_limit(work, args.aead_seconds)
    kernel_servers = [n for n in cpu if n != "ktlsd-userspace"]
    table.append(crypto.limit_lines(aead, kernel, cpu, kernel_servers, floor))
    return "\n".join(table), {"aead_limit": aead, "kernel_ktls_limit": kernel, "socket_floor": floor}


def scenario_ktls(args, work):
    size = KTLS_BENCH_SIZE
    servers, missing = ktls_servers(args, work)
    try:
        log(f"download: 32 MiB x {args.runs} runs each, interleaved")
        dl = download_runs(servers, "32m.bin", size, args.runs)
    finally:
        for s in servers:
            s.stop()
    require_ktls(work, ["ktlsd-ktls"])
    head = "| server | download MB/s (median) | server CPU s/GiB (median) | kTLS TX contexts / connections |"
    table, limit = ktls_report(args, work, head, dl, missing, 2)
    return table, {"download": dl, **limit}


def scenario_ktls_h2(args, work):
    """The kTLS scenario over HTTP/2: one 32 MiB stream per connection (h2load)."""
    size = KTLS_BENCH_SIZE
    servers, missing = ktls_servers(args, work, http2=True)
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
    head = ("| server (HTTP/2, h2load -n1 -c1) | download MB/s (median) | server CPU s/GiB (median) | "
            "kTLS TX contexts / connections |")
    table, limit = ktls_report(args, work, head, res, missing, 3)
    return table, {"download": res, **limit}
