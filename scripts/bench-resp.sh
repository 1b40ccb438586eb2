#!/usr/bin/env bash
# redis-benchmark against kvmesh's Redis-protocol door (kvmeshd -resp) and
# against redis-server, on this machine, with the same value sizes and
# client settings; prints a Markdown table (docs/BENCHMARKS.md).
#
#   scripts/bench-resp.sh [SIZES [MORE]]   (make bench-resp; SIZES default "4096 65536 1048576";
#                                          MORE: further redis-benchmark flags, e.g. "-r 100000")
#
# kvmesh runs as one node (R = 1) and as three nodes on loopback (R = 3,
# W = 2, the benchmark's clients on node 1's door); every kvmeshd has
# -dram 1G -disk 0. redis-server runs with no persistence. Each point is
# redis-benchmark -t set,get -d SIZE -P 16 -c 8 -n N, N = 256 MiB / SIZE
# (at least 500, at most 20000).
set -euo pipefail
cd "$(dirname "$0")/.."
sizes=${1:-"4096 65536 1048576"}
more=${2:-}
bin=${KVMESHD:-bin/kvmeshd}
work=$(mktemp -d)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT

# start ID ARGS...: starts kvmeshd, waits for its listening line, sets
# $line to it.
start() {
	local id=$1; shift
	"$bin" -id "$id" -data-dir "$work/$id" -insecure -grpc 127.0.0.1:0 -local-timing -dram 1G -disk 0 \
		-resp 127.0.0.1:0 -log-level warn "$@" >"$work/$id.out" 2>"$work/$id.log" &
	pids+=($!)
	await "$id" listening
}

# await ID WORD: waits for ID's "kvmeshd WORD" line (listening, ready) and
# sets $line to it.
await() {
	for _ in $(seq 1200); do
		line=$(grep -m1 "^kvmeshd $2 " "$work/$1.out" || true)
		[ -n "$line" ] && return 0
		sleep 0.1
	done
	echo "bench-resp: $1 did not get $2; log:" >&2; tail "$work/$1.log" >&2; exit 1
}
field() { tr ' ' '\n' <<<"$1" | sed -n "s/^$2=//p"; }

# bench PORT SIZE: prints "set_rps get_rps".
bench() {
	local n=$((256 * 1024 * 1024 / $2))
	n=$((n < 500 ? 500 : n > 20000 ? 20000 : n))
	local out
	out=$(timeout 600 redis-benchmark -h 127.0.0.1 -p "$1" -t set,get -d "$2" -P 16 -c 8 -n "$n" $more --csv 2>"$work/bench.err" || true)
	if ! grep -q '^"GET"' <<<"$out"; then
		echo "bench-resp: redis-benchmark on port $1, $2 bytes, gave no result:" >&2
		cat "$work/bench.err" >&2
		exit 1
	fi
	# The next size's SETs write redis-benchmark's one key anew.
	redis-cli -p "$1" del key:__rand_int__ >/dev/null
	awk -F'"' '$2=="SET"{s=$4} $2=="GET"{g=$4} END{printf "%s %s", s, g}' <<<"$out"
}

declare -A res
redis_port=$(( (RANDOM % 20000) + 30000 ))
redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no --daemonize no >"$work/redis.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do redis-cli -p "$redis_port" ping >/dev/null 2>&1 && break; sleep 0.1; done
for s in $sizes; do res[redis,$s]=$(bench "$redis_port" "$s"); done
redis-cli -p "$redis_port" shutdown nosave >/dev/null 2>&1 || true

start k1 -bootstrap
await k1 ready
p1=$(field "$line" resp | sed 's/.*://')
for s in $sizes; do res[one,$s]=$(bench "$p1" "$s"); done
kill "${pids[-1]}"; wait "${pids[-1]}" 2>/dev/null || true

start c1 -bootstrap-expect 3
g1=$(field "$line" gossip); p1=$(field "$line" resp | sed 's/.*://')
start c2 -bootstrap-expect 3 -join "$g1"
start c3 -bootstrap-expect 3 -join "$g1"
for id in c1 c2 c3; do await "$id" ready; done
for s in $sizes; do res[three,$s]=$(bench "$p1" "$s"); done

echo "| value | redis-server SET/s | GET/s | kvmesh 1 node SET/s | GET/s | kvmesh 3 nodes (R=3, W=2) SET/s | GET/s |"
echo "|---|---|---|---|---|---|---|"
for s in $sizes; do
	read -r rs rg <<<"${res[redis,$s]}"; read -r os og <<<"${res[one,$s]}"; read -r ts tg <<<"${res[three,$s]}"
	echo "| $((s / 1024)) KiB | $rs | $rg | $os | $og | $ts | $tg |"
done
echo
echo "redis-benchmark -t set,get -d SIZE -P 16 -c 8 $more; $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); $(redis-server --version | cut -d' ' -f1-3); kvmesh $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
