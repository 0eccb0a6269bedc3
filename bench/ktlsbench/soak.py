"""Scenario soak (this machine): the fault soak. The release binary serves static files, proxies
to a Python origin, caches the origin's answers on a small tmpfs, answers ranges and compresses
on the fly, over HTTP/1.1, HTTP/2 and HTTP/3, for --minutes while faults are injected on a
schedule; every response is checked against its source of truth.

Traffic: four client processes, each looping until the end of the run over a random mix of
static files whole, static ranges, text files with `Accept-Encoding: gzip` (decompressed before
the check), cacheable origin objects (`/cache/`), ranges of them, new cacheable objects (each
asked for once: stored, evicting others by `max_size`), and uncacheable origin answers
(`/pass/`, `no-store`, a fresh query string each time):
- two HTTP/1.1 clients (Python `http.client`, keep-alive connections; a request on a reused
  connection that the server closed before any byte of the answer is sent again once on a new
  connection, as curl and browsers do: RFC 9112 section 9.3.1),
- one HTTP/2 client (`curl --http2 --parallel`, 8 requests multiplexed on one connection per
  curl process),
- one HTTP/3 client (Python `aioquic`, one long-lived QUIC connection, 4 requests at once).
Every answer is checked: status (200, or 206 with the right Content-Range for a range), length
and SHA-256 against the source (the file under ROOT, or the origin's body, which is a function
of its path), a range against the slice of the source, a gzip body after decompressing it.

Faults (`FAULTS`, one after another with a gap, the cycle repeated until the end): the origin
killed (SIGKILL) and restarted; the origin slow (head after 1.5 s, body in four pieces 0.3 s
apart: within `read_timeout`); the origin answering garbage (a head that is not HTTP, or a head
with its body cut in the middle); one SIGKILL of ktlsd and a restart (first cycle only); the
cache's tmpfs filled by a file written until ENOSPC, held, then deleted; ktlsd's RLIMIT_NOFILE
soft limit lowered to 32 below the descriptors it has open (`prlimit`), held, then restored. Besides these,
a reload (SIGHUP) every 5 s with a changed configuration (a response field on static files and
the proxy's `read_timeout`), all run long.

A failure is explained only by a fault whose window (plus `GRACE` s after it) overlaps the
request, and only when that fault can cause that symptom (`EXPLAINS`): a 502/504 or a cut body
of an origin answer while the origin is down, slow or sending garbage; a refused connection,
a reset or a timeout while ktlsd is killed or its descriptors are exhausted. A reload and a full
cache disk explain nothing: they must fail no request. Any unexplained failure, any corrupt
byte (a body of the right status whose bytes differ from the source) or RSS that is not flat
(mean of the last 5 minutes more than 10% off the mean of minutes 5-10; judged on runs of 15
minutes or more) fails the run.

The server's RSS and open descriptors are sampled from /proc every 2 s. At the end every cache
object is fetched once more and checked (those answered as a hit are the verified stored entries),
and `ktlsd_cache_entries` is read from the admin listener.

Here: the scenario, the failures' explanation and the report; the traffic and its checks are in
soak_traffic, the origin, ktlsd's process, the faults and the sampler in soak_faults."""

import collections
import http.client
import json
import multiprocessing
import os
import re
import subprocess
import threading
import time
import urllib.request

from . import plots, servers
from .soak_faults import ADMIN_PORT, Faults, Origin, Server, sampler, write_config
from .soak_traffic import (CACHE_OBJECTS, PORT, REQUEST_TIMEOUT, Req, Truth, client_context, client_h1, client_h2,
                           client_h3, make_root, verify)
from .system import log

TMPFS_SIZE = "24m"  # the cache's file system: small, so that it can be filled
GRACE = 5.0  # seconds after a fault ends during which it still explains a failure

# A fault and the symptoms it explains, for which kinds of request. Kinds: static, range,
# gzip (files under ROOT), cache, cache-range (cacheable origin objects), cache-new (a cacheable
# object asked for once), pass (no-store).
ORIGIN_KINDS = {"cache", "cache-range", "cache-new", "pass"}
ALL_KINDS = {"static", "range", "gzip"} | ORIGIN_KINDS
TRANSPORT = {"connect", "reset", "cut", "timeout"}
EXPLAINS = {
    "origin-down": (ORIGIN_KINDS, {"status-502", "status-503", "status-504", "cut"}),
    "origin-slow": (ORIGIN_KINDS, {"status-504", "cut"}),
    "origin-garbage": (ORIGIN_KINDS, {"status-502", "status-504", "cut"}),
    "server-sigkill": (ALL_KINDS, TRANSPORT),
    "descriptors": (ALL_KINDS, TRANSPORT | {"status-500", "status-502", "status-503", "status-504"}),
    "cache-disk-full": (set(), set()),
    "reload": (set(), set()),
}
# (fault, seconds it lasts); a gap of gap seconds follows each.
FAULTS = [("origin-down", 10), ("origin-slow", 15), ("origin-garbage", 10), ("server-sigkill", 0),
          ("cache-disk-full", 20), ("descriptors", 10)]


# --- analysis and report ------------------------------------------------------------------------

def explain(rec, windows):
    """The faults that explain a failed request, [] when none does."""
    t0, t1, _, kind, outcome = rec[:5]
    found = []
    for name, s, e, _ in windows:
        kinds, symptoms = EXPLAINS[name]
        if kind in kinds and outcome in symptoms and t0 <= e + GRACE and t1 >= s:
            found.append(name)
    return found


def cache_check(truth):
    """Fetches every cache object once more over HTTP/1.1: (answered as hits and right, hits
    wrong, objects not hits)."""
    ctx = client_context("http/1.1")
    verified = bad = other = 0
    for i in range(CACHE_OBJECTS):
        p = f"/cache/obj-{i}"
        conn = http.client.HTTPSConnection("127.0.0.1", PORT, context=ctx, timeout=30)
        conn.request("GET", p, headers={"Host": "localhost"})
        r = conn.getresponse()
        fields = {k.lower(): v for k, v in r.getheaders()}
        body = r.read()
        conn.close()
        hit = "hit" in fields.get("cache-status", "")
        wrong = verify(Req("cache", p, truth.of_origin(p)), r.status, fields, body)
        if hit and not wrong:
            verified += 1
        elif hit:
            bad += 1
            log(f"  stored entry {p} is wrong: {wrong}")
        else:
            other += 1
    return verified, bad, other


def metric(name):
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{ADMIN_PORT}/metrics", timeout=10).read().decode()
    except OSError:
        return None
    m = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.e+]+)$", text, re.M)
    return float(m.group(1)) if m else None


def mean(xs):
    return sum(xs) / len(xs) if xs else float("nan")


def chart(samples, windows, path, t0):
    plt = plots.pyplot(path)
    if plt is None:
        return
    fig, (a, b, c) = plt.subplots(3, 1, figsize=(10, 8), sharex=True)
    mins = [s[0] / 60 for s in samples]
    a.plot(mins, [s[1] for s in samples], lw=1)
    a.set_ylabel("RSS (MiB)")
    a.set_ylim(bottom=0)
    b.plot(mins, [s[2] for s in samples], lw=1, color="tab:orange")
    b.set_ylabel("open descriptors")
    b.set_ylim(bottom=0)
    c.plot(mins, [s[4] for s in samples], lw=1, color="tab:green", label="cache disk used")
    c.plot(mins, [s[6] for s in samples], lw=1, color="tab:red", label="deleted files ktlsd holds open")
    c.set_ylabel("MiB")
    c.set_ylim(bottom=0)
    c.legend(loc="upper left", fontsize=7)
    c.set_xlabel("minutes")
    colours = {"origin-down": "tab:red", "origin-slow": "tab:olive", "origin-garbage": "tab:purple",
               "server-sigkill": "black", "cache-disk-full": "tab:cyan", "descriptors": "tab:brown"}
    seen = set()
    for name, s, e, _ in windows:
        if name in colours:
            for ax in (a, b, c):
                ax.axvspan((s - t0) / 60, max(e - t0, s - t0 + 1) / 60, color=colours[name], alpha=0.2,
                           label=name if ax is a and name not in seen else None)
            seen.add(name)
    a.legend(loc="upper left", fontsize=7, ncol=3)
    a.set_title("ktlsd under the fault soak: RSS and descriptors (faults shaded)")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def scenario_soak(args, work):
    minutes = args.minutes
    reports = os.path.join(os.path.dirname(args.out), "reports")
    out = os.path.join(args.out, "soak")
    os.makedirs(out, exist_ok=True)
    servers.ACCESS_LOG = True  # ktlsd's access log goes to bench/results/soak/, for the failures
    root = os.path.join(work, "www")
    make_root(root)
    fs = os.path.join(work, "cache-fs")
    os.makedirs(fs)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE}", "tmpfs", fs], check=True)
    stop = threading.Event()
    procs, threads = [], []
    origin = server = None
    try:
        origin = Origin(work)
        cfg = os.path.join(work, "ktlsd.toml")
        write_config(cfg, work, 0)
        server = Server(args, root, work, out, cfg)
        faults = Faults(server, origin, work)
        samples = []
        t_start = time.time()
        deadline = t_start + minutes * 60
        threads = [threading.Thread(target=sampler, args=(server, samples, stop, t_start, fs)),
                   threading.Thread(target=faults.reload_loop, args=(stop,))]
        for t in threads:
            t.start()
        ctx = multiprocessing.get_context("fork")
        files = {}
        for name, fn, extra in [("h1-a", client_h1, ()), ("h1-b", client_h1, ()), ("h2", client_h2, (work,)),
                                ("h3", client_h3, ())]:
            files[name] = os.path.join(out, f"requests-{name}.jsonl")
            p = ctx.Process(target=fn, args=(root, files[name], deadline, len(procs) + 1, *extra), name=name)
            p.start()
            procs.append(p)
        gap = 15 if minutes >= 10 else 5
        time.sleep(10)
        cycle = 0
        while time.time() < deadline - 25:
            for name, secs in FAULTS:
                if name == "server-sigkill" and cycle:
                    continue
                if time.time() + secs > deadline - 15:
                    break
                faults.run(name, secs)
                time.sleep(min(gap, max(0, deadline - time.time())))
            cycle += 1
        for p in procs:
            p.join(timeout=max(0, deadline - time.time()) + REQUEST_TIMEOUT * 5)
            if p.is_alive():
                p.kill()
                raise RuntimeError(f"client {p.name} did not finish")
            if p.exitcode != 0:
                raise RuntimeError(f"client {p.name} exited with {p.exitcode}")
        stop.set()
        for t in threads:
            t.join()
        time.sleep(3)
        fds_end = len(os.listdir(f"/proc/{server.pid}/fd"))
        entries = metric("ktlsd_cache_entries")
        verified, wrong, not_hit = cache_check(Truth(root))
        fds_after = len(os.listdir(f"/proc/{server.pid}/fd"))
        with server.lock:
            server.k.stop()
    finally:
        stop.set()
        for t in threads:
            if t.is_alive():
                t.join()
        for p in procs:
            if p.is_alive():
                p.kill()
        if origin and origin.proc:
            origin.kill()
        if server and server.k.proc.poll() is None:
            server.k.proc.kill()
            server.k.proc.wait()
        subprocess.run(["umount", "-l", fs], check=False)

    records = []
    for name, path in files.items():
        with open(path) as f:
            records += [json.loads(l) for l in f]
    windows = faults.windows
    per_proto = collections.Counter(r[2] for r in records)
    per_kind = collections.Counter(r[3] for r in records)
    failures = [r for r in records if r[4] != "ok"]
    explained, unexplained = collections.Counter(), []
    for r in failures:
        why = explain(r, windows)
        if why:
            explained[(r[4], "+".join(sorted(set(why))))] += 1
        else:
            unexplained.append(r)
    corrupt = [r for r in records if r[4] in ("corrupt", "length", "wrong-range")]
    retried = sum("retried" in r[6] for r in records)
    hits = sum("hit" in r[6] for r in records if r[4] == "ok")
    gz = sum("gz" in r[6] for r in records if r[4] == "ok")
    ranges206 = sum(1 for r in records if r[4] == "ok" and r[3] in ("range", "cache-range"))

    # RSS flat: the last 5 minutes against minutes 5-10.
    base = [s[1] for s in samples if 300 <= s[0] < 600]
    last = [s[1] for s in samples if s[0] >= minutes * 60 - 300]
    if minutes >= 15 and base and last:
        ratio = mean(last) / mean(base)
        rss_flat = abs(ratio - 1) <= 0.10
        rss_line = (f"mean {mean(base):.1f} MiB in minutes 5-10, {mean(last):.1f} MiB in the last 5 minutes: "
                    f"{ratio:.3f}x, {'flat' if rss_flat else 'NOT flat'} (goal: within 10%)")
        fbase = [s[2] for s in samples if 300 <= s[0] < 600]
        flast = [s[2] for s in samples if s[0] >= minutes * 60 - 300]
        fd_line = (f"descriptors: max {max(fbase)} (mean {mean(fbase):.0f}) in minutes 5-10, max {max(flast)} "
                   f"(mean {mean(flast):.0f}) in the last 5 minutes")
    else:
        rss_flat, rss_line = True, f"not judged: a run of {minutes} minutes has no minutes 5-10 and last 5 apart"
        fd_line = "descriptors: see the table"

    svg = f"soak-{minutes}m.svg"
    os.makedirs(reports, exist_ok=True)
    chart(samples, windows, os.path.join(reports, svg), t_start)

    faults_table = ["| fault | times | total seconds | details (first) |", "|---|---|---|---|"]
    by = collections.defaultdict(list)
    for w in windows:
        by[w[0]].append(w)
    for name in [f for f, _ in FAULTS] + ["reload"]:
        ws = by.get(name, [])
        faults_table.append(f"| {name} | {len(ws)} | {sum(e - s for _, s, e, _ in ws):.0f} | "
                            f"{ws[0][3] if ws else '-'} |")
    fail_table = ["| symptom | explained by | requests |", "|---|---|---|"]
    for (sym, why), n in sorted(explained.items()):
        fail_table.append(f"| {sym} | {why} | {n} |")
    for sym, n in sorted(collections.Counter(r[4] for r in unexplained).items()):
        fail_table.append(f"| {sym} | **unexplained** | {n} |")
    if len(fail_table) == 2:
        fail_table.append("| (none) | | 0 |")
    rss_rows = ["| minute | RSS MiB (mean) | descriptors (max) | server start | cache disk used MiB (max) "
                "| files on it (min) | deleted files ktlsd holds open, MiB (max) |", "|---|---|---|---|---|---|---|"]
    for m in range(minutes + 1):
        ss = [s for s in samples if m * 60 <= s[0] < (m + 1) * 60]
        if ss:
            rss_rows.append(f"| {m} | {mean([s[1] for s in ss]):.1f} | {max(s[2] for s in ss)} | {ss[-1][3]} | "
                            f"{max(s[4] for s in ss):.1f} | {min(s[5] for s in ss)} | {max(s[6] for s in ss):.1f} |")
    passed = not unexplained and not corrupt and rss_flat and wrong == 0
    load = os.getloadavg()
    text = f"""Soak of {minutes} minutes (`bench/run soak --minutes {minutes}`), ended {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}:
**{'PASSED' if passed else 'FAILED'}**. {len(records)} requests, {len(failures)} failed, of which
{len(failures) - len(unexplained)} explained by a fault and **{len(unexplained)} unexplained**;
**{len(corrupt)} corrupt** answers (a body or range that differs from the source).

The machine: 2 cores shared with other builds during the run (load average at the end
{load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}), so the request rate says little; correctness does not depend on it.
The clients, the origin and ktlsd ({servers.WORKERS} workers) share those cores.

### Requests

| protocol | requests |
|---|---|
""" + "\n".join(f"| {p} | {n} |" for p, n in sorted(per_proto.items())) + """

| kind | requests |
|---|---|
""" + "\n".join(f"| {k} | {n} |" for k, n in sorted(per_kind.items())) + f"""

Answered right: {len(records) - len(failures)}; of them {hits} cache hits, {gz} gzip bodies
(decompressed, then checked), {ranges206} ranges (206 against the slice of the source, or a
cache miss answered whole). {retried} HTTP/1.1 requests were sent again on a new connection
after the server closed a keep-alive connection first (the reload's close between requests).

### Faults

{chr(10).join(faults_table)}

### Failures by cause

A failure counts as explained when a fault whose window (plus {GRACE:.0f} s) overlaps the request
can cause that symptom; reloads and the full cache disk explain none.

{chr(10).join(fail_table)}
""" + ("\nUnexplained (first 20):\n\n```\n" + "\n".join(json.dumps(r) for r in unexplained[:20]) + "\n```\n"
       if unexplained else "") + f"""
### Memory and descriptors

![RSS and descriptors over time]({svg})

RSS: {rss_line}. {fd_line}. The server was started {server.starts} times (the SIGKILL restarts it;
the samples are of the process serving at that time). Descriptors when the load ended: {fds_end}; after
the final cache check: {fds_after}.

{chr(10).join(rss_rows)}

### Cache

Entries stored at the end (`ktlsd_cache_entries`): {entries if entries is None else int(entries)}. Each of the
{CACHE_OBJECTS} cache objects fetched once more: {verified} answered from the cache (hit) with the right
SHA-256, {wrong} hits with wrong bytes, {not_hit} not hits (evicted by `max_size`, or never stored).
"""
    with open(os.path.join(reports, f"soak-{minutes}m.md"), "w") as f:
        f.write(f"## soak, {minutes} minutes (kernel {os.uname().release})\n\n{text}")
    raw = {"passed": passed, "requests": len(records), "failures": len(failures), "unexplained": len(unexplained),
           "corrupt": len(corrupt), "explained": {f"{k[0]} / {k[1]}": v for k, v in explained.items()},
           "samples": samples, "faults": windows, "cache": {"entries": entries, "verified": verified,
                                                            "wrong": wrong, "not_hit": not_hit}}
    return text, raw
