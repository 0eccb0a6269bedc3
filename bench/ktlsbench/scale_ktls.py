"""Scenario scale-ktls (VM): memory per idle keep-alive connection with kTLS carrying the
connections in ktlsd and in every selected peer that has kTLS (nginx, lighttpd); the others are
listed as such."""

import functools
import os
import time

from . import peers
from .clients import open_idle
from .servers import Ktlsd, require_ktls
from .stats import versus_table
from .system import log, proc_counters_flat, rss_kib


def scenario_scale_ktls(args, work):
    """VM: KiB per idle keep-alive connection (after one small response) with kTLS carrying
    the connections in every server: ktlsd --ktls on, the peers with OpenSSL's KTLS option.
    Fails unless the kernel's TlsCurrTxSw gauge rose by the connection count while they were
    held, and unless ktlsd's access log says tls=ktls for every response."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the servers inherit it
    root = os.path.join(work, "www")
    os.makedirs(root)
    with open(os.path.join(root, "small.txt"), "w") as f:
        f.write("hello\n" * 20)
    counts = [int(c) for c in args.scale_ktls_conns.split(",")]
    makers = {"ktlsd": lambda: Ktlsd("ktlsd-ktls", args.ktlsd, root, 18447, work, ["--ktls", "on"])}
    missing = {}
    for i, kind in enumerate(peers.PEERS):
        why = peers.missing(kind, ktls=True)
        if why:
            missing[kind] = why
        else:
            makers[kind] = functools.partial(peers.KINDS[kind], f"{kind}-ktls", root, 18450 + i, work, ktls=True,
                                             connections=max(counts) + 1024)

    def gauges():
        c = proc_counters_flat("/proc/net/tls_stat")
        return c.get("TlsCurrTxSw", 0), c.get("TlsCurrRxSw", 0)

    rows, raw = [], {}
    for n in counts:
        per = {}
        for name, make in makers.items():
            s = make()
            try:
                time.sleep(0.5)
                before, (tx0, rx0) = rss_kib(s.pids()), gauges()
                try:
                    after, (tx1, rx1) = open_idle(s.port, n, "http/1.1", lambda: (rss_kib(s.pids()), gauges()))
                except OSError:  # connections refused or reset: show the start-up lines (fd budget, kTLS)
                    if isinstance(s, Ktlsd):
                        with open(os.path.join(work, f"{s.name}.err")) as f:
                            lines = f.readlines()
                            log(f"  {name} stderr:\n" + "".join(lines[:12]))
                    raise
            finally:
                s.stop()
            if tx1 - tx0 < n:
                raise RuntimeError(f"{name}: TlsCurrTxSw rose by {tx1 - tx0} for {n} connections: kTLS did not carry them")
            if isinstance(s, Ktlsd):
                require_ktls(work, [s.name])
            per[name] = (after - before) / n
            raw[f"{name} {n}"] = {"kib_per_conn": per[name], "rss_before_kib": before, "rss_after_kib": after,
                                  "tls_curr_tx_sw_rise": tx1 - tx0, "tls_curr_rx_sw_rise": rx1 - rx0}
            log(f"  {name} kTLS, {n} idle keep-alive connections: {per[name]:.1f} KiB each (RSS {before} -> "
                f"{after} KiB; TlsCurrTxSw +{tx1 - tx0}, TlsCurrRxSw +{rx1 - rx0})")
        rows.append((f"KiB per connection, {n} idle keep-alive after one response, kTLS", per.pop("ktlsd"),
                     {**missing, **per}, ""))
    return versus_table(rows, peers.PEERS, digits=1), raw
