"""Scenario cold (VM): a hot 10 KiB file fetched by wrk while other clients download cold large
files from a slow dm-delay disk: the hot file's p50/p99, idle and loaded, per server: ktlsd kTLS and
userspace, nginx default and with `aio threads`, and the other selected peers (lighttpd with kTLS)."""

import functools
import os
import re
import subprocess
import time

from . import peers
from .clients import curl_download, wrk_latency
from .peers import Nginx
from .servers import Ktlsd, require_ktls
from .system import log, make_file, sh


COLD_FILE_SIZE = 16 << 20


def slow_disk(work, delay_ms, size):
    """An ext4 filesystem on a loop file under dm-delay: every read waits delay_ms
    (writes do not, so filling it is quick). Returns (mount point, teardown)."""
    sh(["modprobe", "loop"])
    sh(["modprobe", "dm-delay"])
    img = os.path.join(work, "slow.img")
    with open(img, "wb") as f:
        f.truncate(size)
    loop = sh(["losetup", "-f", "--show", img]).strip()
    sectors = sh(["blockdev", "--getsz", loop]).strip()
    name = f"ktlsd-slow-{os.getpid()}"
    sh(["dmsetup", "create", name, "--table", f"0 {sectors} delay {loop} 0 {delay_ms} {loop} 0 0"])
    subprocess.run(["dmsetup", "mknodes"], check=False)
    dev = f"/dev/mapper/{name}"
    sh(["mkfs.ext4", "-q", dev])
    mnt = os.path.join(work, "slow")
    os.makedirs(mnt)
    sh(["mount", dev, mnt])

    def teardown():
        for cmd in (["umount", mnt], ["dmsetup", "remove", name], ["losetup", "-d", loop]):
            subprocess.run(cmd, check=False)
    return mnt, teardown


def evict(path):
    with open(path, "rb") as f:
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def cold_clients(port, root, files, n, rate, stop):
    """n curl loops, each downloading its own cold files in turn (dropped from the
    page cache just before each download, and by no other client meanwhile).
    Returns the threads and a list that collects each download's bytes."""
    import threading
    done, procs = [], {}

    def loop(c):
        mine = files[c::n]
        i = 0
        while not stop.is_set():
            name = mine[i % len(mine)]
            i += 1
            evict(os.path.join(root, name))
            p = subprocess.Popen(["curl", "-sk", "--http1.1", "--limit-rate", rate, "-o", "/dev/null",
                                  "-w", "%{size_download}", f"https://127.0.0.1:{port}/{name}"],
                                 stdout=subprocess.PIPE, text=True)
            procs[c] = p
            out, _ = p.communicate()
            if p.returncode == 0:
                done.append(int(out))
    threads = [threading.Thread(target=loop, args=(c,), daemon=True) for c in range(n)]
    for t in threads:
        t.start()

    def halt():
        stop.set()
        for p in list(procs.values()):
            if p.poll() is None:
                p.terminate()
        for t in threads:
            t.join()
    return halt, done


def sample_wchan(pids, stop, seen):
    """Counts, every 20 ms until stop, where each thread of pids sleeps in the
    kernel (/proc/PID/task/TID/wchan), by thread name: shows what a stalled
    event loop waits for."""
    while not stop.wait(0.02):
        for pid in pids:
            try:
                tids = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue
            for tid in tids:
                try:
                    with open(f"/proc/{pid}/task/{tid}/comm") as f:
                        comm = f.read().strip()
                    with open(f"/proc/{pid}/task/{tid}/wchan") as f:
                        wchan = f.read().strip() or "running"
                except OSError:  # connections refused or reset: show the start-up lines (fd budget, kTLS)
                    continue
                seen[(comm, wchan)] = seen.get((comm, wchan), 0) + 1


def scenario_cold(args, work):
    import threading
    mnt, teardown = slow_disk(work, args.cold_delay_ms, 512 << 20)
    try:
        hot = os.path.join(mnt, "hot.bin")
        make_file(hot, 10 * 1024)
        files = [f"cold{i}.bin" for i in range(2 * args.cold_clients)]
        for name in files:
            make_file(os.path.join(mnt, name), COLD_FILE_SIZE)
        sh(["sync"])
        rows, raw = [], {}
        makers = [
            ("ktlsd (kTLS)", lambda: Ktlsd("ktlsd", args.ktlsd, mnt, 18443, work, ["--ktls", "on"])),
            ("ktlsd (userspace)", lambda: Ktlsd("ktlsd-us", args.ktlsd, mnt, 18446, work, ["--ktls", "off"])),
        ]
        if "nginx" in peers.PEERS:
            makers += [("nginx default", lambda: Nginx("nginx", mnt, 18444, work)),
                       ("nginx aio threads", lambda: Nginx("nginx-aio", mnt, 18445, work, extra="aio threads;"))]
        for i, kind in enumerate(k for k in peers.PEERS if k != "nginx"):
            ktls = peers.missing(kind, ktls=True) is None
            makers.append((f"{kind} ({'kTLS' if ktls else 'userspace TLS'})",
                           functools.partial(peers.KINDS[kind], kind, mnt, 18450 + i, work, ktls=ktls)))
        for label, make in makers:
            for name in files:
                evict(os.path.join(mnt, name))
            s = make()
            try:
                curl_download(f"https://127.0.0.1:{s.port}/hot.bin")  # the hot file is hot
                idle = wrk_latency(s.port, "hot.bin", args.duration, 4)
                halt, done = cold_clients(s.port, mnt, files, args.cold_clients, args.cold_rate, threading.Event())
                time.sleep(2)
                stop_sampling, waits = threading.Event(), {}
                sampler = threading.Thread(target=sample_wchan, args=(s.pids(), stop_sampling, waits), daemon=True)
                sampler.start()
                try:
                    loaded = wrk_latency(s.port, "hot.bin", args.duration, 4)
                finally:
                    stop_sampling.set()
                    halt()
                top = sorted(waits.items(), key=lambda kv: -kv[1])[:8]
                log(f"  {label}: where its threads slept under load (samples): " +
                    ", ".join(f"{c}/{w}={n}" for (c, w), n in top))
            finally:
                s.stop()
            cold_mb = sum(done) / 1e6
            extra = ""
            if isinstance(s, Ktlsd):
                with open(os.path.join(work, f"{s.name}.err")) as f:
                    m = re.search(r"cold_windows=(\d+) readahead_waits=(\d+)", f.read())
                extra = f"cold_windows={m.group(1)} readahead_waits={m.group(2)}" if m else "no counters"
                if s.name == "ktlsd":
                    require_ktls(work, ["ktlsd"])
            log(f"  {label}: idle p50 {idle[0]:.2f} ms p99 {idle[1]:.2f} ms; loaded p50 {loaded[0]:.2f} ms "
                f"p99 {loaded[1]:.2f} ms; {len(done)} cold downloads done {extra}")
            rows.append((label, idle, loaded, len(done), extra))
            raw[label] = {"idle": idle, "loaded": loaded, "cold_downloads_done": len(done), "cold_mb": cold_mb,
                          "counters": extra}
    finally:
        teardown()
    table = [f"Hot 10 KiB file, wrk -t1 -c4 -d{args.duration}s --latency; loaded: {args.cold_clients} curl clients "
             f"at {args.cold_rate}B/s each downloading {COLD_FILE_SIZE >> 20} MiB files dropped from the page cache, "
             f"disk reads delayed {args.cold_delay_ms} ms (dm-delay).", "",
             "| server | idle p50 ms | idle p99 ms | loaded p50 ms | loaded p99 ms | loaded p99 / idle p99 | "
             "hot req/s loaded | cold downloads finished |", "|---|---|---|---|---|---|---|---|"]
    for label, idle, loaded, n, _ in rows:
        if loaded[1] == 0:  # wrk saw no response complete
            table.append(f"| {label} | {idle[0]:.2f} | {idle[1]:.2f} | no response | no response | - | 0 | {n} |")
            continue
        table.append(f"| {label} | {idle[0]:.2f} | {idle[1]:.2f} | {loaded[0]:.2f} | {loaded[1]:.2f} | "
                     f"{loaded[1] / idle[1]:.1f}x | {loaded[2]:.0f} | {n} |")
    table += ["", "Goal: ktlsd's loaded p99 within 2x its idle p99.", ""]
    ours = {label: loaded for label, _, loaded, _, _ in rows}.get("ktlsd (kTLS)")
    for label, _, loaded, _, _ in rows:
        if ours and not label.startswith("ktlsd") and loaded[1] and ours[1]:
            table.append(f"- ktlsd (kTLS) loaded p99 / {label} loaded p99: {ours[1] / loaded[1]:.2f}x")
    return "\n".join(table), raw
