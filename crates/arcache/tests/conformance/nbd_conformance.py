#!/usr/bin/python3
"""NBD conformance checks against a running server, written from the
protocol document (NetworkBlockDevice/nbd doc/proto.md).

Two kinds of client: libnbd (python3-libnbd), as real clients behave, and a
small raw-socket client for what libnbd will not send (zero-length
requests, flags it was not offered, unknown commands, BLOCK_STATUS without
a context).

usage: nbd_conformance.py RW_SOCKET RO_SOCKET IMAGE_SIZE DATA_LAYOUT
  RW_SOCKET  unix socket of a writable export "" over a sparse file
  RO_SOCKET  unix socket of a read-only export "" over the same kind of file
  DATA_LAYOUT  comma-separated OFFSET:LEN ranges holding data; the rest of
             the file is a hole (the test made it so)

Prints one line per check and 'N passed, M failed'; exits 1 on any failure.
"""

import errno
import random
import socket
import struct
import sys

import nbd

MIB = 1 << 20
MAX_REQUEST = 64 * MIB

# Protocol constants (doc/proto.md).
NBDMAGIC = 0x4E42444D41474943
IHAVEOPT = 0x49484156454F5054
REPLY_MAGIC = 0x3E889045565A9
SIMPLE_REPLY = 0x67446698
STRUCTURED_REPLY = 0x668E33EF
OPT_GO, OPT_STRUCTURED_REPLY, OPT_SET_META_CONTEXT = 7, 8, 10
REP_ACK, REP_INFO, REP_META_CONTEXT = 1, 3, 4
CMD_READ, CMD_WRITE, CMD_FLUSH, CMD_TRIM, CMD_CACHE, CMD_WRITE_ZEROES, CMD_BLOCK_STATUS = 0, 1, 3, 4, 5, 6, 7
FLAG_FUA, FLAG_NO_HOLE, FLAG_DF, FLAG_REQ_ONE, FLAG_FAST_ZERO = 1, 2, 4, 8, 16
TFLAG_READ_ONLY, TFLAG_SEND_FUA, TFLAG_SEND_DF, TFLAG_SEND_FAST_ZERO = 2, 8, 0x80, 0x800
EPERM, EINVAL, ENOSPC, ENOTSUP = 1, 22, 28, 95
REPLY_TYPE_NONE, REPLY_TYPE_OFFSET_DATA, REPLY_TYPE_BLOCK_STATUS = 0, 1, 5

passed, failed = 0, 0


def check(name, cond, detail=""):
    global passed, failed
    if cond:
        passed += 1
        print(f"ok   {name}")
    else:
        failed += 1
        print(f"FAIL {name} {detail}")


class Raw:
    """A fixed-newstyle client that sends whatever it is told to."""

    def __init__(self, path, structured=True, meta=False):
        self.s = socket.socket(socket.AF_UNIX)
        self.s.settimeout(30)
        self.s.connect(path)
        magic, opt, _flags = struct.unpack(">QQH", self.recv(18))
        assert magic == NBDMAGIC and opt == IHAVEOPT
        self.s.sendall(struct.pack(">I", 3))  # fixed newstyle, no zeroes
        self.structured = structured
        if structured:
            self.option(OPT_STRUCTURED_REPLY, b"")
            self.expect_ack(OPT_STRUCTURED_REPLY)
        if meta:
            q = b"base:allocation"
            self.option(OPT_SET_META_CONTEXT, struct.pack(">I", 0) + struct.pack(">II", 1, len(q)) + q)
            while self.option_reply(OPT_SET_META_CONTEXT)[0] != REP_ACK:
                pass
        self.option(OPT_GO, struct.pack(">IH", 0, 0))
        self.flags = None
        while True:
            kind, data = self.option_reply(OPT_GO)
            if kind == REP_INFO and struct.unpack(">H", data[:2])[0] == 0:
                self.size, self.flags = struct.unpack(">QH", data[2:12])
            if kind == REP_ACK:
                break
            assert kind == REP_INFO, f"GO answered {kind:#x}"
        self.handle = 0

    def recv(self, n):
        b = b""
        while len(b) < n:
            chunk = self.s.recv(n - len(b))
            if not chunk:
                raise ConnectionError("server closed the connection")
            b += chunk
        return b

    def option(self, opt, data):
        self.s.sendall(struct.pack(">QII", IHAVEOPT, opt, len(data)) + data)

    def option_reply(self, opt):
        magic, o, kind, n = struct.unpack(">QIII", self.recv(20))
        assert magic == REPLY_MAGIC and o == opt
        return kind, self.recv(n)

    def expect_ack(self, opt):
        kind, _ = self.option_reply(opt)
        assert kind == REP_ACK, f"option {opt} answered {kind:#x}"

    def request(self, cmd, offset, length, flags=0, payload=b""):
        """Sends one request and returns (error, chunks) from its reply."""
        self.handle += 1
        self.s.sendall(struct.pack(">IHHQQI", 0x25609513, flags, cmd, self.handle, offset, length) + payload)
        return self.reply(cmd, length)

    def reply(self, cmd, length):
        magic = struct.unpack(">I", self.recv(4))[0]
        if magic == SIMPLE_REPLY:
            err, handle = struct.unpack(">IQ", self.recv(12))
            assert handle == self.handle
            if err == 0 and cmd == CMD_READ:
                self.recv(length)
            return err, []
        assert magic == STRUCTURED_REPLY, f"reply magic {magic:#x}"
        chunks, err = [], 0
        while True:
            flags, kind, handle, n = struct.unpack(">HHQI", self.recv(16))
            assert handle == self.handle
            body = self.recv(n)
            if kind & 0x8000:
                err = struct.unpack(">I", body[:4])[0]
            chunks.append((kind, body))
            if flags & 1:
                return err, chunks

    def close(self):
        self.s.sendall(struct.pack(">IHHQQI", 0x25609513, 0, 2, 0, 0, 0))
        self.s.close()


def layout(spec):
    out = []
    for part in spec.split(","):
        off, ln = part.split(":")
        out.append((int(off), int(ln)))
    return out


def libnbd(path, meta=True, structured=True):
    h = nbd.NBD()
    h.set_request_structured_replies(structured)
    if meta:
        h.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
    h.connect_uri(f"nbd+unix:///?socket={path}")
    return h


def extents_of(h, offset, length, flags=0):
    """The base:allocation map of a range as (start, end, flags), merged."""
    got = []

    def cb(metacontext, off, entries, err):
        if metacontext == nbd.CONTEXT_BASE_ALLOCATION:
            pos = off
            for i in range(0, len(entries), 2):
                got.append((pos, pos + entries[i], entries[i + 1]))
                pos += entries[i]
        return 0

    pos, end = offset, offset + length
    while pos < end:
        got.clear()
        h.block_status(min(end - pos, 0xFFFFFFFF), pos, cb, flags)
        yield from got
        if flags & nbd.CMD_FLAG_REQ_ONE:
            return
        pos = got[-1][1]


def merged(exts, end):
    out = []
    for s, e, f in exts:
        e = min(e, end)
        if out and out[-1][2] == f and out[-1][1] == s:
            out[-1] = (out[-1][0], e, f)
        elif s < e:
            out.append((s, e, f))
    return out


def expected_map(size, data):
    out, pos = [], 0
    for off, ln in sorted(data):
        if off > pos:
            out.append((pos, off, 3))
        out.append((off, off + ln, 0))
        pos = off + ln
    if pos < size:
        out.append((pos, size, 3))
    return out


def nbd_error(fn):
    try:
        fn()
    except nbd.Error as e:
        return e.errno
    return 0


def block_status_checks(rw, size, data):
    h2 = nbd.NBD()
    h2.set_opt_mode(True)
    h2.set_request_structured_replies(True)
    h2.connect_uri(f"nbd+unix:///?socket={rw}")
    listed = []
    h2.opt_list_meta_context(lambda name: listed.append(name) or 0)
    check("LIST_META_CONTEXT offers base:allocation", "base:allocation" in listed, str(listed))
    h2.opt_abort()

    h = libnbd(rw)
    check("base:allocation negotiated", h.can_meta_context(nbd.CONTEXT_BASE_ALLOCATION))
    got = merged(extents_of(h, 0, size), size)
    want = expected_map(size, data)
    check("block status matches the file's data and holes", got == want, f"got {got[:8]} want {want[:8]}")
    one = list(extents_of(h, 0, size, nbd.CMD_FLAG_REQ_ONE))
    check("REQ_ONE gives one extent within the request", len(one) == 1 and one[0][1] - one[0][0] <= size, str(one))
    # A write into a hole is data at once (dirty, not yet on the backing store).
    hole = next(s for s, e, f in want if f == 3 and e - s >= 2 * MIB)
    h.pwrite(b"\xa5" * 4096, hole + MIB)
    got = merged(extents_of(h, hole, 2 * MIB), hole + 2 * MIB)
    check(
        "a write into a hole is reported as data",
        any(s <= hole + MIB and e >= hole + MIB + 4096 and f == 0 for s, e, f in got),
        str(got),
    )
    # Trimmed: a hole again (TRIM punches the file).
    h.trim(4096, hole + MIB)
    h.flush()
    got = merged(extents_of(h, hole, 2 * MIB), hole + 2 * MIB)
    check("a trimmed range is reported as a hole", got == [(hole, hole + 2 * MIB, 3)], str(got))
    check("the trimmed range reads as zeroes", h.pread(4096, hole + MIB) == bytes(4096))
    h.shutdown()


def fast_zero_checks(rw, ro, data):
    h = libnbd(rw)
    check("FAST_ZERO offered on a writable export", h.can_fast_zero())
    check("FUA offered on a writable export", h.can_fua())
    check("DF offered with structured replies", h.can_df())
    off, ln = data[0]
    h.zero(MIB, off, nbd.CMD_FLAG_FAST_ZERO)
    check("a fast zero on a file zeroes the range", h.pread(MIB, off) == bytes(MIB))
    got = merged(extents_of(h, off, MIB), off + MIB)
    check("a fast-zeroed range reads back as a hole", got == [(off, off + MIB, 3)], str(got))
    # NO_HOLE: zeroed but kept allocated (a zero range, not a punched hole).
    off2, _ = data[1]
    h.zero(MIB, off2, nbd.CMD_FLAG_FAST_ZERO | nbd.CMD_FLAG_NO_HOLE)
    check("a fast zero with NO_HOLE zeroes the range", h.pread(MIB, off2) == bytes(MIB))
    got = merged(extents_of(h, off2, MIB), off2 + MIB)
    check("a fast zero with NO_HOLE leaves no hole", all(f & 1 == 0 for _, _, f in got), str(got))
    h.shutdown()
    h = libnbd(ro)
    check("read-only: no FAST_ZERO", not h.can_fast_zero())
    check("read-only: no FUA", not h.can_fua())
    check("read-only: no TRIM or WRITE_ZEROES", not h.can_trim() and not h.can_zero())
    h.shutdown()


def limit_checks(rw, ro, size):
    h = libnbd(rw)
    check("maximum payload advertised is 64 MiB", h.get_block_size(nbd.SIZE_MAXIMUM) == MAX_REQUEST,
          str(h.get_block_size(nbd.SIZE_MAXIMUM)))
    blob = random.Random(7).randbytes(MAX_REQUEST)
    h.pwrite(blob, 0)
    check("a 64 MiB write and read back", h.pread(MAX_REQUEST, 0) == blob)
    h.shutdown()

    r = Raw(rw)
    for n in (33 * MIB, 50 * MIB):
        err, _ = r.request(CMD_WRITE, 0, n, payload=bytes(n))
        check(f"a {n // MIB} MiB write is accepted", err == 0, f"error {err}")
        err, chunks = r.request(CMD_READ, 0, n)
        check(f"a {n // MIB} MiB read is accepted", err == 0 and sum(len(b) - 8 for k, b in chunks if k == 1) == n)
    err, _ = r.request(CMD_WRITE, 0, MAX_REQUEST + 4096, payload=bytes(MAX_REQUEST + 4096))
    check("a write over the maximum is EINVAL (and the stream stays in step)", err == EINVAL, f"error {err}")
    err, _ = r.request(CMD_READ, 0, 4096)
    check("the connection still works after an oversized write", err == 0)
    err, _ = r.request(CMD_WRITE, size - 4096, 8192, payload=bytes(8192))
    check("a write past the end is ENOSPC", err == ENOSPC, f"error {err}")
    err, _ = r.request(CMD_WRITE_ZEROES, size - 4096, 8192)
    check("a zeroing past the end is ENOSPC", err == ENOSPC, f"error {err}")
    err, _ = r.request(CMD_READ, size - 4096, 8192)
    check("a read past the end is EINVAL", err == EINVAL, f"error {err}")
    err, _ = r.request(CMD_TRIM, size - 4096, 8192)
    check("a trim past the end is EINVAL", err == EINVAL, f"error {err}")
    err, _ = r.request(CMD_CACHE, size, 4096)
    check("a cache request past the end is EINVAL", err == EINVAL, f"error {err}")
    for cmd, name in ((CMD_READ, "read"), (CMD_WRITE, "write"), (CMD_TRIM, "trim"),
                      (CMD_WRITE_ZEROES, "zeroing"), (CMD_CACHE, "cache")):
        err, _ = r.request(cmd, 0, 0)
        check(f"a zero-length {name} is EINVAL, not a disconnect", err == EINVAL, f"error {err}")
    err, _ = r.request(CMD_FLUSH, 0, 0)
    check("FLUSH still answers after the errors", err == 0)
    for flag in (1 << 5, 1 << 9, 1 << 15):
        err, _ = r.request(CMD_READ, 0, 4096, flags=flag)
        check(f"unknown flag {flag:#x} on a read is EINVAL", err == EINVAL, f"error {err}")
    err, _ = r.request(CMD_WRITE, 0, 4096, flags=FLAG_FAST_ZERO, payload=bytes(4096))
    check("FAST_ZERO on a write (not a zeroing) is EINVAL", err == EINVAL, f"error {err}")
    err, _ = r.request(CMD_READ, 0, 4096, flags=FLAG_REQ_ONE)
    check("REQ_ONE on a read is EINVAL", err == EINVAL, f"error {err}")
    err, _ = r.request(99, 0, 4096)
    check("an unknown command is EINVAL", err == EINVAL, f"error {err}")
    err, _ = r.request(CMD_BLOCK_STATUS, 0, 4096)
    check("BLOCK_STATUS without a selected context is EINVAL", err == EINVAL, f"error {err}")
    err, chunks = r.request(CMD_READ, 0, 4096, flags=FLAG_DF)
    check("DF on a read with structured replies: one data chunk", err == 0 and [k for k, _ in chunks] == [1])
    r.close()

    r = Raw(rw, meta=True)
    err, chunks = r.request(CMD_BLOCK_STATUS, 0, 1 << 20)
    ok = err == 0 and len(chunks) == 1 and chunks[0][0] == REPLY_TYPE_BLOCK_STATUS
    if ok:
        body = chunks[0][1]
        ok = (len(body) - 4) % 8 == 0 and len(body) >= 12 and struct.unpack(">I", body[4:8])[0] > 0
    check("BLOCK_STATUS answers one block-status chunk of nonzero descriptors", ok, str(chunks)[:200])
    err, _ = r.request(CMD_BLOCK_STATUS, size - 4096, 8192)
    check("BLOCK_STATUS past the end is EINVAL", err == EINVAL, f"error {err}")
    err, _ = r.request(CMD_BLOCK_STATUS, 0, 0)
    check("a zero-length BLOCK_STATUS is EINVAL", err == EINVAL, f"error {err}")
    r.close()

    r = Raw(rw, structured=False)
    check("no DF without structured replies", r.flags & TFLAG_SEND_DF == 0)
    err, _ = r.request(CMD_READ, 0, 4096, flags=FLAG_DF)
    check("DF without structured replies is EINVAL", err == EINVAL, f"error {err}")
    err, _ = r.request(CMD_READ, 0, 4096)
    check("a plain read without structured replies works", err == 0)
    r.close()

    r = Raw(ro)
    check("read-only export: READ_ONLY set, SEND_FUA and SEND_FAST_ZERO clear",
          r.flags & TFLAG_READ_ONLY and not r.flags & (TFLAG_SEND_FUA | TFLAG_SEND_FAST_ZERO), f"{r.flags:#x}")
    err, _ = r.request(CMD_READ, 0, 4096, flags=FLAG_FUA)
    check("FUA on a read-only export is EINVAL", err == EINVAL, f"error {err}")
    err, _ = r.request(CMD_WRITE, 0, 4096, payload=bytes(4096))
    check("a write to a read-only export is EPERM", err == EPERM, f"error {err}")
    err, _ = r.request(CMD_WRITE_ZEROES, 0, 4096, flags=FLAG_FAST_ZERO)
    check("FAST_ZERO on a read-only export (not offered) is EINVAL", err == EINVAL, f"error {err}")
    r.close()


def mixed_replay(rw, size, seed=42, ops=60):
    """Random writes, zeroings, trims and reads of up to 64 MiB against a
    model of the contents; every read must equal the model."""
    rng = random.Random(seed)
    h = libnbd(rw)
    model = bytearray(h.pread(size, 0) if size <= MAX_REQUEST else b"")
    if not model:
        for off in range(0, size, MAX_REQUEST):
            model += h.pread(min(MAX_REQUEST, size - off), off)
    bad = 0
    for i in range(ops):
        ln = rng.choice([512, 4096, 65536, MIB, 7 * MIB + 512, 33 * MIB, MAX_REQUEST])
        ln = min(ln, size)
        off = rng.randrange(0, size - ln + 1) // 512 * 512
        op = rng.choice(["write", "write", "zero", "trim", "read", "read", "flush"])
        if op == "write":
            data = rng.randbytes(ln)
            h.pwrite(data, off, nbd.CMD_FLAG_FUA if rng.random() < 0.2 else 0)
            model[off:off + ln] = data
        elif op == "zero":
            fast = rng.random() < 0.5
            err = nbd_error(lambda: h.zero(ln, off, nbd.CMD_FLAG_FAST_ZERO if fast else 0))
            if err == 0:
                model[off:off + ln] = bytes(ln)
            elif not (fast and err == errno.ENOTSUP):
                bad += 1
                print(f"     zero {off}+{ln} failed: {err}")
        elif op == "trim":
            # Contents after a trim are unspecified; read them back into the model.
            h.trim(ln, off)
            model[off:off + ln] = h.pread(ln, off)
        elif op == "read":
            if h.pread(ln, off) != model[off:off + ln]:
                bad += 1
                print(f"     read {off}+{ln} differs from the model (op {i})")
        else:
            h.flush()
    for off in range(0, size, MAX_REQUEST):
        n = min(MAX_REQUEST, size - off)
        if h.pread(n, off) != model[off:off + n]:
            bad += 1
            print(f"     final read {off}+{n} differs from the model")
    check(f"mixed replay of {ops} requests up to 64 MiB matches the model", bad == 0, f"{bad} mismatches")
    h.shutdown()


def main():
    rw, ro, size, data = sys.argv[1], sys.argv[2], int(sys.argv[3]), layout(sys.argv[4])
    groups = [
        lambda: block_status_checks(rw, size, data),
        lambda: fast_zero_checks(rw, ro, data),
        lambda: limit_checks(rw, ro, size),
        lambda: mixed_replay(rw, size),
    ]
    for group in groups:
        # A group that breaks off is one failure; the others still run (and
        # the script can be pointed at another server for comparison).
        try:
            group()
        except Exception as e:  # noqa: BLE001
            check("check group ran to its end", False, repr(e))
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
