#!/usr/bin/env python3
"""SIEVE hit counts from libCacheSim 0.3.5 (`pip install libcachesim==0.3.5 numpy`),
made the way the trace set's tools/ref_hit_ratios.py makes the other policies'
counts in reference_hit_ratios.json: every request split into blocks of the mode
(4k: 4 KiB, reads and writes; 4k-r: reads only), each block one object of size 1,
the cache sizes of that file, the whole replay counted.

Usage: sieve_reference.py TRACE_DIR OUT.json   (TRACE_DIR holds reference_hit_ratios.json)
"""
import gzip
import json
import os
import sys
import tempfile

import numpy as np
import libcachesim as lcs

OG = np.dtype([("t", "<u4"), ("id", "<u8"), ("sz", "<u4"), ("nx", "<i8")])


def block_keys(csv_path, unit, reads_only):
    keys = []
    with gzip.open(csv_path, "rt") as f:
        f.readline()
        for line in f:
            cols = line.strip().split(",")
            if reads_only and cols[1] == "W":
                continue
            off, ln = int(cols[2]), int(cols[3])
            dev = int(cols[4]) if len(cols) > 4 else 0
            if ln == 0:
                continue
            for b in range(off // unit, (off + ln - 1) // unit + 1):
                keys.append((dev << 40) | b)
    return np.array(keys, dtype=np.uint64)


def main():
    # A wrong call (or --help) gets the usage, not a file named after it.
    if len(sys.argv) != 3 or sys.argv[1].startswith("-"):
        sys.exit(__doc__)
    trace_dir, out_path = sys.argv[1], sys.argv[2]
    refs = json.load(open(os.path.join(trace_dir, "reference_hit_ratios.json")))
    out = {"libcachesim_version": lcs.__version__, "algo": "Sieve", "traces": {}}
    for name, t in refs["traces"].items():
        csv = os.path.join(trace_dir, t["csv"])
        if not os.path.exists(csv):
            continue
        for mode, m in t["modes"].items():
            if mode == "512":
                continue
            keys = block_keys(csv, m["block_bytes"], mode.endswith("-r"))
            assert len(keys) == m["requests"], (name, mode)
            rec = np.zeros(len(keys), dtype=OG)
            rec["id"], rec["sz"], rec["nx"] = keys, 1, -1
            with tempfile.NamedTemporaryFile(suffix=".oracleGeneral.bin") as tmp:
                rec.tofile(tmp.name)
                hits = {}
                for size in m["sizes_blocks"]:
                    reader = lcs.TraceReader(tmp.name, lcs.TraceType.ORACLE_GENERAL_TRACE)
                    miss, _ = lcs.Sieve(int(size)).process_trace(reader)
                    hits[str(size)] = len(keys) - int(round(miss * len(keys)))
            out["traces"].setdefault(name, {})[mode] = hits
            print(name, mode, hits, flush=True)
    with open(out_path, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
