#!/usr/bin/env bash
# What TLS costs: nbdcopy of a warm (ARC-resident) export to null: over a
# plain unix socket, over TLS on the same socket, and over TLS on loopback
# TCP; the best of RUNS runs each. A throwaway CA is made with openssl.
# Usage: bench/tls.sh [SIZE_MIB] [RUNS]   (under a minute at 512 3)
# Writes bench/results/tls.txt (commit and date on its first line).
set -euo pipefail
cd "$(dirname "$0")/.."
size_mib=${1:-512}
runs=${2:-3}
# shellcheck source=bench/lib.sh
. bench/lib.sh
result=$(bench_results tls.txt)
header=$(bench_header "$size_mib" "$runs")
for t in nbdcopy openssl python3; do
  command -v "$t" >/dev/null || { echo "bench: $t is missing" >&2; exit 2; }
done
cargo build --release -q
bin=target/release/arcache
work=$(mktemp -d /var/tmp/arcache-tls.XXXXXX)
pid=""
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT

ec() { openssl req "$@" -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes 2>/dev/null; }
ec -x509 -keyout "$work/ca-key.pem" -out "$work/ca-cert.pem" -days 1 -subj /CN=bench-ca
ec -keyout "$work/key.pem" -out "$work/req.csr" -subj /CN=localhost
printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' >"$work/ext.cnf"
openssl x509 -req -in "$work/req.csr" -CA "$work/ca-cert.pem" -CAkey "$work/ca-key.pem" \
  -CAcreateserial -out "$work/cert.pem" -days 1 -extfile "$work/ext.cnf" 2>/dev/null
mkdir "$work/client" && cp "$work/ca-cert.pem" "$work/client/"

head -c "$((size_mib << 20))" /dev/urandom >"$work/disk.img"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$bin" serve --export "$work/disk.img" --arc-max "$((size_mib * 2))M" --tls on \
  --tls-cert "$work/cert.pem" --tls-key "$work/key.pem" \
  --listen "unix:$work/nbd.sock" --listen "tcp:127.0.0.1:$port" --control "$work/c.sock" \
  >/dev/null 2>"$work/serve.log" &
pid=$!
for _ in $(seq 100); do [ -S "$work/c.sock" ] && break; sleep 0.1; done

plain="nbd+unix:///?socket=$work/nbd.sock"
tls_unix="nbds+unix:///?socket=$work/nbd.sock&tls-certificates=$work/client"
tls_tcp="nbds://127.0.0.1:$port/?tls-certificates=$work/client"
nbdcopy "$plain" null: # warm the ARC

best() { # uri -> best MB/s of $runs runs
  local uri=$1 top=0
  for _ in $(seq "$runs"); do
    local t0 t1 mbs
    t0=$(date +%s.%N); nbdcopy "$uri" null:; t1=$(date +%s.%N)
    mbs=$(python3 -c "print(int($size_mib * 1.048576 / ($t1 - $t0)))")
    [ "$mbs" -gt "$top" ] && top=$mbs
  done
  echo "$top"
}
p=$(best "$plain"); u=$(best "$tls_unix"); t=$(best "$tls_tcp")
{
echo "$header"
echo
echo "nbdcopy of a warm ${size_mib} MiB export to null, best of $runs"
echo "| transport | MB/s | vs plain |"
echo "|---|---|---|"
python3 - "$p" "$u" "$t" <<'PY'
import sys
p, u, t = map(int, sys.argv[1:])
for name, v in [("plain, unix socket", p), ("TLS, unix socket", u), ("TLS, TCP loopback", t)]:
    print(f"| {name} | {v:,} | {v / p:.2f}x |")
PY
} | tee "$work/result.txt"
# Only a whole result replaces a published one.
bench_publish "$work/result.txt" "$result"
