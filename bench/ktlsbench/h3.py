"""Scenario h3 (this machine): HTTP/3, ktlsd (`--http3`) against Caddy (`protocols h1 h2 h3`,
quic-go), with ngtcp2's `gtlsclient` (Debian ngtcp2-client) as the QUIC load client: a 10 KiB
file requested many times over several connections at once (requests/s, server CPU per
request) and one large download on one stream (MB/s, server CPU s/GiB); ktlsd's own HTTP/2
(h2load, userspace record layer here) is measured in the same run as the CPU reference.

h2load here is built without HTTP/3, so gtlsclient drives the load: one process per
connection, each sending its requests as fast as the server's stream limit lets it."""

import os
import random
import subprocess
import time

from . import crypto, peers
from .clients import h2load
from .servers import Ktlsd
from .stats import median, size_name, versus_table
from .system import children_cpu_seconds, cpu_seconds, log, make_file


class CaddyH3(peers.Caddy):
    """Caddy as peers.Caddy configures it, with HTTP/3 on too."""
    h3 = True


def gtlsclient(port, path, n=1, download=None):
    """One gtlsclient connection requesting `path` n times; fails on a non-zero exit."""
    cmd = ["gtlsclient", "-q", "--no-quic-dump", "--no-http-dump", "--exit-on-all-streams-close",
           "--timeout=30s", "-n", str(n)]
    if download:
        cmd.append(f"--download={download}")
    cmd += ["127.0.0.1", str(port), f"https://localhost:{port}/{path}"]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def finish(procs, what):
    for p in procs:
        _, err = p.communicate(timeout=600)
        if p.returncode != 0:
            raise RuntimeError(f"gtlsclient against {what} failed ({p.returncode}): {err[-2000:]}")


def many_streams(s, conns, per_conn):
    """conns gtlsclient connections at once, per_conn 10 KiB requests each: (req/s, CPU ms per 1000 requests)."""
    c0, t0 = cpu_seconds(s.pids()), time.monotonic()
    finish([gtlsclient(s.port, "10k.bin", per_conn) for _ in range(conns)], s.name)
    secs, cpu = time.monotonic() - t0, cpu_seconds(s.pids()) - c0
    n = conns * per_conn
    return n / secs, cpu * 1e6 / n


def download(s, big, work):
    """One stream of big.bin, saved and checked: (MB/s, server CPU s/GiB, the client's CPU over the
    download's wall time in cores: near 1.00, the one-thread gtlsclient set the speed)."""
    out = os.path.join(work, f"dl-{s.name}")
    os.makedirs(out, exist_ok=True)
    c0, w0, t0 = cpu_seconds(s.pids()), children_cpu_seconds(), time.monotonic()
    finish([gtlsclient(s.port, "big.bin", 1, out)], s.name)
    secs, cpu = time.monotonic() - t0, cpu_seconds(s.pids()) - c0
    client = (children_cpu_seconds() - w0) / secs
    got = os.path.getsize(os.path.join(out, "big.bin"))
    os.remove(os.path.join(out, "big.bin"))
    if got != big:
        raise RuntimeError(f"{s.name}: downloaded {got} of {big} bytes over HTTP/3")
    return big / secs / 1e6, cpu / (big / (1 << 30)), client


def scenario_h3(args, work):
    root = os.path.join(work, "www")
    os.makedirs(root)
    big = 1 << 30 if not args.quick else 64 << 20
    make_file(os.path.join(root, "big.bin"), big)
    make_file(os.path.join(root, "10k.bin"), 10 * 1024)
    ktlsd = Ktlsd("ktlsd", args.ktlsd, root, 18443, work, ["--http3"])
    servers, missing = [ktlsd], {p: "not run: h3 compares with Caddy" for p in peers.PEERS if p != "caddy"}
    try:
        if "caddy" in peers.PEERS:
            servers.append(CaddyH3("caddy", root, 18444, work, http2=True))
        conns, per_conn = 8, 2000 if not args.quick else 500
        res = {s.name: {"rps": [], "cpu_ms_per_1000": [], "speed": [], "cpu_per_gib": [], "client_cores": []}
               for s in servers}
        h2_cpu = []
        for i in range(args.runs):
            for s in random.sample(servers, len(servers)):
                rps, cpu = many_streams(s, conns, per_conn)
                speed, per_gib, client = download(s, big, work)
                r = res[s.name]
                r["rps"].append(rps)
                r["cpu_ms_per_1000"].append(cpu)
                r["speed"].append(speed)
                r["cpu_per_gib"].append(per_gib)
                r["client_cores"].append(client)
            # ktlsd's own HTTP/2 on the same file: the CPU reference.
            c0 = cpu_seconds(ktlsd.pids())
            h2load(["-n1", "-c1", f"https://127.0.0.1:{ktlsd.port}/big.bin"])
            h2_cpu.append((cpu_seconds(ktlsd.pids()) - c0) / (big / (1 << 30)))
            log(f"  run {i + 1}/{args.runs}: " + ", ".join(
                f"{n} {v['rps'][-1]:.0f} req/s {v['speed'][-1]:.0f} MB/s {v['cpu_per_gib'][-1]:.2f} s/GiB"
                for n, v in res.items()) + f"; ktlsd HTTP/2 {h2_cpu[-1]:.2f} s/GiB")
    finally:
        for s in servers:
            s.stop()
    # The kernel's least cost of sending QUIC's packets here, as quinn batches them (10 per
    # send) to a client that asks for no GRO, as gtlsclient does.
    floor = crypto.udp_floor(args.aead_seconds)
    k = res["ktlsd"]
    other = lambda key: {**missing, **{n: median(v[key]) for n, v in res.items() if n != "ktlsd"}}
    rows = [
        (f"10 KiB, {conns} connections x {per_conn} requests (gtlsclient), median req/s", median(k["rps"]),
         other("rps"), ">= 1.5"),
        ("server CPU ms per 1000 requests, median", median(k["cpu_ms_per_1000"]), other("cpu_ms_per_1000"), "<= 1.0"),
        (f"{size_name(big)} one stream (gtlsclient), median MB/s", median(k["speed"]), other("speed"), ">= 1.5"),
        ("server CPU s per GiB, median", median(k["cpu_per_gib"]), other("cpu_per_gib"), "<= 1.0"),
    ]
    table = versus_table(rows, peers.PEERS, "measure (HTTP/3)")
    table += ("\n\nThe client's CPU in the downloads (gtlsclient: one thread), median cores: "
              + ", ".join(f"{n} {median(v['client_cores']):.2f}" for n, v in res.items()) + ".")
    ref = median(h2_cpu)
    table += (f"\n\nktlsd HTTP/2 ({size_name(big)}, h2load -n1 -c1, userspace record layer): {ref:.2f} CPU s/GiB; "
              f"ktlsd HTTP/3 / HTTP/2: {median(k['cpu_per_gib']) / ref:.2f}x (goal <= 2.0)\n"
              f"UDP floor (kernel time alone of sending 1452-byte datagrams, 10 per send, over loopback to a "
              f"receiver without GRO): {floor['cpu_s_per_gib']:.2f} CPU s/GiB, {floor['cpu_s_per_gib'] / ref:.2f}x "
              f"ktlsd's HTTP/2; ktlsd HTTP/3 / UDP floor: {median(k['cpu_per_gib']) / floor['cpu_s_per_gib']:.2f}x\n")
    return table, {**res, "ktlsd_h2_cpu_per_gib": h2_cpu, "udp_floor": floor}
