"""Scenario scale (this machine): memory per idle TLS connection at several counts, then
interleaved wrk rounds over 1000 keep-alive connections and with a new connection per request,
ktlsd against every selected peer (and nginx a second time with ktlsd's TLS choices)."""

import functools
import os
import random

from . import peers
from .clients import idle_memory, negotiated_suite, wrk_rps
from .peers import Nginx
from .servers import Ktlsd
from .stats import median, versus_table
from .system import log, make_file


def scenario_scale(args, work):
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # wrk -c1000 and the servers inherit it
    root = os.path.join(work, "www")
    os.makedirs(root)
    with open(os.path.join(root, "small.txt"), "w") as f:
        f.write("hello\n" * 20)
    make_file(os.path.join(root, "10k.bin"), 10 * 1024)
    counts = [int(c) for c in args.scale_conns.split(",")]
    conns = max(counts) + 1024
    makers = {"ktlsd": lambda: Ktlsd("ktlsd", args.ktlsd, root, 18445, work)}
    for i, kind in enumerate(peers.PEERS):
        makers[kind] = functools.partial(peers.KINDS[kind], kind, root, 18450 + i, work, connections=conns, http2=True)
    rows, raw = [], {}
    for request, what in [("http/1.1", "idle keep-alive after one response"), (None, "after the handshake only"),
                          ("h2", "idle HTTP/2 after one response")]:
        for n in counts:
            per = {}
            for name, make in makers.items():
                kib, before, after = idle_memory(make, n, request)
                per[name] = kib
                raw[f"{name} {what} {n}"] = {"kib_per_conn": kib, "rss_before_kib": before, "rss_after_kib": after}
                log(f"  {name}, {n} connections {what}: {kib:.1f} KiB each (RSS {before} -> {after} KiB)")
            rows.append((f"KiB per connection, {n} {what}", per.pop("ktlsd"), per, "<= 1.0"))
    # nginx again with ktlsd's TLS choices (server order with AES-128-GCM first, one
    # TLS 1.3 ticket per connection), to tell those choices from the rest of the server.
    same_tls = ("ssl_prefer_server_ciphers on; ssl_conf_command Ciphersuites "
                "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256; "
                "ssl_conf_command NumTickets 1;")
    servers = []
    try:
        for make in makers.values():
            servers.append(make())
        if "nginx" in peers.PEERS:
            servers.append(Nginx("nginx-same-tls", root, 18447, work, connections=2048, http2=True, extra=same_tls))
        for s in servers:
            log(f"  {s.name} chooses {negotiated_suite(s.port)} for an OpenSSL client")
        rps = {("keep", s.name): [] for s in servers} | {("close", s.name): [] for s in servers}
        cpu = {k: [] for k in rps}
        for i in range(args.scale_rounds):
            for s in random.sample(servers, len(servers)):
                for mode, conns, extra in [("keep", 1000, []), ("close", 64, ["-H", "Connection: close"])]:
                    r, us = wrk_rps(s, "10k.bin", conns, args.duration, extra)
                    rps[(mode, s.name)].append(r)
                    cpu[(mode, s.name)].append(us)
            log(f"  wrk round {i + 1}/{args.scale_rounds}: " + ", ".join(
                f"{k[0]} {k[1]} {v[-1]:.0f} req/s {cpu[k][-1]:.1f} us/req" for k, v in rps.items()))
    finally:
        for s in servers:
            s.stop()
    raw["wrk"] = {f"{k[0]} {k[1]}": v for k, v in rps.items()}
    raw["server_cpu_us_per_request"] = {f"{k[0]} {k[1]}": v for k, v in cpu.items()}
    others = [s.name for s in servers[1:]]
    wrk_rows = []
    for mode, what in [("keep", f"10 KiB wrk -c1000 {args.duration}s"),
                       ("close", f"10 KiB, new TLS connection per request (wrk -c64 Connection: close) {args.duration}s")]:
        wrk_rows.append((f"{what}, median req/s", median(rps[(mode, "ktlsd")]),
                         {o: median(rps[(mode, o)]) for o in others}, ">= 1.2"))
        # wrk shares the machine: the servers' own CPU per request shows what a rate ratio dilutes.
        wrk_rows.append((f"{what}, server CPU us per request, median", median(cpu[(mode, "ktlsd")]),
                         {o: median(cpu[(mode, o)]) for o in others}, "lower is better"))
    note = "\n\nnginx-same-tls: nginx with ktlsd's suite order and ticket count." if "nginx" in peers.PEERS else ""
    return versus_table(rows, peers.PEERS, digits=1) + "\n\n" + versus_table(wrk_rows, others, digits=1) + note, raw
