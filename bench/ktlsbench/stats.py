"""Statistics and tables: medians, percentiles, bootstrap intervals of ratios, the Markdown
ktlsd-vs-peers table and size names. Pure functions, no I/O."""

import random
import statistics


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def pct(xs, p):
    if not xs:
        return float("nan")
    s = sorted(xs)
    k = (len(s) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def ratio_ci(a, b, p, rounds=2000):
    """pct(a, p) / pct(b, p), and the 2.5th and 97.5th percentiles of that ratio
    over `rounds` bootstrap resamples of both samples."""
    rng = random.Random(1)
    boot = sorted(pct(rng.choices(a, k=len(a)), p) / pct(rng.choices(b, k=len(b)), p) for _ in range(rounds))
    return pct(a, p) / pct(b, p), pct(boot, 2.5), pct(boot, 97.5)


def pct_ci(xs, p, rounds=1000):
    """pct(xs, p) and its 95% bootstrap interval (2.5th and 97.5th percentiles of the
    percentile over `rounds` resamples)."""
    if not xs:
        return float("nan"), float("nan"), float("nan")
    rng = random.Random(1)
    boot = sorted(pct(rng.choices(xs, k=len(xs)), p) for _ in range(rounds))
    return pct(xs, p), pct(boot, 2.5), pct(boot, 97.5)


def versus_table(rows, peers, measure="measure", digits=2, ours="ktlsd"):
    """A Markdown table of (measure, ktlsd's value, {peer: value}, goal) rows: a value and a
    ktlsd/peer ratio column per peer. A peer's value may be a string saying why it has none
    (e.g. "no kTLS"); its cells then say so."""
    head = f"| {measure} | {ours} | " + " | ".join(f"{p} | {ours}/{p}" for p in peers) + " | goal |"
    table = [head, "|---" * (3 + 2 * len(peers)) + "|"]
    for m, a, others, goal in rows:
        cells = []
        for p in peers:
            b = others.get(p, "not run")
            if isinstance(b, str):
                cells += [f"n/a ({b})", "-"]
            else:
                cells += [f"{b:.{digits}f}", f"{a / b:.2f}x" if b else "-"]
        table.append(f"| {m} | {a:.{digits}f} | " + " | ".join(cells) + f" | {goal} |")
    return "\n".join(table)


def size_name(n):
    return f"{n >> 30} GiB" if n >= 1 << 30 else f"{n >> 20} MiB"
