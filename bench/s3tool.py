#!/usr/bin/env python3
"""Helpers for bench/s3.sh against an S3 endpoint (boto3 for setup; plain
HTTP for the origin-alone job, so the client's own cost stays small).

  s3tool.py ENDPOINT mkbucket BUCKET
  s3tool.py ENDPOINT put BUCKET KEY FILE
  s3tool.py ENDPOINT public BUCKET KEY         (lets unsigned GETs read it)
  s3tool.py ENDPOINT randget BUCKET KEY SECONDS THREADS BLOCK
      random BLOCK-byte ranged GETs from THREADS threads for SECONDS;
      prints reads per second
Keys: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY from the environment.
"""
import http.client
import os
import random
import sys
import threading
import time
from urllib.parse import urlparse


def client(endpoint):
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=os.environ.get("AWS_ACCESS_KEY_ID"),
        aws_secret_access_key=os.environ.get("AWS_SECRET_ACCESS_KEY"),
        config=Config(s3={"addressing_style": "path"}),
    )


def randget(endpoint, bucket, key, seconds, threads, block):
    u = urlparse(endpoint)
    size = client(endpoint).head_object(Bucket=bucket, Key=key)["ContentLength"]
    blocks = size // block
    stop = time.monotonic() + seconds
    done = [0] * threads

    def run(i):
        rng = random.Random(i)
        c = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
        n = 0
        while time.monotonic() < stop:
            at = rng.randrange(blocks) * block
            c.request("GET", f"/{bucket}/{key}", headers={"Range": f"bytes={at}-{at + block - 1}"})
            r = c.getresponse()
            body = r.read()
            if r.status != 206 or len(body) != block:
                raise SystemExit(f"GET {at}: status {r.status}, {len(body)} bytes")
            n += 1
        done[i] = n

    ts = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    t0 = time.monotonic()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    print(round(sum(done) / (time.monotonic() - t0)))


def main():
    endpoint, cmd, *args = sys.argv[1:]
    if cmd == "mkbucket":
        client(endpoint).create_bucket(Bucket=args[0])
    elif cmd == "put":
        client(endpoint).upload_file(args[2], args[0], args[1])
    elif cmd == "public":
        client(endpoint).put_object_acl(Bucket=args[0], Key=args[1], ACL="public-read")
    elif cmd == "randget":
        randget(endpoint, args[0], args[1], float(args[2]), int(args[3]), int(args[4]))
    else:
        raise SystemExit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
