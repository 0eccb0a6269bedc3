#!/usr/bin/env python3
"""ktlsd benchmarks, always side by side with its peers (nginx, H2O, lighttpd, Caddy; --peers) in
one run, reported as ratios ktlsd/peer.

Scenarios:
  throughput  (host)  1 GiB single-connection download with curl (speed, server CPU s/GiB)
                      and 10 KiB requests with wrk (64 keep-alive connections): ktlsd vs peers;
                      the AEAD alone (aws-lc-rs AES-128-GCM, one core) as the crypto limit.
  h2          (host)  the same over HTTP/2 with h2load.
  h3          (host)  HTTP/3 (gtlsclient): 10 KiB over 8 connections and a 1 GiB single stream,
                      ktlsd vs Caddy; ktlsd's HTTP/2 CPU s/GiB as the reference.
  ktls        (VM)    32 MiB download: ktlsd kTLS vs ktlsd userspace vs the peers with kTLS
                      (nginx, lighttpd through OpenSSL's KTLS option); the kernel's and
                      aws-lc-rs's AES-GCM as the crypto limit.
  scale-ktls  (VM)    memory per idle keep-alive connection with kTLS in both servers, at 1,000
                      and 2,000 connections.
  scale       (host)  memory per idle keep-alive TLS connection (after one small response, and
                      after the handshake alone) at 2,000 and 10,000 connections, both servers
                      fresh; 10 KiB with wrk over 1000 keep-alive connections, and with a new
                      TLS connection per request (Connection: close).
  tail        (VM)    cold connections over netem 50 ms delay / 1% loss: TTFB and total time
                      per record-size policy and each peer, for 10 KB, 100 KB and 1 MB files;
                      --http3: every policy over HTTP/1.1 and HTTP/2 beside ktlsd's HTTP/3.
  cold        (VM)    a hot 10 KiB file fetched by wrk while other clients download cold large
                      files from a slow disk (ext4 on a loop file under dm-delay): the hot file's
                      p50/p99, idle and loaded, for ktlsd kTLS and userspace, nginx default, nginx
                      aio threads, and the other peers.
  proxy       (host)  the reverse proxy and its cache against nginx proxy_pass / proxy_cache, one
                      plain-HTTP upstream for both: 10 KiB hits over HTTP/1.1 and HTTP/2, 10 KiB
                      proxied without cache, a hit's CPU against a static file's, and 100
                      concurrent misses on one key counted at the upstream.
              (VM)    --vm: a 128 MiB hit over kTLS from both (nginx with OpenSSL's KTLS option):
                      MB/s and server CPU s/GiB, and the proof that kTLS and sendfile carried it;
                      bulk bytes through a WebSocket tunnel over kTLS (splice on ktlsd's side).
              --parts LIST runs only some measures (e.g. --parts tunnel).

  tail --native (host) the same over the link emulator (linkemu) at native CPU speed: 50 ms each way,
                      each loss rate of --loss, 100 KB and 1 MB, ktlsd's policies, TCP_NOTSENT_LOWAT, BBR
                      and CUBIC, HTTP/1.1, HTTP/2 and HTTP/3, nginx and Caddy: bench/results/tail-native.md.
  linkemu     (host)  --check: the link emulator's self-test (RTT by ping and TCP connect, loss over
                      100,000 datagrams, throughput, the forwarder's own CPU cost).
  soak        (host)  the fault soak: mixed HTTP/1.1, HTTP/2 and HTTP/3 traffic (static, proxied, cached,
                      ranges, compressed) for --minutes while the origin dies, slows and sends garbage,
                      ktlsd reloads, is SIGKILLed once, its cache disk fills and its descriptors run out;
                      every answer checked byte for byte; report in bench/reports/soak-Nm.md.
  fleet       (host)  three ktlsd members behind HAProxy (round robin): TLS 1.3 connections resumed,
                      new connections per second and the members' CPU per connection, with
                      per-process ticket keys against keys shared through etcd ([cluster]).

Run through bench/run, which installs what is needed and boots a VM for the VM scenarios. Each scenario
is a module of the ktlsbench package beside this file, with the helpers they share.
"""
import argparse
import csv
import json
import os
import shutil
import signal
import sys
import tempfile

from ktlsbench import (cold, fleet, h3, ktls, linkemu, peers, plots, proxy, scale, scale_ktls, servers, soak, tail,
                       tail_h3, tail_native, throughput, throughput_h2)

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("scenario", choices=["throughput", "ktls", "tail", "scale", "scale-ktls", "h2", "h3", "cold",
                                               "proxy", "fleet", "soak", "linkemu"])
    p.add_argument("--ktlsd", default=os.path.join(REPO, "target/release/ktlsd"))
    p.add_argument("--runs", type=int, default=10, help="download runs per server")
    p.add_argument("--duration", type=int, default=10, help="wrk seconds per round")
    p.add_argument("--workers", type=int, default=os.cpu_count())
    p.add_argument("--n", type=int, default=200, help="tail: connections per size x condition")
    p.add_argument("--tail-ktls", default="auto", choices=["auto", "on", "off"])
    p.add_argument("--clients", type=int, default=2, help="tail: curl processes running at once")
    p.add_argument("--delay", default="50ms", help="tail: netem delay, each direction")
    p.add_argument("--loss", default="1%",
                   help="tail: netem loss, each direction (%%); a comma-separated list runs the plan at each")
    p.add_argument("--quick", action="store_true", help="throughput: 64 MiB instead of 1 GiB")
    p.add_argument("--record-size", help="throughput: ktlsd's --record-size (default: ktlsd's default)")
    p.add_argument("--report-only", action="store_true",
                   help="tail: rebuild the table and chart from an existing results/tail.csv")
    p.add_argument("--scale-conns", default="2000,10000", help="scale: idle connection counts, comma-separated")
    p.add_argument("--scale-ktls-conns", default="1000,2000",
                   help="scale-ktls: idle connection counts, comma-separated")
    p.add_argument("--scale-rounds", type=int, default=3, help="scale: interleaved wrk rounds")
    p.add_argument("--out", default=os.path.join(REPO, "bench/results"))
    p.add_argument("--cold-clients", type=int, default=4, help="cold: clients downloading cold files")
    p.add_argument("--cold-rate", default="2M", help="cold: each cold client's curl --limit-rate")
    p.add_argument("--cold-delay-ms", type=int, default=20, help="cold: dm-delay read delay")
    p.add_argument("--peers", default=",".join(peers.PEERS),
                   help="servers to compare with, comma-separated (default: all of %(default)s)")
    p.add_argument("--aead-limit", default=os.path.join(REPO, "target/release/examples/aead_limit"),
                   help="the aead_limit example program (bench/run builds it)")
    p.add_argument("--aead-seconds", type=float, default=3.0,
                   help="throughput, h2, ktls: CPU seconds each crypto-limit measurement runs")
    p.add_argument("--minutes", type=int, default=30, help="soak: minutes of traffic and faults")
    p.add_argument("--http2", action="store_true",
                   help="ktls, tail: over HTTP/2 (h2load; curl --http2); results under OUT/h2/")
    p.add_argument("--http3", action="store_true",
                   help="tail: ktlsd's HTTP/3 (gtlsclient) beside every policy over HTTP/1.1 and HTTP/2, no peers; "
                        "results under OUT/h3/")
    p.add_argument("--native", action="store_true",
                   help="tail: on this machine over the link emulator (linkemu) with nginx and Caddy, HTTP/1.1, "
                        "HTTP/2 and HTTP/3; report OUT/tail-native.md")
    p.add_argument("--check", action="store_true", help="linkemu: the self-test (the only thing it does)")
    p.add_argument("--linkemu-cpu", type=int, default=1, help="linkemu --check: the CPU the forwarder is pinned to")
    p.add_argument("--linkemu-need-mbit", type=int, default=200,
                   help="linkemu --check: the least TCP throughput at 0%% loss that passes")
    p.add_argument("--linkemu-seed", type=int, default=1, help="linkemu, tail --native: the seed of the losses")
    p.add_argument("--vm", action="store_true",
                   help="proxy: large cache hits over kTLS in the VM (bench/run boots it), ktlsd vs nginx proxy_cache; "
                        "results under OUT/vm/")
    p.add_argument("--parts", default="all",
                   help="proxy: the measures to run, comma-separated (default all). On this machine: "
                        f"{', '.join(proxy.HOST_PARTS)}, or tunnel for ws-rt,ws-bulk; with --vm: "
                        f"{', '.join(proxy.VM_PARTS)}")
    args = p.parse_args()
    if args.scenario == "linkemu":
        if not args.check:
            p.error("linkemu: --check is what it does")
        args.loss = args.loss if args.loss != "1%" else "1%,3%"
        os.makedirs(args.out, exist_ok=True)
        work = tempfile.mkdtemp(prefix="ktlsd-linkemu-")
        try:
            text, raw = linkemu.check(args, work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        write_report(args, f"## linkemu --check (kernel {os.uname().release})\n\n{text}\n", raw)
        if not raw["passed"]:
            raise SystemExit("linkemu --check: failed")
        return
    if args.native:
        if args.scenario != "tail" or args.http2 or args.http3:
            p.error("--native applies to the tail scenario, without --http2/--http3 (its plan has both)")
        servers.HOST = "0.0.0.0"  # every address of the servers' namespace
        servers.ACCESS_LOG = True
        servers.WORKERS = 1  # each server on one core, as the study pinned nginx to one
        peers.PEERS = ["nginx", "caddy"]
        args.clients = 10 if args.clients == p.get_default("clients") else args.clients
        work = tempfile.mkdtemp(prefix="ktlsd-bench-")
        # A SIGTERM stops the run through its cleanup: servers stopped, namespaces removed.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit("tail --native: terminated"))
        try:
            if args.report_only:  # from OUT's CSVs and JSON
                table, raw = tail_native.report_only(args)
            else:
                servers.make_cert(work)
                table, raw = tail_native.scenario_tail_native(args, work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        versions = "; ".join(f"{k}: {v}" for k, v in peers.versions().items())
        report = (f"## tail --native (kernel {os.uname().release}, {servers.WORKERS} worker per server, "
                  f"access logs on for every server)\n\nPeers: {versions}\n\n{tail_native.__doc__}\n\n{table}\n")
        args.scenario = "tail-native"
        write_report(args, report, raw, chart=False)  # its CDF and ratio charts are drawn per loss rate
        return
    if args.scenario == "proxy":
        try:
            args.parts = proxy.parts(args.parts, args.vm)
        except ValueError as e:
            p.error(f"--parts: {e}")
    elif args.parts != "all":
        p.error("--parts applies to the proxy scenario")
    if args.vm:
        if args.scenario != "proxy":
            p.error("--vm applies to the proxy scenario (the other VM scenarios always run in the VM)")
        args.out = os.path.join(args.out, "vm")
    if args.http3:
        if args.scenario != "tail" or args.http2:
            p.error("--http3 applies to the tail scenario, without --http2 (its plan has HTTP/2 already)")
        args.out = os.path.join(args.out, "h3")
    if args.http2:
        if args.scenario not in ("ktls", "tail"):
            p.error("--http2 applies to the ktls and tail scenarios (h2 is HTTP/2 on this machine)")
        args.out = os.path.join(args.out, "h2")
    servers.WORKERS = args.workers
    peers.PEERS = [n for n in args.peers.split(",") if n] if not args.http3 else []  # --http3: ktlsd alone
    if args.scenario in ("fleet", "soak"):
        peers.PEERS = []  # ktlsd against itself: per-process keys and [cluster]
    unknown = set(peers.PEERS) - set(peers.KINDS)
    if unknown:
        p.error(f"--peers: unknown {', '.join(sorted(unknown))}; choose from {', '.join(peers.KINDS)}")
    # The VM scenarios check ktlsd's access log (tls=ktls): there every server writes one, alike.
    servers.ACCESS_LOG = args.scenario in ("ktls", "tail", "cold", "scale-ktls") or args.vm
    os.makedirs(args.out, exist_ok=True)
    if args.report_only:
        losses = [x for x in args.loss.split(",") if x]
        for loss in losses:  # a list of rates left each one's CSV under OUT/loss-RATE/
            out = args.out if len(losses) == 1 else os.path.join(args.out, f"loss-{loss.rstrip('%')}")
            with open(os.path.join(out, "tail.csv")) as f:
                rows = [(r["condition"], r["size"], float(r["ttfb_ms"]), float(r["total_ms"]))
                        for r in csv.DictReader(f)]
            conds = [n for n, _ in tail.TAIL_CONDITIONS]
            if args.http3:  # each policy over HTTP/1.1, then over HTTP/2, then HTTP/3
                conds = [f"{proto}/{n}" for proto in tail_h3.PROTOCOLS for n in conds] + [tail_h3.H3]
            names = conds + sorted({r[0] for r in rows} - set(conds))  # ktlsd's policies, then the peers
            table, _ = tail.tail_report(rows, tail.TAIL_SIZES, names, out)
            print(f"### loss {loss}\n\n{table}\n" if len(losses) > 1 else table)
        return
    work = tempfile.mkdtemp(prefix="ktlsd-bench-")
    try:
        servers.make_cert(work)
        table, raw = {"throughput": throughput.scenario_throughput,
                      "ktls": ktls.scenario_ktls_h2 if args.http2 else ktls.scenario_ktls,
                      "tail": tail.scenario_tail, "scale": scale.scenario_scale, "h2": throughput_h2.scenario_h2,
                      "h3": h3.scenario_h3, "proxy": proxy.scenario_proxy,
                      "fleet": fleet.scenario_fleet, "soak": soak.scenario_soak, "cold": cold.scenario_cold, "scale-ktls": scale_ktls.scenario_scale_ktls}[args.scenario](args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    kernel = os.uname().release
    versions = "; ".join(f"{k}: {v}" for k, v in peers.versions().items())
    logs = "access logs on for every server" if servers.ACCESS_LOG else "access logs off for every server"
    report = (f"## {args.scenario} (kernel {kernel}, {servers.WORKERS} workers, {logs})\n\n"
              f"Peers: {versions or 'none'}\n\n{table}\n")
    write_report(args, report, raw, chart=args.scenario not in ("soak",))  # the soak draws its own
    if args.scenario == "soak" and not raw["passed"]:
        raise SystemExit("soak: failed (unexplained failures, corrupt answers, wrong stored entries or RSS growth)")


def write_report(args, report, raw, chart=True):
    """OUT/SCENARIO.md and .json, and beside the Markdown a chart of the ratios it states."""
    print(report)
    md = os.path.join(args.out, f"{args.scenario}.md")
    with open(md, "w") as f:
        f.write(report)
    with open(os.path.join(args.out, f"{args.scenario}.json"), "w") as f:
        json.dump(raw, f, indent=1)
    if chart:
        plots.report_chart(md)


if __name__ == "__main__":
    main()
