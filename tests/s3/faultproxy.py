#!/usr/bin/env python3
"""Test helper: a fault-injecting HTTP proxy in front of an S3 server (moto).
Standard library only; one thread per connection; listens on 127.0.0.1.

Usage: faultproxy.py UPSTREAM_URL PORT_FILE
  Binds 127.0.0.1 on a free port, writes the port to PORT_FILE (and prints
  it), and forwards every request to UPSTREAM_URL (http://127.0.0.1:PORT),
  keeping the Host header so that signatures stay valid.

Control (never forwarded), on the proxy's own path prefix /__faultproxy/:
  GET  /__faultproxy/stats  -> JSON counters (below)
  POST /__faultproxy/rule   JSON body: the rule to apply from now on,
                            replacing the last one; {} or {"fault": "pass"}
                            passes everything through
  POST /__faultproxy/reset  zeroes the counters

A rule: {"fault": KIND, "count": N, "rate": F, "methods": ["GET", ...],
         "path": "substring", "delay": SECONDS, "seed": S}
  Requests whose method is in `methods` (default: any) and whose path
  contains `path` (default: any) match. A matching request is faulted with
  probability `rate` (default 1.0, drawn from a generator seeded by `seed`),
  for the first `count` faults (default: no limit), then passes.
  KIND:
    500        500 InternalError, an S3 XML error body; not forwarded
    503        503 ServiceUnavailable; not forwarded
    slowdown   503 SlowDown ("Please reduce your request rate."); not forwarded
    403        403 AccessDenied; not forwarded
    reset      the request is read, then the connection is reset (RST, by
               SO_LINGER 0) without an answer; not forwarded
    reset_after  forwarded (the server acts on it), then reset without an
               answer: a lost answer
    reset_body forwarded; the status, headers and half the body are sent,
               then the connection is reset
    delay      forwarded after `delay` seconds (default 1)

Counters (stats): requests (every forwarded or faulted request), forwarded,
matched (requests the rule matched), injected {KIND: n}, by_method
{METHOD: n}, faulted (the last 200 faulted requests as "METHOD path KIND").
A test asserts on `injected` so that a fault it meant to inject, but never
did, fails the test.
"""
import http.client
import json
import os
import random
import socket
import struct
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CONTROL = "/__faultproxy/"
ERRORS = {
    "500": (500, "InternalError", "We encountered an internal error. Please try again."),
    "503": (503, "ServiceUnavailable", "Please reduce your request rate."),
    "slowdown": (503, "SlowDown", "Please reduce your request rate."),
    "403": (403, "AccessDenied", "Access Denied"),
}
KINDS = set(ERRORS) | {"pass", "reset", "reset_after", "reset_body", "delay"}


class State:
    def __init__(self):
        self.lock = threading.Lock()
        self.rule = {}
        self.rng = random.Random(0)
        self.left = None
        self.zero()

    def zero(self):
        self.requests = 0
        self.forwarded = 0
        self.matched = 0
        self.injected = {}
        self.by_method = {}
        self.faulted = []

    def set_rule(self, rule):
        kind = rule.get("fault", "pass")
        if kind not in KINDS:
            raise ValueError(f"unknown fault {kind!r}; one of {sorted(KINDS)}")
        with self.lock:
            self.rule = rule
            self.rng = random.Random(rule.get("seed", 0))
            self.left = rule.get("count")

    def decide(self, method, path):
        """The fault for this request (None: pass), counted."""
        with self.lock:
            self.requests += 1
            self.by_method[method] = self.by_method.get(method, 0) + 1
            r = self.rule
            kind = r.get("fault", "pass")
            if kind == "pass":
                return None, r
            if r.get("methods") and method not in r["methods"]:
                return None, r
            if r.get("path") and r["path"] not in path:
                return None, r
            self.matched += 1
            if self.left is not None and self.left <= 0:
                return None, r
            if self.rng.random() >= r.get("rate", 1.0):
                return None, r
            if self.left is not None:
                self.left -= 1
            self.injected[kind] = self.injected.get(kind, 0) + 1
            self.faulted.append(f"{method} {path} {kind}")
            del self.faulted[:-200]
            return kind, r

    def stats(self):
        with self.lock:
            return {
                "requests": self.requests,
                "forwarded": self.forwarded,
                "matched": self.matched,
                "injected": dict(self.injected),
                "by_method": dict(self.by_method),
                "faulted": list(self.faulted),
                "rule": self.rule,
            }


STATE = State()
UPSTREAM = None  # (host, port)


def error_body(code, message, path):
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>{message}</Message>"
        f"<Resource>{path}</Resource><RequestId>faultproxy</RequestId></Error>"
    ).encode()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def read_body(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return out
                out += self.rfile.read(size)
                self.rfile.readline()
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def reset(self):
        """Closes the connection with RST, nothing (more) sent."""
        try:
            self.wfile.flush()
        except OSError:
            pass
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.connection.close()
        self.close_connection = True

    def answer(self, status, body, headers=(), content_type="application/json"):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def control(self, body):
        what = self.path[len(CONTROL):].split("?")[0]
        try:
            if what == "stats":
                out = STATE.stats()
            elif what == "rule" and self.command == "POST":
                STATE.set_rule(json.loads(body or b"{}"))
                out = STATE.stats()
            elif what == "reset" and self.command == "POST":
                with STATE.lock:
                    STATE.zero()
                out = STATE.stats()
            else:
                raise ValueError(f"no control {self.command} {what}")
            self.answer(200, json.dumps(out).encode())
        except (ValueError, json.JSONDecodeError) as e:
            self.answer(400, json.dumps({"error": str(e)}).encode())

    def forward(self, body):
        conn = http.client.HTTPConnection(*UPSTREAM, timeout=120)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in ("transfer-encoding", "connection")}
            if body or self.command in ("PUT", "POST"):
                headers["Content-Length"] = str(len(body))
            conn.request(self.command, self.path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            return resp.status, resp.reason, resp.getheaders(), data
        finally:
            conn.close()

    def handle_any(self):
        body = self.read_body()
        if self.path.startswith(CONTROL):
            return self.control(body)
        kind, rule = STATE.decide(self.command, urllib.parse.urlsplit(self.path).path)
        if kind in ERRORS:
            status, code, message = ERRORS[kind]
            return self.answer(status, error_body(code, message, self.path), content_type="application/xml")
        if kind == "reset":
            return self.reset()
        if kind == "delay":
            time.sleep(float(rule.get("delay", 1)))
        status, reason, headers, data = self.forward(body)
        with STATE.lock:
            STATE.forwarded += 1
        if kind == "reset_after":
            return self.reset()
        self.send_response(status, reason)
        for k, v in headers:
            if k.lower() not in ("transfer-encoding", "connection", "content-length", "date", "server"):
                self.send_header(k, v)
        if self.command == "HEAD":
            length = dict((k.lower(), v) for k, v in headers).get("content-length", "0")
        else:
            length = str(len(data))
        self.send_header("Content-Length", length)
        self.end_headers()
        if self.command == "HEAD":
            return
        if kind == "reset_body":
            self.wfile.write(data[: len(data) // 2])
            return self.reset()
        self.wfile.write(data)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = handle_any


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request, client_address):
        # A client that went away, or a connection we reset: not news.
        pass


def main():
    global UPSTREAM
    upstream, port_file = sys.argv[1:3]
    u = urllib.parse.urlsplit(upstream)
    if u.hostname not in ("127.0.0.1", "localhost"):
        sys.exit("faultproxy: the upstream must be on 127.0.0.1")
    UPSTREAM = (u.hostname, u.port or 80)
    server = Server(("127.0.0.1", 0), Handler)
    port = server.server_address[1]
    tmp = port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(f"{port}\n")
    os.replace(tmp, port_file)
    print(port, flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
