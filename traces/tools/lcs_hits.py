#!/usr/bin/env python3
"""libCacheSim's hit ratios on a CSV trace of traces/'s form, split into
4 KiB blocks (reads and writes), each block an object of size 1, as
tools/ref_hit_ratios.py of the full trace set computes reference_hit_ratios.json.
Needs `pip install libcachesim==0.3.5 numpy`.

Usage: lcs_hits.py TRACE.csv.gz SIZE[,SIZE...] ALGO[,ALGO...]   (libCacheSim class names)
Prints one JSON object per (algo, size): policy, cache_blocks, requests, hits, hit_ratio.
"""
import gzip
import json
import sys
import tempfile

import numpy as np
import libcachesim as lcs

OG = np.dtype([("t", "<u4"), ("id", "<u8"), ("sz", "<u4"), ("nx", "<i8")])


def main():
    # A wrong call (or --help) gets the usage, not a file named after it.
    if len(sys.argv) != 4 or sys.argv[1].startswith("-"):
        sys.exit(__doc__)
    path, sizes, algos = sys.argv[1], sys.argv[2].split(","), sys.argv[3].split(",")
    keys = []
    with gzip.open(path, "rt") as f:
        f.readline()
        for line in f:
            c = line.split(",")
            off, ln = int(c[2]), int(c[3])
            dev = int(c[4]) if len(c) > 4 else 0
            for b in range(off // 4096, (off + ln - 1) // 4096 + 1):
                keys.append((dev << 40) | b)
    rec = np.zeros(len(keys), dtype=OG)
    rec["id"], rec["sz"], rec["nx"] = np.array(keys, dtype=np.uint64), 1, -1
    with tempfile.NamedTemporaryFile(suffix=".oracleGeneral.bin") as tmp:
        rec.tofile(tmp.name)
        for algo in algos:
            for size in sizes:
                reader = lcs.TraceReader(tmp.name, lcs.TraceType.ORACLE_GENERAL_TRACE)
                miss, _ = getattr(lcs, algo)(int(size)).process_trace(reader)
                n = len(keys)
                hits = n - int(round(miss * n))
                print(json.dumps({"policy": algo + "*", "cache_blocks": int(size), "requests": n,
                                  "hits": hits, "hit_ratio": hits / n}))


if __name__ == "__main__":
    main()
