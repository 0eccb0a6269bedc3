"""Scenario tail (VM): cold connections over netem delay and loss, TTFB and total time per
record-size policy and each selected peer (with kTLS where it has it), for 10 KB, 100 KB and 1 MB
files; the report (table, ratios with bootstrap intervals, chart) can be rebuilt from its CSV."""

import collections
import concurrent.futures
import csv
import os
import random
import re
import subprocess
import time

from . import peers, plots, tail_h3
from .servers import Ktlsd, require_ktls
from .stats import pct, ratio_ci
from .system import backlog_drops, cpu_seconds, log, make_file, sh, tcp_ext, tcp_retransmits


TAIL_CONDITIONS = [
    ("static:16k", ["--record-size", "static:16k"]),
    ("static:4k", ["--record-size", "static:4k"]),
    ("dynamic", ["--record-size", "dynamic"]),
    ("dynamic-tuned", ["--record-size", "dynamic:hi=16384,threshold=10"]),
    ("adaptive", ["--record-size", "adaptive"]),
]
TAIL_SIZES = {"10KB": 10_000, "100KB": 100_000, "1MB": 1_000_000}
CURL_FIELDS = "%{http_code} %{size_download} %{num_connects} %{time_starttransfer} %{time_total}\\n"


def tail_batch(jobs, resolve):
    """One curl process fetches `jobs` [(server, size)] in order, each on a new
    connection with a full handshake (`Connection: close`, no TLS session reuse),
    so a batch costs one process start instead of one per connection."""
    cmd = ["curl", "-sk", "--http1.1", "--no-sessionid", "-H", "Connection: close", "--max-time", "60",
           "-w", CURL_FIELDS, *resolve]
    for s, size in jobs:
        cmd += ["-o", "/dev/null", f"https://localhost:{s.port}/{size}"]
    out = tail_h3.run_timed(cmd, "h1", len(jobs), 3600)[1].splitlines()
    if len(out) != len(jobs):
        raise RuntimeError(f"curl reported {len(out)} of {len(jobs)} transfers")
    rows = []
    for (s, size), line in zip(jobs, out):
        code, got, connects, ttfb, total = line.split()
        if code != "200" or int(got) != TAIL_SIZES[size] or connects != "1":
            raise RuntimeError(f"{s.name} {size}: HTTP {code}, {got} bytes, {connects} new connections")
        rows.append((s.name, size, float(ttfb) * 1000, float(total) * 1000))
    return rows


def tail_batch_h2(jobs, resolve):
    """tail_batch over HTTP/2: curl keeps an h2 connection for every later request
    to the same host and ignores `Connection: close`, so each job gets a host name
    of its own (resolved to 127.0.0.1) and with it a new connection and a full
    handshake."""
    del resolve  # one name per job instead
    cmd = ["curl", "-sk", "--http2", "--no-sessionid", "--max-time", "60",
           "-w", "%{http_version} " + CURL_FIELDS]
    for i, (s, size) in enumerate(jobs):
        host = f"c{i}.localhost"
        cmd += ["--resolve", f"{host}:{s.port}:127.0.0.1", "-o", "/dev/null", f"https://{host}:{s.port}/{size}"]
    out = tail_h3.run_timed(cmd, "h2", len(jobs), 3600)[1].splitlines()
    if len(out) != len(jobs):
        raise RuntimeError(f"curl reported {len(out)} of {len(jobs)} transfers")
    rows = []
    for (s, size), line in zip(jobs, out):
        version, code, got, connects, ttfb, total = line.split()
        if version != "2" or code != "200" or int(got) != TAIL_SIZES[size] or connects != "1":
            raise RuntimeError(f"{s.name} {size}: HTTP/{version} {code}, {got} bytes, {connects} new connections")
        rows.append((s.name, size, float(ttfb) * 1000, float(total) * 1000))
    return rows


Cond = collections.namedtuple("Cond", "name port proto")


def scenario_tail(args, work):
    """The plan at each loss rate of `--loss` (a comma-separated list; with more than one, each
    rate's CSV and chart go under OUT/loss-RATE/)."""
    losses = [x for x in args.loss.split(",") if x]
    out, tables, raw = args.out, [], {}
    for loss in losses:
        args.out = out if len(losses) == 1 else os.path.join(out, f"loss-{loss.rstrip('%')}")
        os.makedirs(args.out, exist_ok=True)
        log(f"tail at netem delay {args.delay} loss {loss} -> {args.out}")
        table, got = tail_at(args, work, loss)
        tables.append(f"### netem delay {args.delay}, loss {loss}\n\n{table}" if len(losses) > 1 else table)
        raw[loss] = got
    args.out = out
    return "\n\n".join(tables), raw if len(losses) > 1 else raw[losses[0]]


def tail_at(args, work, loss):
    work = os.path.join(work, f"loss-{loss.rstrip('%')}")  # each rate's servers and access logs apart
    root = os.path.join(work, "www")
    os.makedirs(root)
    for name, n in TAIL_SIZES.items():
        make_file(os.path.join(root, name), n)
    servers, port = [], 18450
    for name, extra in TAIL_CONDITIONS:
        servers.append(Ktlsd(name, args.ktlsd, root, port, work, ["--ktls", args.tail_ktls, *extra]))
        port += 1
    try:
        if args.http3:  # every policy over HTTP/1.1 and over HTTP/2, and ktlsd's HTTP/3; no peers
            conds = [Cond(f"{proto}/{s.name}", s.port, proto) for proto in tail_h3.PROTOCOLS for s in servers]
            servers.append(Ktlsd(tail_h3.H3, args.ktlsd, root, port, work, ["--http3"]))
            conds.append(Cond(tail_h3.H3, port, tail_h3.H3))
        else:
            for kind in peers.PEERS:  # nginx with ssl_buffer_size 16k (its default), the others as they come
                ktls = args.tail_ktls != "off" and peers.missing(kind, ktls=True) is None
                servers.append(peers.KINDS[kind]("nginx-16k" if kind == "nginx" else kind, root, port, work,
                                                 ktls=ktls, http2=args.http2))
                log(f"  {servers[-1].name}: {'kTLS' if ktls else 'userspace TLS'}")
                port += 1
            conds = [Cond(s.name, s.port, "h2" if args.http2 else "h1") for s in servers]
    except Exception:
        for s in servers:
            s.stop()
        raise
    resolve = [a for s in servers for a in ("--resolve", f"localhost:{s.port}:127.0.0.1")]
    # Loopback's 64 KiB MTU and segmentation offloads would hand netem one
    # 64 KiB packet where a real link carries 45: give lo a 1500-byte MTU and
    # no offloads, so delay and loss act per real-sized segment.
    sh(["ip", "link", "set", "lo", "mtu", "1500"])
    subprocess.run(["ethtool", "-K", "lo", "tso", "off", "gso", "off", "gro", "off"], capture_output=True)
    # Cold means cold: no ssthresh or RTT carried over from earlier connections.
    # netem releases each delayed burst at once; a longer backlog keeps the
    # receive side from dropping any of it, so netem's loss is the only loss.
    sh(["sysctl", "-qw", "net.ipv4.tcp_no_metrics_save=1", "net.core.netdev_max_backlog=100000"])
    if args.http3:
        # UDP has no flow control to hold a burst back: socket buffers as large as ktlsd asks
        # for (4 MiB), and the client's by default, so the only UDP loss is netem's too.
        sh(["sysctl", "-qw", *(f"net.core.{k}=4194304" for k in ("rmem_max", "wmem_max", "rmem_default",
                                                                   "wmem_default"))])
    subprocess.run(["tc", "qdisc", "del", "dev", "lo", "root"], capture_output=True)
    # netem holds every packet of the delay line in its queue; its default limit of
    # 1000 packets would add drops of its own once a few 1 MB transfers overlap.
    for cmd in tail_h3.qdisc(args.delay, loss) if args.http3 else [
            ["tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", args.delay, "loss", loss, "limit", "100000"]]:
        sh(cmd)
    plan = [(c, size) for c in conds for size in TAIL_SIZES for _ in range(args.n)]
    random.shuffle(plan)
    # Batches of one protocol each (one curl process serves 40 connections; gtlsclient makes
    # one connection per process, so an HTTP/3 batch is one job), in the order the shuffled
    # plan fills them, so every protocol's connections run interleaved.
    batches, open_ = [], {}
    for c, size in plan:
        b = open_.setdefault(c.proto, [])
        b.append((c, size))
        if len(b) == (1 if c.proto == tail_h3.H3 else 40):
            batches.append(open_.pop(c.proto))
    batches += [b for b in open_.values() if b]
    run = {"h1": lambda b: tail_batch(b, resolve), "h2": lambda b: tail_batch_h2(b, resolve),
           tail_h3.H3: lambda b: tail_h3.gtlsclient_batch([(c, s, TAIL_SIZES[s]) for c, s in b], work)}
    rows = []
    # Rows are written as they come, so an interrupted run still leaves its data.
    raw = open(os.path.join(args.out, "tail.csv"), "w", newline="")
    out = csv.writer(raw)
    out.writerow(["condition", "size", "ttfb_ms", "total_ms"])
    started, retrans0, backlog0, ext0 = time.monotonic(), tcp_retransmits(), backlog_drops(), tcp_ext()
    udp0, cpu0 = tail_h3.udp_counters(), {s.name: cpu_seconds(s.pids()) for s in servers}
    tail_h3.CLIENT_CPU.clear()
    tail_h3.CLIENT_WAIT.clear()
    if args.http3:
        tail_h3.SLOW_LOGS = os.path.join(args.out, "h3-slow")
        os.makedirs(tail_h3.SLOW_LOGS, exist_ok=True)
    try:
        # A few clients at once: each connection mostly waits on the 100 ms round
        # trips, and every condition shares the same concurrency.
        with concurrent.futures.ThreadPoolExecutor(args.clients) as pool:
            for got in pool.map(lambda b: run[b[0][0].proto](b), batches):
                rows += got
                out.writerows(got)
                raw.flush()
                log(f"  {len(rows)}/{len(plan)} connections, {time.monotonic() - started:.0f} s")
        # Every drop should be netem's: report the retransmits it caused and any drop it did not.
        qd = sh(["tc", "-s", "qdisc", "show", "dev", "lo"])
        netem = re.search(r"netem.*?dropped (\d+)", qd, re.S)
        log(f"  segments retransmitted: {tcp_retransmits() - retrans0}; netem drops: "
            f"{netem.group(1) if netem else '?'}; receive backlog drops: {backlog_drops() - backlog0}")
        ext = {k: v - ext0.get(k, 0) for k, v in tcp_ext().items()}
        log("  TcpExt: " + " ".join(f"{k}={v}" for k, v in ext.items()
                                    if v and re.search("Drop|Spurious|Timeout|LossProbe|Retrans|Prune|Recover", k)))
        if args.http3:
            log("  qdisc: " + " ".join(qd.split()))
            tail_h3.log_udp(udp0, qd)
            tcp = sum(cpu_seconds(s.pids()) - cpu0[s.name] for s in servers if s.name != tail_h3.H3)
            h3 = [s for s in servers if s.name == tail_h3.H3][0]
            n3 = tail_h3.CLIENT_CPU[tail_h3.H3][1]
            tail_h3.log_cpu({"h1+h2": [tcp, len(plan) - n3], tail_h3.H3: [cpu_seconds(h3.pids()) - cpu0[h3.name], n3]})
    finally:
        raw.close()
        subprocess.run(["tc", "qdisc", "del", "dev", "lo", "root"], capture_output=True)
        subprocess.run(["ip", "link", "set", "lo", "mtu", "65536"], capture_output=True)
        for s in servers:
            s.stop()
    if args.tail_ktls != "off":
        require_ktls(work, [name for name, _ in TAIL_CONDITIONS])
    if args.http3:
        tail_h3.require_h3(work, tail_h3.H3, sum(1 for c, _ in plan if c.proto == tail_h3.H3))
    return tail_report(rows, TAIL_SIZES, [c.name for c in conds], args.out)


def tail_report(rows, sizes, names, out):
    """The tail table and chart from (condition, size, ttfb_ms, total_ms) rows."""
    counts = [sum(1 for r in rows if r[0] == n and r[1] == size) for n in names for size in sizes]
    table = [f"connections per size x condition: {min(counts)} to {max(counts)}", "",
             "| size | condition | TTFB p50 | TTFB p95 | TTFB p99 | total p50 | total p95 |",
             "|---|---|---|---|---|---|---|"]
    stats = {}
    for size in sizes:
        for n in names:
            t = [r[2] for r in rows if r[0] == n and r[1] == size]
            tot = [r[3] for r in rows if r[0] == n and r[1] == size]
            stats[(size, n)] = (pct(t, 50), pct(t, 95), pct(t, 99), pct(tot, 50), pct(tot, 95))
            table.append(f"| {size} | {n} | " + " | ".join(f"{v:.0f}" for v in stats[(size, n)]) + " |")
    cell = lambda n, size, col: [r[col] for r in rows if r[0] == n and r[1] == size]
    # The --http3 plan: HTTP/3 against the best TCP condition; else adaptive against the rest.
    table += tail_h3.h3_section(cell, sizes, names) if tail_h3.H3 in names else policy_sections(cell, sizes, names)
    chart(stats, rows, sizes, names, os.path.join(out, "tail.png"))
    return "\n".join(table), {"stats": {f"{k[0]} {k[1]}": v for k, v in stats.items()}}


def policy_sections(cell, sizes, names):
    """adaptive against static:16k (with the goals) and against each peer, with 95% bootstrap intervals."""
    goals = [("100KB", "TTFB", 2, 95, 0.72), ("1MB", "total", 3, 95, 1.0), ("10KB", "TTFB", 2, 95, 1.05)]
    table = ["", "adaptive vs static:16k, with a 95% bootstrap interval:"]
    for size, what, col, p, goal in goals:
        r, lo, hi = ratio_ci(cell("adaptive", size, col), cell("static:16k", size, col), p)
        table.append(f"- {size} p{p} {what}: {r:.2f}x [{lo:.2f}, {hi:.2f}] (goal <= {goal}x)")
    ours = {n for n, _ in TAIL_CONDITIONS}
    for peer in [n for n in names if n not in ours]:
        table += ["", f"adaptive vs {peer}, p95 TTFB and p95 total, with a 95% bootstrap interval:"]
        for size in sizes:
            got = [ratio_ci(cell("adaptive", size, col), cell(peer, size, col), 95) for col in (2, 3)]
            table.append(f"- {size}: TTFB {got[0][0]:.2f}x [{got[0][1]:.2f}, {got[0][2]:.2f}], "
                         f"total {got[1][0]:.2f}x [{got[1][1]:.2f}, {got[1][2]:.2f}]")
    return table


def chart(stats, rows, sizes, names, path):
    plt = plots.pyplot(path)
    if plt is None:
        return
    # Top: p50 and p95 per condition. Bottom: the whole TTFB distribution, where
    # the loss-delayed share (and so where a p95 lands) can be read off.
    wide = 1 + (len(names) > 9)
    fig, axes = plt.subplots(2, len(sizes), figsize=(5 * wide * len(sizes), 8))
    for col, size in enumerate(sizes):
        ax = axes[0][col]
        p50 = [stats[(size, n)][0] for n in names]
        p95 = [stats[(size, n)][1] for n in names]
        x = range(len(names))
        ax.bar([i - 0.2 for i in x], p50, 0.4, label="TTFB p50")
        ax.bar([i + 0.2 for i in x], p95, 0.4, label="TTFB p95")
        ax.set_xticks(list(x), names, rotation=40, ha="right")
        ax.set_title(f"{size}: time to first byte (ms)")
        ax.legend(loc="upper left", fontsize="small")
        ax = axes[1][col]
        for n in names:
            t = sorted(r[2] for r in rows if r[0] == n and r[1] == size)
            ax.step(t, [(i + 1) / len(t) for i in range(len(t))], where="post", label=n,
                    ls="--" if n.startswith("h2/") else "-", lw=2 if n == tail_h3.H3 else 1)
        ax.axhline(0.95, color="grey", lw=0.5, ls="--")
        ax.set_xlim(150 if tail_h3.H3 in names else 250, 1600)
        ax.set_ylim(0.5, 1.0)
        ax.set_xlabel("TTFB (ms)")
        ax.set_ylabel("fraction of connections")
        ax.legend(loc="lower right", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
