"""Statistics and tables: medians, percentiles, bootstrap intervals of ratios, the Markdown
ktlsd-vs-nginx table and size names. Pure functions, no I/O."""

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


def versus_table(rows, measure="measure", digits=2):
    """A Markdown table of (measure, ktlsd, nginx, goal) rows with the ktlsd/nginx ratio."""
    table = [f"| {measure} | ktlsd | nginx | ktlsd/nginx | goal |", "|---|---|---|---|---|"]
    table += [f"| {m} | {a:.{digits}f} | {b:.{digits}f} | {a / b:.2f}x | {g} |" for m, a, b, g in rows]
    return "\n".join(table)


def size_name(n):
    return f"{n >> 30} GiB" if n >= 1 << 30 else f"{n >> 20} MiB"
