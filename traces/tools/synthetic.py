#!/usr/bin/env python3
"""Synthetic block traces for checking that a policy's figures generalise
beyond the reference suite: each is a pattern a cache is known to find hard,
written in the CSV form of traces/ (one 4 KiB read per line, 1 ms apart),
with the cache sizes to try. Deterministic (fixed seeds), standard library
only.

  hot_scan     a Zipf(0.9) hot set of 20k blocks, every 50k requests a
               sequential scan of 40k new blocks
  loop_plus    a loop over 11k blocks (10 % more than the 10k-block cache)
               mixed 1:1 with Zipf(0.8) reads over 100k blocks
  shifting     Zipf(1.0) over 30k blocks whose offset moves by 15k blocks
               every 100k requests
  zipf         Zipf(0.8) over 200k blocks, nothing else
  loops_nested a 4k-block loop inside a 60k-block loop, 3:1

Held out (written after arc-adaptive's constants were chosen on the five
above and the reference suite, and never used to choose them):

  tenants      three tenants, Zipf(0.9) over 5k, 20k and 50k blocks, whose
               shares of the requests rotate every 80k requests
  one_hit_mix  Zipf(1.0) over 25k blocks, every other request a block
               never read before or after
  recurring    two working sets (Zipf(0.9) over 15k blocks each) taking
               turns every 60k requests
  scan_loops   a 30k-block region read in order again and again, 3 requests
               in 10, the rest Zipf(0.7) over 50k other blocks

Fresh (written before the second round of tuning started, with seeds of
their own, and run once, on the final policy):

  daily        two working sets (Zipf(0.9) over 12k blocks each) whose
               shares follow a cycle of 100k requests, one rising as the
               other falls, instead of switching at once
  drift        Zipf(0.9) over 40k blocks whose hot keys slide by one block
               every 25 requests (16k blocks over the trace)
  loop_random  a loop over 13k blocks (1.3 times the 10k-block cache) half
               of the requests, the rest uniform over 200k other blocks
  write_bursts Zipf(0.8) over 30k blocks re-read, and every 30k requests a
               burst of 8k writes of blocks never seen again

Fresh, second (written after arc-adaptive's warm-up of 67aa071 was
chosen, with seeds of their own, and run once, on that policy):

  scan_storm   a Zipf(1.1) hot set of 8k blocks, every 40k requests a
               sequential scan of 30k new blocks, and a tenth of the
               requests uniform over 100k other blocks
  loop_near    a loop over 6.6k blocks (1.1 times the 6k-block cache), 4
               requests in 10, the rest Zipf(0.9) over 30k other blocks
  shift_slow   Zipf(0.8) over 20k blocks whose offset moves by 5k blocks
               every 50k requests
  rotating     three working sets (Zipf(1.0) over 10k blocks each), one
               at a time for 70k requests in turn, a fifth of its
               requests still going to the one before
  jump_loop    Zipf(0.95) over 15k blocks jumping to new blocks every 80k
               requests, mixed 1:1 with a loop over 20k blocks

Fresh, third (written after the recency variant was made LRU's equal and
a switch to it put MFU in order of last use, before that change was
judged, with seeds of their own, and run once, on it):

  phases       Zipf(0.9) over 20k blocks; from 150k to 250k requests a
               loop over 14k other blocks takes half of the requests
  jump_scan    Zipf(1.0) over 10k blocks jumping to new blocks every 60k
               of its own requests (the scans' not counted), and every
               40k requests a sequential scan of 20k new blocks
  two_loops    loops over 5k and 24k blocks, 1:1, and a fifth of the
               requests Zipf(0.8) over 40k other blocks
  hot_drift    Zipf(0.8) over 50k blocks that stay, and half of the
               requests Zipf(1.1) over 5k blocks sliding by one block
               every 10 requests
  storms       Zipf(0.9) over 15k blocks, and every 100k requests 20k
               requests uniform over 200k other blocks

Usage: synthetic.py OUT_DIR [tuned|held-out|fresh|fresh2|fresh3]
  (writes NAME.csv.gz and sizes.txt: NAME SIZES; the tuned set by default)
"""
import bisect
import gzip
import itertools
import math
import os
import random
import sys

N = 400_000


def zipf_sampler(rng, n, alpha):
    weights = [1.0 / (i + 1) ** alpha for i in range(n)]
    cum = list(itertools.accumulate(weights))
    total = cum[-1]
    # A fixed random permutation so hot blocks are not the lowest numbers.
    perm = list(range(n))
    rng.shuffle(perm)

    def draw():
        return perm[bisect.bisect_left(cum, rng.random() * total)]

    draw.rank = lambda: bisect.bisect_left(cum, rng.random() * total)
    return draw


def hot_scan(rng):
    hot = zipf_sampler(rng, 20_000, 0.9)
    scan_at = 10_000_000
    i = 0
    while i < N:
        if i % 50_000 == 49_999:
            for _ in range(40_000):
                yield scan_at
                scan_at += 1
                i += 1
        yield hot()
        i += 1


def loop_mix(rng, loop_len, loop_share, zipf_n, alpha, loop_base):
    z = zipf_sampler(rng, zipf_n, alpha)
    pos = 0
    for _ in range(N):
        if rng.random() < loop_share:
            yield loop_base + pos
            pos = (pos + 1) % loop_len
        else:
            yield z()


def loop_plus(rng):
    return loop_mix(rng, 11_000, 0.5, 100_000, 0.8, 1_000_000)


def shifting(rng):
    z = zipf_sampler(rng, 30_000, 1.0)
    for i in range(N):
        yield (i // 100_000) * 15_000 + z()


def zipf(rng):
    z = zipf_sampler(rng, 200_000, 0.8)
    for _ in range(N):
        yield z()


def loops_nested(rng):
    small = big = 0
    for _ in range(N):
        if rng.random() < 0.75:
            yield 5_000_000 + small
            small = (small + 1) % 4_000
        else:
            yield 6_000_000 + big
            big = (big + 1) % 60_000


def tenants(rng):
    sets = [zipf_sampler(rng, n, 0.9) for n in (5_000, 20_000, 50_000)]
    shares = [(0.6, 0.3, 0.1), (0.1, 0.6, 0.3), (0.3, 0.1, 0.6)]
    for i in range(N):
        w = shares[(i // 80_000) % 3]
        r = rng.random()
        t = 0 if r < w[0] else 1 if r < w[0] + w[1] else 2
        yield (t + 1) * 1_000_000 + sets[t]()


def one_hit_mix(rng):
    z = zipf_sampler(rng, 25_000, 1.0)
    fresh = 50_000_000
    for i in range(N):
        if i % 2:
            fresh += 1
            yield fresh
        else:
            yield z()


def recurring(rng):
    a = zipf_sampler(rng, 15_000, 0.9)
    b = zipf_sampler(rng, 15_000, 0.9)
    for i in range(N):
        yield a() if (i // 60_000) % 2 == 0 else 1_000_000 + b()


def scan_loops(rng):
    return loop_mix(rng, 30_000, 0.3, 50_000, 0.7, 7_000_000)


def daily(rng):
    a = zipf_sampler(rng, 12_000, 0.9)
    b = zipf_sampler(rng, 12_000, 0.9)
    for i in range(N):
        share_a = 0.5 + 0.5 * math.cos(2 * math.pi * i / 100_000)
        yield a() if rng.random() < share_a else 2_000_000 + b()


def drift(rng):
    z = zipf_sampler(rng, 40_000, 0.9)
    for i in range(N):
        # Ranks map to blocks in order here (no permutation): sliding the
        # offset moves the hot end itself, a few blocks at a time.
        yield 3_000_000 + i // 25 + z.rank()


def loop_beside(rng, loop_len, loop_base, other):
    """Half of the requests a loop over `loop_len` blocks from
    `loop_base` on, the rest other(i) at request i."""
    pos = 0
    for i in range(N):
        if rng.random() < 0.5:
            yield loop_base + pos
            pos = (pos + 1) % loop_len
        else:
            yield other(i)


def loop_random(rng):
    return loop_beside(rng, 13_000, 4_000_000, lambda i: 8_000_000 + rng.randrange(200_000))


def bursts(every, length, first, base, op=None):
    """base()'s blocks, and every `every` requests a burst of `length`
    blocks never seen before (numbered from `first` on); with `op`, as
    (block, op) pairs, the base's reads and the bursts' `op`."""
    fresh = first
    i = 0
    while i < N:
        if i % every == every - 1:
            for _ in range(length):
                fresh += 1
                yield (fresh, op) if op else fresh
                i += 1
        yield (base(), "R") if op else base()
        i += 1


def write_bursts(rng):
    return bursts(30_000, 8_000, 90_000_000, zipf_sampler(rng, 30_000, 0.8), "W")


def scan_storm(rng):
    z = zipf_sampler(rng, 8_000, 1.1)
    return bursts(40_000, 30_000, 20_000_000,
                  lambda: 10_000_000 + rng.randrange(100_000) if rng.random() < 0.1 else z())


def loop_near(rng):
    return loop_mix(rng, 6_600, 0.4, 30_000, 0.9, 11_000_000)


def shift_slow(rng):
    z = zipf_sampler(rng, 20_000, 0.8)
    for i in range(N):
        yield 12_000_000 + (i // 50_000) * 5_000 + z()


def rotating(rng):
    sets = [zipf_sampler(rng, 10_000, 1.0) for _ in range(3)]
    for i in range(N):
        now = (i // 70_000) % 3
        t = (now + 2) % 3 if rng.random() < 0.2 else now
        yield 13_000_000 + t * 1_000_000 + sets[t]()


def jump_loop(rng):
    z = zipf_sampler(rng, 15_000, 0.95)
    return loop_beside(rng, 20_000, 16_000_000, lambda i: 17_000_000 + (i // 80_000) * 15_000 + z())


def phases(rng):
    z = zipf_sampler(rng, 20_000, 0.9)
    for i in range(N):
        looping = 150_000 <= i < 250_000 and i % 2
        yield 21_000_000 + (i // 2) % 14_000 if looping else z()


def jump_scan(rng):
    z = zipf_sampler(rng, 10_000, 1.0)
    count = itertools.count()
    return bursts(40_000, 20_000, 23_000_000, lambda: 22_000_000 + (next(count) // 60_000) * 10_000 + z())


def two_loops(rng):
    small = big = 0
    z = zipf_sampler(rng, 40_000, 0.8)
    for _ in range(N):
        r = rng.random()
        if r < 0.2:
            yield 24_000_000 + z()
        elif r < 0.6:
            yield 25_000_000 + small
            small = (small + 1) % 5_000
        else:
            yield 26_000_000 + big
            big = (big + 1) % 24_000


def hot_drift(rng):
    stay = zipf_sampler(rng, 50_000, 0.8)
    hot = zipf_sampler(rng, 5_000, 1.1)
    for i in range(N):
        yield 27_000_000 + i // 10 + hot.rank() if i % 2 else 28_000_000 + stay()


def storms(rng):
    z = zipf_sampler(rng, 15_000, 0.9)
    for i in range(N):
        yield 29_000_000 + rng.randrange(200_000) if i % 100_000 >= 80_000 else z()


FRESH3 = {
    "phases": (phases, [4_000, 12_000, 30_000]),
    "jump_scan": (jump_scan, [3_000, 8_000, 20_000]),
    "two_loops": (two_loops, [4_000, 15_000, 30_000]),
    "hot_drift": (hot_drift, [3_000, 10_000, 30_000]),
    "storms": (storms, [3_000, 8_000, 16_000]),
}


FRESH2 = {
    "scan_storm": (scan_storm, [2_000, 6_000, 12_000]),
    "loop_near": (loop_near, [3_000, 6_000, 15_000]),
    "shift_slow": (shift_slow, [4_000, 10_000, 20_000]),
    "rotating": (rotating, [5_000, 12_000, 25_000]),
    "jump_loop": (jump_loop, [5_000, 15_000, 30_000]),
}

FRESH = {
    "daily": (daily, [3_000, 10_000, 20_000]),
    "drift": (drift, [4_000, 10_000, 25_000]),
    "loop_random": (loop_random, [5_000, 10_000, 20_000]),
    "write_bursts": (write_bursts, [3_000, 10_000, 25_000]),
}

HELD_OUT = {
    "tenants": (tenants, [5_000, 15_000, 40_000]),
    "one_hit_mix": (one_hit_mix, [2_500, 10_000, 20_000]),
    "recurring": (recurring, [8_000, 16_000, 32_000]),
    "scan_loops": (scan_loops, [10_000, 20_000, 40_000]),
}

TRACES = {
    "hot_scan": (hot_scan, [5_000, 10_000, 20_000]),
    "loop_plus": (loop_plus, [5_000, 10_000, 20_000]),
    "shifting": (shifting, [5_000, 10_000, 20_000]),
    "zipf": (zipf, [2_000, 10_000, 40_000]),
    "loops_nested": (loops_nested, [3_000, 10_000, 30_000]),
}


def main():
    # A wrong call (or --help) gets the usage, not a directory named after it.
    if not 2 <= len(sys.argv) <= 3 or sys.argv[1].startswith("-"):
        sys.exit(__doc__)
    out = sys.argv[1]
    which = sys.argv[2] if len(sys.argv) > 2 else "tuned"
    traces = {"tuned": TRACES, "held-out": HELD_OUT, "fresh": FRESH, "fresh2": FRESH2,
              "fresh3": FRESH3}[which]
    # Each set its own seeds, so a new set does not replay an old one's draws.
    first_seed = {"tuned": 1, "held-out": 1, "fresh": 2026, "fresh2": 4000, "fresh3": 6000}[which]
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "sizes.txt"), "w") as sizes:
        for seed, (name, (gen, cache_sizes)) in enumerate(traces.items()):
            rng = random.Random(first_seed + seed)
            with gzip.open(os.path.join(out, name + ".csv.gz"), "wt", compresslevel=1) as f:
                f.write("timestamp_us,op,offset_bytes,length_bytes\n")
                for i, item in enumerate(itertools.islice(gen(rng), N)):
                    block, op = item if isinstance(item, tuple) else (item, "R")
                    f.write(f"{i * 1000},{op},{block * 4096},4096\n")
            sizes.write(f"{name} {','.join(map(str, cache_sizes))}\n")


if __name__ == "__main__":
    main()
