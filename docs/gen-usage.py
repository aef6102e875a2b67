#!/usr/bin/env python3
"""Regenerates docs/usage.md: the fixed text below, then every command's
--help from the built binary (a test checks the page names every option).
Usage: python3 docs/gen-usage.py [path/to/arcache]   (default target/release/arcache)"""
import subprocess, sys, os

here = os.path.dirname(os.path.abspath(__file__))
binary = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "target", "release", "arcache")

HEAD = "# arcache(1)\n\n## NAME\n\narcache - a ZFS-style ARC and L2ARC cache with write-back, in front of slow\nblock storage, served over NBD\n\n## SYNOPSIS\n\n```\narcache serve [--export [NAME=]BACKING]... [--l2 PATH[:SIZE]]... [--log PATH[:SIZE]]\n              [--arc-max SIZE] [--config FILE] [--set NAME=VALUE]... [OPTIONS]\narcache stat [INTERVAL [COUNT]] [-f FIELDS] [-v] [--json]\narcache summary | get NAME | get --all | set NAME=VALUE | flush\narcache sim --trace FILE (--cache-blocks N[,N...] [--l2-size SIZE] | --mrc --out DIR)\narcache l2 dump|forget PATH\narcache log dump|forget PATH\narcache demo\n```\n\n## DESCRIPTION\n\n`arcache serve` exports block devices, files or remote NBD exports over\nNBD through one shared ARC in RAM (MRU/MFU lists with ghost lists and an\nadaptive split, as OpenZFS), an optional persistent L2ARC on SSD files or\ndevices, a sequential prefetcher, and write-back with an intent log and\ntransaction groups. Any NBD client works: `nbdinfo`, `nbdcopy`, `nbdfuse`,\n`qemu-img`, `qemu-io`, `fio --ioengine=nbd`, the kernel's `nbd-client`.\nThe other commands talk to a running server through its control socket\n(`--control PATH`, default in the runtime directory), work on cache or log\ndevices offline, or simulate traces.\n\nDocumentation beside this page: `architecture.md`, `l2arc.md`,\n`persistence.md`, `intent-log.md`, `format.md`, `tunables-and-stats.md`,\n`metrics.md`.\n\n## SIGNALS\n\n- **SIGTERM, SIGINT**: stop reading requests, answer those in flight, write\n  all dirty data to the backing stores (a progress line), empty the intent\n  log, write the L2 logs, remove the sockets, exit 0.\n- **SIGHUP**: reload the tunables from the config file (defaults, then the\n  file's settings, then the command line's `--set`, as at start); a file\n  that does not parse changes nothing and is reported in the log. Exports,\n  devices and listeners are not changed by a reload.\n- **SIGKILL / power loss**: nothing acknowledged as durable is lost (FLUSH,\n  FUA, `sync=always`); at the next start the intent log is replayed and the\n  L2 contents are restored from their logs.\n\n## FILES\n\n- `/etc/arcache/arcache.toml` (or any `--config FILE`): the settings; see the\n  README for an example.\n- `$XDG_RUNTIME_DIR/arcache/` (`/run/arcache` for root, else\n  `/tmp/arcache-UID`): `nbd.sock` and `control.sock`, mode 0600\n  (`--socket-group` opens the NBD sockets to one group, mode 0660).\n- L2 devices and the intent log: where `--l2` and `--log` say.\n- `contrib/arcache.service`: a systemd unit with hardening options;\n  `contrib/grafana-dashboard.json`: a dashboard for `--metrics`.\n\n## LOGS\n\nTo standard error, one line per event with a level, no colours unless\nstandard error is a terminal, which journald stores as is. `RUST_LOG`\n(`error`, `warn`, `info`, `debug`) chooses the level; the default is `info`\nfor `serve`.\n\n## EXIT STATUS\n\n0 on success; 1 on an error, with a one-line reason on standard error\n(`l2 dump` exits 1 without a reason line when the device's structure is\ninconsistent, after printing what it found).\n\n## COMMANDS\n"


def helptext(*args):
    return subprocess.run([binary, *args, "--help"], capture_output=True, text=True, check=True).stdout.rstrip()


out = [HEAD]
for cmd in [("serve",), ("stat",), ("summary",), ("get",), ("set",), ("flush",), ("sim",), ("demo",), ("l2",), ("log",),
            ("l2", "dump"), ("l2", "forget"), ("log", "dump"), ("log", "forget")]:
    out.append("\n### arcache %s\n\n```\n%s\n```\n" % (" ".join(cmd), helptext(*cmd)))
open(os.path.join(here, "usage.md"), "w").write("".join(out))
