#!/usr/bin/env python3
"""A family of random synthetic block traces, one per seed, for judging a
replacement policy on traces nobody chose: each seed draws a trace from a
space of mixtures (skewed hot sets that stay put, drift or jump; loops;
sequential scans; uniform reads over a large region; blocks read once),
whose mixing weights may change in phases. A policy tuned on some seeds is
then judged on seeds drawn after it was fixed.

Deterministic (the seed decides everything), standard library only.
Written in the CSV form of traces/ (one 4 KiB read per line, 1 ms apart).

Usage: random_family.py OUT_DIR FIRST_SEED COUNT [LENGTH]
  (writes s<SEED>.csv.gz and sizes.txt: NAME SIZES, with the cache sizes
   at 2, 10 and 30 % of each trace's unique blocks; prints what each
   seed drew. LENGTH: reads per trace, 200,000 unless given; a seed draws
   the same mixture at any length, its phases stretched to fit, its hot
   sets drifting and jumping at the same pace)
"""
import gzip
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from synthetic import zipf_sampler  # noqa: E402

LENGTH = 200_000


class Zipf:
    """A skewed hot set; it may slide a block at a time or jump."""

    def __init__(self, rng, base):
        self.n = rng.choice([5_000, 10_000, 20_000, 40_000])
        self.alpha = rng.uniform(0.6, 1.2)
        self.z = zipf_sampler(rng, self.n, self.alpha)
        self.move = rng.choice(["still", "still", "drift", "jump"])
        self.every = rng.choice([10, 25, 100]) if self.move == "drift" else rng.choice([30_000, 60_000, 100_000])
        self.base = base

    def next(self, i):
        if self.move == "drift":
            return self.base + i // self.every + self.z.rank()
        if self.move == "jump":
            return self.base + (i // self.every) * (self.n // 2) + self.z()
        return self.base + self.z()

    def __str__(self):
        return f"zipf(n={self.n}, a={self.alpha:.2f}, {self.move}{'' if self.move == 'still' else '/' + str(self.every)})"


class Loop:
    def __init__(self, rng, base):
        self.len = rng.choice([2_000, 5_000, 12_000, 30_000])
        self.pos, self.base = 0, base

    def next(self, i):
        self.pos = (self.pos + 1) % self.len
        return self.base + self.pos

    def __str__(self):
        return f"loop({self.len})"


class Scan:
    """Sequential reads of blocks never read before."""

    def __init__(self, rng, base):
        self.at = base

    def next(self, i):
        self.at += 1
        return self.at

    def __str__(self):
        return "scan"


class Uniform:
    def __init__(self, rng, base):
        self.n = rng.choice([20_000, 100_000, 300_000])
        self.base, self.rng = base, rng

    def next(self, i):
        return self.base + self.rng.randrange(self.n)

    def __str__(self):
        return f"uniform({self.n})"


KINDS = [Zipf, Zipf, Zipf, Loop, Scan, Uniform]


def draw(rng):
    """The components and their weights in each phase."""
    comps = [rng.choice(KINDS)(rng, (k + 1) * 100_000_000) for k in range(rng.choice([1, 2, 2, 3]))]
    phases = rng.choice([1, 1, 2, 4])
    weights = [[rng.uniform(0.1, 1.0) for _ in comps] for _ in range(phases)]
    return comps, weights


def generate(seed, n=LENGTH):
    rng = random.Random(seed)
    comps, weights = draw(rng)
    desc = " + ".join(str(c) for c in comps) + (f", {len(weights)} phases" if len(weights) > 1 else "")
    blocks = []
    phase_len = n // len(weights)
    for i in range(n):
        w = weights[min(i // phase_len, len(weights) - 1)]
        r = rng.random() * sum(w)
        k = 0
        while k < len(w) - 1 and r >= w[k]:
            r -= w[k]
            k += 1
        blocks.append(comps[k].next(i))
    return blocks, desc


def main():
    # A wrong call (or --help) gets the usage, not a file named after it.
    if len(sys.argv) not in (4, 5) or sys.argv[1].startswith("-"):
        sys.exit(__doc__)
    out, first, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    n = int(sys.argv[4]) if len(sys.argv) == 5 else LENGTH
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "sizes.txt"), "w") as sizes:
        for seed in range(first, first + count):
            blocks, desc = generate(seed, n)
            name = f"s{seed}"
            with gzip.open(os.path.join(out, name + ".csv.gz"), "wt", compresslevel=1) as f:
                f.write("timestamp_us,op,offset_bytes,length_bytes\n")
                for i, b in enumerate(blocks):
                    f.write(f"{i * 1000},R,{b * 4096},4096\n")
            unique = len(set(blocks))
            cache = sorted({max(16, unique * p // 100) for p in (2, 10, 30)})
            sizes.write(f"{name} {','.join(map(str, cache))}\n")
            print(f"{name}: {desc}; {unique} unique blocks", flush=True)


if __name__ == "__main__":
    main()
