"""Scenario `tail --native` (this machine): the record-sizing study's lossy-link experiment over
the link emulator (linkemu) at native CPU speed: cold connections between the clients' and the
servers' network namespaces, 50 ms each way, each loss rate of `--loss` in turn, 100 KB and 1 MB
objects, ktlsd's record policies, TCP options and HTTP/3 beside nginx and Caddy, in one shuffled
plan per loss rate.

The matrix is one factor at a time around a baseline (the full factorial would not fit a run):
the baseline is ktlsd over HTTP/2 (the study's protocol) with `--record-size static:16k`, no
TCP_NOTSENT_LOWAT and BBR (this host's default congestion control, which the peers run with too);
each other condition changes one thing: the record policy (dynamic; adaptive, which sets a 16 KiB
TCP_NOTSENT_LOWAT of its own), TCP_NOTSENT_LOWAT 16 KiB, CUBIC, the protocol (HTTP/1.1; HTTP/3,
whose congestion control is quinn's, CUBIC), or the server (nginx with its only policy, static
16k, over HTTP/2; Caddy over HTTP/2 and HTTP/3, quic-go's congestion control)."""

import collections
import concurrent.futures
import csv
import os
import random
import time

from . import linkemu, peers, plots, tail, tail_h3
from .h3 import CaddyH3
from .servers import Ktlsd
from .stats import pct, pct_ci, ratio_ci
from .system import cpu_seconds, log, make_file

SIZES = {"100KB": 100_000, "1MB": 1_000_000}
BASE = ["--tcp-congestion", "bbr"]
# ktlsd's servers: name, options.
KTLSD = [
    ("static:16k", ["--record-size", "static:16k", *BASE]),
    ("dynamic", ["--record-size", "dynamic", *BASE]),
    ("adaptive", ["--record-size", "adaptive", *BASE]),
    ("static:16k+lowat", ["--record-size", "static:16k", "--tcp-notsent-lowat", "16384", *BASE]),
    ("static:16k+cubic", ["--record-size", "static:16k", "--tcp-congestion", "cubic"]),
    ("h3", ["--record-size", "static:16k", "--http3", *BASE]),
]
# The conditions: name, server, protocol.
CONDITIONS = [
    ("h2/static:16k", "static:16k", "h2"),  # the baseline
    ("h2/dynamic", "dynamic", "h2"),
    ("h2/adaptive", "adaptive", "h2"),
    ("h2/static:16k+lowat", "static:16k+lowat", "h2"),
    ("h2/static:16k+cubic", "static:16k+cubic", "h2"),
    ("h1/static:16k", "static:16k", "h1"),
    ("h3/ktlsd", "h3", "h3"),
    ("h2/nginx-16k", "nginx-16k", "h2"),
    ("h2/caddy", "caddy", "h2"),
    ("h3/caddy", "caddy", "h3"),
]
BASELINE = "h2/static:16k"
# The comparisons the report states, each a ratio of p50/p95/p99 with a bootstrap interval.
COMPARISONS = [
    ("h2/dynamic", "h2/static:16k", "record policy"),
    ("h2/adaptive", "h2/static:16k", "record policy"),
    ("h2/static:16k+lowat", "h2/static:16k", "TCP_NOTSENT_LOWAT 16 KiB"),
    ("h2/static:16k+cubic", "h2/static:16k", "CUBIC instead of BBR"),
    ("h1/static:16k", "h2/static:16k", "HTTP/1.1 instead of HTTP/2"),
    ("h3/ktlsd", "h2/static:16k", "HTTP/3 instead of HTTP/2"),
    ("h3/ktlsd", "h2/static:16k+cubic", "HTTP/3 against HTTP/2, both CUBIC"),
    ("h3/caddy", "h2/caddy", "HTTP/3 instead of HTTP/2 (Caddy)"),
    ("h2/static:16k", "h2/nginx-16k", "ktlsd against nginx"),
    ("h2/static:16k", "h2/caddy", "ktlsd against Caddy"),
    ("h3/ktlsd", "h3/caddy", "ktlsd against Caddy"),
]
CURL_FIELDS = "%{http_version} %{http_code} %{size_download} %{num_connects} %{time_starttransfer} %{time_total}\\n"

Cond = collections.namedtuple("Cond", "name port proto")


def curl_batch(jobs, proto):
    """One curl process fetches `jobs` [(Cond, size)] in order, each on a new connection with a
    full handshake (no session reuse; HTTP/1.1 with `Connection: close`; HTTP/2 with a host name
    of its own per job, resolved to the servers' address). A transfer that fails is kept as a
    failure, not dropped: (rows, failures)."""
    cmd = ["curl", "-sk", "--no-sessionid", "--max-time", "60", "-w", CURL_FIELDS]
    cmd += ["--http1.1", "-H", "Connection: close"] if proto == "h1" else ["--http2"]
    for i, (c, size) in enumerate(jobs):
        host = f"c{i}.localhost"
        cmd += ["--resolve", f"{host}:{c.port}:{linkemu.SRV_IP}", "-o", "/dev/null", f"https://{host}:{c.port}/{size}"]
    out = tail_h3.run_timed(cmd, proto, len(jobs), 3600)[1].splitlines()
    rows, failed = [], []
    want = "1.1" if proto == "h1" else "2"
    for k, (c, size) in enumerate(jobs):
        parts = out[k].split() if k < len(out) else []
        ok = (len(parts) == 6 and parts[0] == want and parts[1] == "200" and int(parts[2]) == SIZES[size]
              and parts[3] == "1")
        if ok:
            rows.append((c.name, size, float(parts[4]) * 1000, float(parts[5]) * 1000))
        else:
            failed.append((c.name, size, " ".join(parts) or "no output"))
    return rows, failed


def h3_job(job, work):
    c, size = job
    try:
        return tail_h3.gtlsclient_batch([(c, size, SIZES[size])], work, linkemu.SRV_IP), []
    except RuntimeError as e:
        return [], [(c.name, size, str(e)[:300])]


def scenario_tail_native(args, work):
    losses = [x for x in args.loss.split(",") if x]
    delay = float(args.delay.rstrip("ms"))
    tables, raw = [], {}
    os.makedirs(args.out, exist_ok=True)
    for loss in losses:
        log(f"tail --native: linkemu {delay:g} ms each way, loss {loss}, n={args.n}")
        rows, failed, info = run_at(args, work, delay, float(loss.rstrip("%")), loss)
        text, stats = report_at(rows, failed, info, loss, args.out)
        tables.append(text)
        raw[loss] = {"stats": stats, "failed": len(failed), **info}
    return "\n\n".join(tables), raw


def report_only(args):
    """The report again from OUT/tail-native-RATE.csv and the run's figures in OUT/tail-native.json."""
    import json
    with open(os.path.join(args.out, "tail-native.json")) as f:
        saved = json.load(f)
    tables, raw = [], {}
    for loss in [x for x in args.loss.split(",") if x]:
        with open(os.path.join(args.out, f"tail-native-{loss.rstrip('%')}.csv")) as f:
            rows = [(r["condition"], r["size"], float(r["ttfb_ms"]), float(r["total_ms"])) for r in csv.DictReader(f)]
        info = {k: v for k, v in saved[loss].items() if k not in ("stats", "failed")}
        failed = [("?", "?", "?")] * saved[loss]["failed"]
        text, stats = report_at(rows, failed, info, loss, args.out)
        tables.append(text)
        raw[loss] = {"stats": stats, "failed": len(failed), **info}
    return "\n\n".join(tables), raw


def run_at(args, work, delay, loss, label):
    work = os.path.join(work, f"native-{label.rstrip('%')}")
    root = os.path.join(work, "www")
    os.makedirs(root)
    for name, n in SIZES.items():
        make_file(os.path.join(root, name), n)
    pin = os.cpu_count() >= 2  # servers on CPU 0; clients and the forwarder on CPU 1
    link = linkemu.Link(delay, loss, cpu=1 if pin else None, work=work, seed=args.linkemu_seed)
    servers, ports, port = [], {}, 18750
    home = os.sched_getaffinity(0)
    try:
        # The servers start in their namespace and on their core; their processes keep both.
        with linkemu.in_ns(linkemu.NS_SRV):
            if pin:
                os.sched_setaffinity(0, {0})
            try:
                for name, extra in KTLSD:
                    servers.append(Ktlsd(name, args.ktlsd, root, port, work, extra))
                    ports[name] = port
                    port += 1
                servers.append(peers.Nginx("nginx-16k", root, port, work, http2=True))
                ports["nginx-16k"] = port
                port += 1
                servers.append(CaddyH3("caddy", root, port, work, http2=True))
                ports["caddy"] = port
            finally:
                os.sched_setaffinity(0, home)
        conds = [Cond(name, ports[server], proto) for name, server, proto in CONDITIONS]
        plan = [(c, size) for c in conds for size in SIZES for _ in range(args.n)]
        random.Random(args.linkemu_seed).shuffle(plan)
        # Batches of one protocol each, in the order the shuffled plan fills them: a curl
        # process takes 20 connections, a gtlsclient process one.
        batches, open_ = [], {}
        for c, size in plan:
            b = open_.setdefault(c.proto, [])
            b.append((c, size))
            if len(b) == (1 if c.proto == "h3" else 20):
                batches.append(open_.pop(c.proto))
        batches += [b for b in open_.values() if b]
        rows, failed = [], []
        raw = open(os.path.join(args.out, f"tail-native-{label.rstrip('%')}.csv"), "w", newline="")
        out = csv.writer(raw)
        out.writerow(["condition", "size", "ttfb_ms", "total_ms"])
        cpu0 = {s.name: cpu_seconds(s.pids()) for s in servers}
        link0, fcpu0, started = link.stats(), link.cpu(), time.monotonic()
        snmp0 = {ns: {t: linkemu.snmp(ns, t) for t in ("Udp:", "Tcp:")} for ns in (linkemu.NS_CLI, linkemu.NS_SRV)}
        tail_h3.CLIENT_CPU.clear()

        def run_batch(b):
            proto = b[0][0].proto
            return h3_job(b[0], work) if proto == "h3" else curl_batch(b, proto)
        # The clients: threads made in the clients' namespace on the clients' core; their
        # processes start there too.
        with linkemu.in_ns(linkemu.NS_CLI):
            if pin:
                os.sched_setaffinity(0, {1})
            try:
                with concurrent.futures.ThreadPoolExecutor(args.clients) as pool:
                    last = 0
                    for got, bad in pool.map(run_batch, batches):
                        rows += got
                        failed += bad
                        out.writerows(got)
                        raw.flush()
                        if len(rows) + len(failed) - last >= 500:
                            last = len(rows) + len(failed)
                            log(f"  {last}/{len(plan)} connections, {len(failed)} failed, "
                                f"{time.monotonic() - started:.0f} s")
            finally:
                os.sched_setaffinity(0, home)
        raw.close()
        seconds = time.monotonic() - started
        link1, fcpu1 = link.stats(), link.cpu()
        snmp1 = {ns: {t: linkemu.snmp(ns, t) for t in ("Udp:", "Tcp:")} for ns in (linkemu.NS_CLI, linkemu.NS_SRV)}
        per_server = {s.name: cpu_seconds(s.pids()) - cpu0[s.name] for s in servers}
    finally:
        for s in servers:
            s.stop()
        link.close()
    moved = {d: {k: link1[d][k] - link0[d][k] for k in link1[d]} for d in ("a_to_b", "b_to_a")}
    lost = sum(m["lost"] for m in moved.values())
    packets = sum(m["packets_in"] for m in moved.values())
    info = {"seconds": round(seconds), "connections": len(plan), "clients": args.clients,
            "link_packets": packets, "link_loss_pct": round(lost / packets * 100, 3) if packets else None,
            "link_queue_drops": sum(m["queue_drops"] for m in moved.values()),
            "forwarder_cpu_s": round(fcpu1 - fcpu0, 2),
            # Drops the link did not make (should be 0), and TCP's retransmissions, per side.
            "udp_rcvbuf_errors": {side: snmp1[ns]["Udp:"]["RcvbufErrors"] - snmp0[ns]["Udp:"]["RcvbufErrors"]
                                  for side, ns in (("clients", linkemu.NS_CLI), ("servers", linkemu.NS_SRV))},
            "udp_sndbuf_errors": {side: snmp1[ns]["Udp:"]["SndbufErrors"] - snmp0[ns]["Udp:"]["SndbufErrors"]
                                  for side, ns in (("clients", linkemu.NS_CLI), ("servers", linkemu.NS_SRV))},
            "tcp_retrans_segs": {side: snmp1[ns]["Tcp:"]["RetransSegs"] - snmp0[ns]["Tcp:"]["RetransSegs"]
                                 for side, ns in (("clients", linkemu.NS_CLI), ("servers", linkemu.NS_SRV))},
            "server_cpu_ms_per_conn": {k: round(v * 1000 / max(1, sum(1 for c, _ in plan if c.port == ports[k])), 1)
                                       for k, v in per_server.items()},
            "client_cpu_ms_per_conn": {k: round(v[0] * 1000 / v[1], 1) for k, v in tail_h3.CLIENT_CPU.items() if v[1]}}
    log(f"  done in {seconds:.0f} s; {len(failed)} failed; link: {info}")
    for f in failed[:20]:
        log(f"  failed: {f}")
    return rows, failed, info


def fmt(v):
    return f"{v[0]:.0f} [{v[1]:.0f}, {v[2]:.0f}]"


def report_at(rows, failed, info, loss, out):
    """The table (p50/p95/p99 of TTFB and total with 95% bootstrap intervals), the comparisons
    (ratios of p50/p95/p99 with intervals), CDF and ratio charts, for one loss rate."""
    names = [c[0] for c in CONDITIONS]
    cell = collections.defaultdict(list)
    for name, size, ttfb, total in rows:
        cell[(name, size, "ttfb")].append(ttfb)
        cell[(name, size, "total")].append(total)
    tag = loss.rstrip("%")
    lines = [f"### loss {loss} each way, 50 ms each way", "",
             f"{info['connections']} connections planned, {len(rows)} completed, {len(failed)} failed, in "
             f"{info['seconds']} s with {info['clients']} clients at once; the forwarder dropped "
             f"{info['link_loss_pct']}% of {info['link_packets']} packets (queue drops: {info['link_queue_drops']}) "
             f"and used {info['forwarder_cpu_s']} CPU s. UDP datagrams dropped at a full receive buffer: "
             f"{info['udp_rcvbuf_errors']}; at a full send buffer: {info['udp_sndbuf_errors']}; TCP segments "
             f"retransmitted: {info['tcp_retrans_segs']}.", "",
             f"CPU per connection (ms): servers {info['server_cpu_ms_per_conn']}; clients by protocol "
             f"{info['client_cpu_ms_per_conn']}.", "",
             "Milliseconds, each with its 95% bootstrap interval:", "",
             "| size | condition | n | TTFB p50 | TTFB p95 | TTFB p99 | total p50 | total p95 | total p99 |",
             "|---|---|---|---|---|---|---|---|---|"]
    stats = {}
    for size in SIZES:
        for n in names:
            t, tot = cell[(n, size, "ttfb")], cell[(n, size, "total")]
            got = [pct_ci(t, p) for p in (50, 95, 99)] + [pct_ci(tot, p) for p in (50, 95, 99)]
            stats[f"{size} {n}"] = [round(g[0], 1) for g in got]
            lines.append(f"| {size} | {n} | {len(t)} | " + " | ".join(fmt(g) for g in got) + " |")
    lines += ["", "Ratios (first / second) of p50, p95 and p99, with 95% bootstrap intervals:", "",
              "| size | comparison | what | TTFB p50 | TTFB p95 | TTFB p99 | total p50 | total p95 | total p99 |",
              "|---|---|---|---|---|---|---|---|---|"]
    bars = []
    for size in SIZES:
        for a, b, what in COMPARISONS:
            got = []
            for col in ("ttfb", "total"):
                for p in (50, 95, 99):
                    x, y = cell[(a, size, col)], cell[(b, size, col)]
                    got.append(ratio_ci(x, y, p, 1000) if x and y else (float("nan"),) * 3)
            lines.append(f"| {size} | {a} / {b} | {what} | " +
                         " | ".join(f"{r:.2f}x [{lo:.2f}, {hi:.2f}]" for r, lo, hi in got) + " |")
            bars.append((f"{size} {a} / {b}: TTFB p95", *got[1]))
            bars.append((f"{size} {a} / {b}: total p95", *got[4]))
    cdf_path = os.path.join(out, f"tail-native-{tag}.svg")
    panels = [(f"{size}: {'time to first byte' if col == 'ttfb' else 'completion'}, loss {loss}",
               f"{'TTFB' if col == 'ttfb' else 'completion'} (ms)", {n: cell[(n, size, col)] for n in names})
              for size in SIZES for col in ("ttfb", "total")]
    # The body of each CDF: from the fastest connection to a little past the slowest p99.
    lim = {}
    for title, _, series in panels:
        vals = [v for s in series.values() for v in s]
        tops = [pct(s, 99) for s in series.values() if s]
        lim[title] = (min(vals) * 0.95, max(tops) * 1.1) if vals else (0, 1)
    plots.cdf(cdf_path, panels, f"tail --native: cold connections, 50 ms each way, loss {loss}",
              xlim=lambda t: lim[t])
    ratio_path = os.path.join(out, f"tail-native-{tag}-ratios.svg")
    plots.ratio_bars(ratio_path, bars, f"p95 ratios with 95% bootstrap intervals, loss {loss} (below 1: first is faster)")
    lines += ["", f"Charts: [CDFs]({os.path.basename(cdf_path)}), [p95 ratios]({os.path.basename(ratio_path)})."]
    return "\n".join(lines), stats
