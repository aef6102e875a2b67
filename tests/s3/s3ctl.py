#!/usr/bin/env python3
"""Test helper: S3 operations on a test server with boto3 (moto's venv has
it). Usage: s3ctl.py ENDPOINT mkbucket BUCKET | put BUCKET KEY FILE
| get BUCKET KEY FILE (writes the object's bytes to FILE)
| list BUCKET PREFIX (prints the keys, one a line)
| sizes BUCKET PREFIX (prints each key and its size, one a line)
| delete BUCKET PREFIX (deletes every key under PREFIX)"""
import os
import sys

import boto3

endpoint, op, *args = sys.argv[1:]
# moto takes any key; a real server (Ceph RGW) the one in the environment.
s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                  aws_access_key_id=os.environ.get("S3CTL_KEY_ID", "testing"),
                  aws_secret_access_key=os.environ.get("S3CTL_SECRET", "testing"))
if op == "mkbucket":
    s3.create_bucket(Bucket=args[0])
elif op == "put":
    with open(args[2], "rb") as f:
        print(s3.put_object(Bucket=args[0], Key=args[1], Body=f)["ETag"])
elif op == "get":
    with open(args[2], "wb") as f:
        f.write(s3.get_object(Bucket=args[0], Key=args[1])["Body"].read())
elif op in ("list", "sizes"):
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=args[0], Prefix=args[1])
    for page in pages:
        for o in page.get("Contents", []):
            print(o["Key"] if op == "list" else f'{o["Key"]} {o["Size"]}')
elif op == "delete":
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=args[0], Prefix=args[1])
    for page in pages:
        for o in page.get("Contents", []):
            s3.delete_object(Bucket=args[0], Key=o["Key"])
else:
    sys.exit(f"unknown operation {op}")
