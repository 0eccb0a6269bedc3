"""Scenario h3 (this machine): HTTP/3, ktlsd (`--http3`) against Caddy (`protocols h1 h2 h3`,
quic-go), with two QUIC load clients: `h3client` (bench/h3client: quinn, the stack ktlsd
uses, receiving with UDP GRO, wide windows, one thread) and ngtcp2's `gtlsclient` (Debian
ngtcp2-client: no GRO, one process per connection). Each does a 10 KiB file requested many
times over several connections at once (requests/s, server CPU per request) and one large
download on one stream (MB/s, server CPU s/GiB). The servers run on CPU 0 and the clients on
CPU 1 (`taskset`), so the client is not the server's competitor for a core. Measured in the
same run: ktlsd's own HTTP/2 (h2load, userspace record layer here) as the CPU reference; the
server's system calls (`perf stat` on its syscall tracepoints) and, from h3client's counters,
the datagrams per MB; and the kernel's floor of sending those datagrams with no QUIC at all
(`crypto.udp_floor`), as quinn upstream batches them (10 per send, no GRO at the receiver)
and as ktlsd now does (as many as one GSO send takes, GRO at the receiver).

h2load here is built without HTTP/3, hence gtlsclient and h3client."""

import json
import os
import random
import signal
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


SERVER_CPU, CLIENT_CPU = "0", "1"
# What h3client's (bench/h3client) binary is, set by bench/run (built into target/release).
H3CLIENT = os.environ.get("KTLSD_BENCH_H3CLIENT", "target/release/h3client")
# The server's system calls counted during a download (perf's syscall tracepoints).
SYSCALLS = ["sendmsg", "sendmmsg", "recvmsg", "recvmmsg", "epoll_wait", "preadv2", "read", "write", "futex"]


def pin(pids, cpu):
    """Every thread of these processes (and the threads they start later) onto `cpu`."""
    for pid in pids:
        subprocess.run(["taskset", "-a", "-p", "-c", cpu, str(pid)], check=True, stdout=subprocess.DEVNULL)


class Syscalls:
    """`perf stat` counting a process's system calls, all and by name, until stop()."""

    def __init__(self, pids):
        events = ["raw_syscalls:sys_enter"] + [f"syscalls:sys_enter_{n}" for n in SYSCALLS]
        self.proc = subprocess.Popen(["perf", "stat", "-x,", "-e", ",".join(events), "-p", ",".join(map(str, pids))],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        time.sleep(0.3)  # perf attaches

    def stop(self):
        self.proc.send_signal(signal.SIGINT)
        _, err = self.proc.communicate(timeout=30)
        counts = {}
        for line in err.splitlines():
            f = line.split(",")
            if len(f) > 2 and f[0].isdigit():
                name = f[2].rsplit(":", 1)[-1].replace("sys_enter_", "")
                counts["all" if name == "sys_enter" else name] = int(f[0])
        return counts


def h3client(port, path, conns=1, requests=1, streams=16, download=False):
    """h3client on CLIENT_CPU: its JSON line (requests, bytes, seconds, datagrams received...)."""
    cmd = ["taskset", "-c", CLIENT_CPU, H3CLIENT, f"127.0.0.1:{port}", f"https://localhost:{port}/{path}"]
    cmd += ["--download"] if download else ["--conns", str(conns), "--requests", str(requests),
                                             "--streams", str(streams)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise RuntimeError(f"h3client on port {port} failed ({p.returncode}): {p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def gtlsclient(port, path, n=1, download=None):
    """One gtlsclient connection requesting `path` n times, on CLIENT_CPU; fails on a non-zero exit."""
    cmd = ["taskset", "-c", CLIENT_CPU, "gtlsclient", "-q", "--no-quic-dump", "--no-http-dump", "--exit-on-all-streams-close",
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


def many_streams_quinn(s, conns, per_conn):
    """h3client: conns connections at once, per_conn 10 KiB requests each, 16 streams at a time."""
    c0, w0 = cpu_seconds(s.pids()), children_cpu_seconds()
    got = h3client(s.port, "10k.bin", conns, per_conn)
    cpu, n = cpu_seconds(s.pids()) - c0, got["requests"]
    if got["bytes"] != n * 10 * 1024:
        raise RuntimeError(f"{s.name}: {got['bytes']} bytes for {n} requests of 10 KiB over HTTP/3")
    return n / got["seconds"], cpu * 1e6 / n, (children_cpu_seconds() - w0) / got["seconds"]


def download_quinn(s, big):
    """h3client: one stream of big.bin, counted: MB/s, server CPU s/GiB, client cores, the server's
    system calls per MB, datagrams the client received and ACK frames it sent per MB."""
    calls = Syscalls(s.pids())
    c0, w0 = cpu_seconds(s.pids()), children_cpu_seconds()
    got = h3client(s.port, "big.bin", download=True)
    cpu = cpu_seconds(s.pids()) - c0
    counts = calls.stop()
    if got["bytes"] != big:
        raise RuntimeError(f"{s.name}: downloaded {got['bytes']} of {big} bytes over HTTP/3")
    mb = big / 1e6
    return {"speed": mb / got["seconds"], "cpu_per_gib": cpu / (big / (1 << 30)),
            "client_cores": (children_cpu_seconds() - w0) / got["seconds"],
            "syscalls_per_mb": {k: v / mb for k, v in counts.items()},
            "datagrams_per_mb": got["rx_datagrams"] / mb, "client_acks_per_mb": got["acks_sent"] / mb}


def scenario_h3(args, work):
    root = os.path.join(work, "www")
    os.makedirs(root)
    big = 1 << 30 if not args.quick else 64 << 20
    make_file(os.path.join(root, "big.bin"), big)
    make_file(os.path.join(root, "10k.bin"), 10 * 1024)
    ktlsd = Ktlsd("ktlsd", args.ktlsd, root, 18443, work, ["--http3"])
    servers, missing = [ktlsd], {p: "not run: h3 compares with Caddy" for p in peers.PEERS if p != "caddy"}
    keys = ["rps", "cpu_ms_per_1000", "speed", "cpu_per_gib", "client_cores",
            "q_rps", "q_cpu_ms_per_1000", "q_req_client_cores", "q_speed", "q_cpu_per_gib", "q_client_cores",
            "q_datagrams_per_mb", "q_client_acks_per_mb", "q_syscalls_per_mb"]
    try:
        if "caddy" in peers.PEERS:
            servers.append(CaddyH3("caddy", root, 18444, work, http2=True))
        for s in servers:
            pin(s.pids(), SERVER_CPU)
        conns, per_conn = 8, 2000 if not args.quick else 500
        res = {s.name: {k: [] for k in keys} for s in servers}
        h2_cpu, floors = [], {"upstream": [], "ktlsd": []}
        for i in range(args.runs):
            for s in random.sample(servers, len(servers)):
                r = res[s.name]
                for k, v in zip(["q_rps", "q_cpu_ms_per_1000", "q_req_client_cores"],
                                many_streams_quinn(s, conns, per_conn)):
                    r[k].append(v)
                for k, v in download_quinn(s, big).items():
                    r["q_" + k].append(v)
                rps, cpu = many_streams(s, conns, per_conn)
                speed, per_gib, client = download(s, big, work)
                r["rps"].append(rps)
                r["cpu_ms_per_1000"].append(cpu)
                r["speed"].append(speed)
                r["cpu_per_gib"].append(per_gib)
                r["client_cores"].append(client)
            # ktlsd's own HTTP/2 on the same file: the CPU reference.
            c0 = cpu_seconds(ktlsd.pids())
            h2load(["-n1", "-c1", f"https://127.0.0.1:{ktlsd.port}/big.bin"])
            h2_cpu.append((cpu_seconds(ktlsd.pids()) - c0) / (big / (1 << 30)))
            # The kernel's least cost of sending QUIC's packets here: as upstream quinn batches
            # them (10 per send) to a receiver without GRO (gtlsclient), and as ktlsd now does
            # (as many 1452-byte datagrams as one GSO send takes: 44) to one with GRO (h3client).
            floors["upstream"].append(crypto.udp_floor(args.aead_seconds, segments=10, gro=False)["cpu_s_per_gib"])
            floors["ktlsd"].append(crypto.udp_floor(args.aead_seconds, segments=44, gro=True)["cpu_s_per_gib"])
            log(f"  run {i + 1}/{args.runs}: " + ", ".join(
                f"{n} h3client {v['q_rps'][-1]:.0f} req/s {v['q_speed'][-1]:.0f} MB/s {v['q_cpu_per_gib'][-1]:.2f} "
                f"s/GiB, gtlsclient {v['rps'][-1]:.0f} req/s {v['speed'][-1]:.0f} MB/s {v['cpu_per_gib'][-1]:.2f} s/GiB"
                for n, v in res.items()) + f"; ktlsd HTTP/2 {h2_cpu[-1]:.2f} s/GiB; UDP floors "
                f"{floors['upstream'][-1]:.2f} / {floors['ktlsd'][-1]:.2f} s/GiB")
    finally:
        for s in servers:
            s.stop()
    k = res["ktlsd"]
    other = lambda key: {**missing, **{n: median(v[key]) for n, v in res.items() if n != "ktlsd"}}
    rows = [
        (f"10 KiB, {conns} connections x {per_conn} requests (h3client), median req/s", median(k["q_rps"]),
         other("q_rps"), ">= 1.5"),
        ("server CPU ms per 1000 requests, median", median(k["q_cpu_ms_per_1000"]), other("q_cpu_ms_per_1000"),
         "<= 0.5"),
        (f"{size_name(big)} one stream (h3client), median MB/s", median(k["q_speed"]), other("q_speed"), ">= 1.5"),
        ("server CPU s per GiB, median", median(k["q_cpu_per_gib"]), other("q_cpu_per_gib"), "<= 0.5"),
        ("server system calls per MB (download), median", median([c["all"] for c in k["q_syscalls_per_mb"]]),
         other_calls(res, missing, "all"), "-"),
        ("datagrams per MB (download, as the client received them)", median(k["q_datagrams_per_mb"]),
         other("q_datagrams_per_mb"), "-"),
        (f"10 KiB, {conns} connections x {per_conn} requests (gtlsclient), median req/s", median(k["rps"]),
         other("rps"), ">= 1.5"),
        ("server CPU ms per 1000 requests, median", median(k["cpu_ms_per_1000"]), other("cpu_ms_per_1000"), "<= 0.5"),
        (f"{size_name(big)} one stream (gtlsclient), median MB/s", median(k["speed"]), other("speed"), ">= 1.5"),
        ("server CPU s per GiB, median", median(k["cpu_per_gib"]), other("cpu_per_gib"), "<= 0.5"),
    ]
    table = versus_table(rows, peers.PEERS, "measure (HTTP/3)")
    table += ("\n\nThe clients' CPU over the wall time, median cores (1.00: a client's one thread was busy "
              "throughout): h3client requests " + ", ".join(f"{n} {median(v['q_req_client_cores']):.2f}"
                                                          for n, v in res.items())
              + "; h3client download " + ", ".join(f"{n} {median(v['q_client_cores']):.2f}" for n, v in res.items())
              + "; gtlsclient download " + ", ".join(f"{n} {median(v['client_cores']):.2f}" for n, v in res.items())
              + ".")
    table += "\n\nServer system calls per MB in the h3client download, median:\n\n| call | " + \
        " | ".join(res) + " |\n|---|" + "---|" * len(res) + "\n" + "\n".join(
            f"| {c} | " + " | ".join(f"{median([x.get(c, 0) for x in v['q_syscalls_per_mb']]):.1f}"
                                     for v in res.values()) + " |" for c in ["all"] + SYSCALLS)
    table += ("\n\nh3client per MB of the download, median: " + ", ".join(
        f"{n} {median(v['q_datagrams_per_mb']):.0f} datagrams received, {median(v['q_client_acks_per_mb']):.1f} "
        f"ACK frames sent" for n, v in res.items()) + ".")
    ref, q, g = median(h2_cpu), median(k["q_cpu_per_gib"]), median(k["cpu_per_gib"])
    fu, fk = median(floors["upstream"]), median(floors["ktlsd"])
    table += (f"\n\nktlsd HTTP/2 ({size_name(big)}, h2load -n1 -c1, userspace record layer): {ref:.2f} CPU s/GiB.\n"
              f"ktlsd HTTP/3 / HTTP/2: {q / ref:.2f}x with h3client, {g / ref:.2f}x with gtlsclient (goal <= 3.0).\n"
              f"UDP floor (kernel time alone of sending 1452-byte datagrams over loopback, the sending thread's "
              f"system time): 10 per send to a receiver without GRO {fu:.2f} CPU s/GiB ({fu / ref:.2f}x HTTP/2; "
              f"gtlsclient's HTTP/3 / floor {g / fu:.2f}x); 44 per send to a receiver with GRO {fk:.2f} CPU s/GiB "
              f"({fk / ref:.2f}x HTTP/2; h3client's HTTP/3 / floor {q / fk:.2f}x).\n")
    return table, {**res, "ktlsd_h2_cpu_per_gib": h2_cpu, "udp_floor": floors}


def other_calls(res, missing, call):
    return {**missing, **{n: median([c.get(call, 0) for c in v["q_syscalls_per_mb"]])
                          for n, v in res.items() if n != "ktlsd"}}
