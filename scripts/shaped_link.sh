# scripts/shaped_link.sh: MPI ranks on hosts of their own joined by a rate-limited link, for the
# communication benchmark (bench/comm.sh) and tests (tests/mpi/adaptive_link.sh). Sourced, not run.
# Each rank gets a network namespace with one veth interface, nx0, bridged to the others' in a
# bridge namespace; `tc qdisc tbf` limits every interface's egress (so both directions of a
# transfer are limited). MPI is forced onto TCP over those interfaces: MPICH here is ch4:ucx, so
# UCX_TLS=tcp,self and UCX_NET_DEVICES=nx0, and MPIR_CVAR_NOLOCAL=1 (otherwise MPICH sees one
# machine and uses shared memory). Namespaces are named after the sourcing shell's process id and
# use addresses in 10.200-249.x.0/24 only; nothing outside them is touched. Needs root, ip and tc.
#
#   link_up N RATE            makes the namespaces for N ranks at RATE (Ngbit, Nmbit or Nkbit);
#                             non-zero, with the reason on stderr, where it cannot
#   link_rate RATE            changes every rank's rate (a link that degrades mid-run)
#   link_tx_bytes             bytes that have left all the ranks' interfaces so far
#   link_mpiexec CMD ARGS...  prints nothing; sets LINK_CMD to the mpiexec command line that runs
#                             CMD ARGS on every rank, each in its own namespace
#   link_down                 removes the namespaces (safe to call twice, or without link_up)

LINK_NS=${LINK_NS:-nxl$$}
LINK_SUBNET=10.$((200 + $$ % 50)).$(($$ / 50 % 250))
LINK_N=0
LINK_MPIEXEC=${MPIEXEC:-mpiexec.mpich}

# The token bucket's depth for RATE: a millisecond of traffic, at least 256 KiB. Too shallow a
# bucket cannot reach a fast rate (each refill waits for a timer); a deep one lets whole messages
# pass at the veth's own speed after an idle moment.
link_burst() {
    local n=${1%%[a-z]*} unit=${1##*[0-9]} bits
    case $unit in
        gbit) bits=$((n * 1000000000)) ;; mbit) bits=$((n * 1000000)) ;; kbit) bits=$((n * 1000)) ;;
        *) echo "shaped link: rate '$1' is not N{gbit,mbit,kbit}" >&2; return 1 ;;
    esac
    local bytes=$((bits / 8 / 1000))
    echo $((bytes > 262144 ? bytes : 262144))
}

link_up() {
    local n=$1 rate=$2 i burst
    burst=$(link_burst "$rate") || return 1
    [ "$(id -u)" = 0 ] || { echo "shaped link: needs root (network namespaces)" >&2; return 1; }
    command -v tc >/dev/null && command -v ip >/dev/null || { echo "shaped link: needs ip and tc (iproute2)" >&2; return 1; }
    LINK_N=$n
    ip netns add "${LINK_NS}br" || return 1
    ip -n "${LINK_NS}br" link add br0 type bridge && ip -n "${LINK_NS}br" link set br0 up || return 1
    for i in $(seq 0 $((n - 1))); do
        ip netns add "$LINK_NS$i" &&
            ip link add "${LINK_NS}h$i" type veth peer name "${LINK_NS}p$i" &&
            ip link set "${LINK_NS}h$i" netns "$LINK_NS$i" &&
            ip link set "${LINK_NS}p$i" netns "${LINK_NS}br" &&
            ip -n "$LINK_NS$i" link set "${LINK_NS}h$i" name nx0 &&
            ip -n "$LINK_NS$i" addr add "$LINK_SUBNET.$((i + 1))/24" dev nx0 &&
            ip -n "$LINK_NS$i" link set nx0 up &&
            ip -n "$LINK_NS$i" link set lo up &&
            ip -n "${LINK_NS}br" link set "${LINK_NS}p$i" master br0 &&
            ip -n "${LINK_NS}br" link set "${LINK_NS}p$i" up &&
            ip netns exec "$LINK_NS$i" tc qdisc add dev nx0 root tbf rate "$rate" burst "$burst" latency 100ms || return 1
    done
}

link_rate() {
    local i burst
    burst=$(link_burst "$1") || return 1
    for i in $(seq 0 $((LINK_N - 1))); do
        ip netns exec "$LINK_NS$i" tc qdisc change dev nx0 root tbf rate "$1" burst "$burst" latency 100ms
    done
}

link_tx_bytes() {
    local sum=0 i
    for i in $(seq 0 $((LINK_N - 1))); do
        sum=$((sum + $(ip netns exec "$LINK_NS$i" cat /sys/class/net/nx0/statistics/tx_bytes)))
    done
    echo $sum
}

link_mpiexec() {
    local i
    LINK_CMD=("$LINK_MPIEXEC" -genv UCX_TLS tcp,self -genv UCX_NET_DEVICES nx0 -genv MPIR_CVAR_NOLOCAL 1)
    for i in $(seq 0 $((LINK_N - 1))); do
        [ "$i" -gt 0 ] && LINK_CMD+=(:)
        LINK_CMD+=(-n 1 ip netns exec "$LINK_NS$i" "$@")
    done
}

link_down() {
    local i
    for i in $(seq 0 $((LINK_N - 1))); do ip netns del "$LINK_NS$i" 2>/dev/null || true; done
    ip netns del "${LINK_NS}br" 2>/dev/null || true
    LINK_N=0
}
