#!/usr/bin/env bash
# The whole deployment of docs/deployment.md on one machine (127.0.0.1), step by step, to read and to run:
# certificates with a SAN, a SuperLink with TLS, node authentication and a state database (its SuperExec
# apart, so a run outlives a SuperLink restart), two registered SuperNodes with their own devices and caps
# (a fake-board Jetson Nano pinned through sysfs at 4.0 W, a simulated TX2 NX at 4.5 W), the connection
# check, a supervised run, and a clean stop of every process by process id (also on Ctrl-C or an error).
#
#   deploy/loopback.sh [WORK_DIR]        (from the repository root, with the project's venv active
#                                         or PYTHON=.venv/bin/python; WORK_DIR default: a new temp dir)
#   PORT=39400 ROUNDS=2 deploy/loopback.sh /tmp/powerfed-loopback
#
# PORT is the SuperLink's; the SuperNodes' local APIs take PORT+1 and PORT+2. About 2-3 minutes.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-python}
PORT=${PORT:-39400}
ROUNDS=${ROUNDS:-2}

# Every input is checked before anything is made or started: one line on stderr and exit status 2.
die() { echo "loopback: error: $*" >&2; exit 2; }
PYTHON_PATH=$(command -v -- "$PYTHON" 2>/dev/null) ||
    die "PYTHON=$PYTHON: no such program; activate the project's venv or set PYTHON=.venv/bin/python"
[ "$("$PYTHON_PATH" -c "import flwr, fl_server, fl_client; print('ok')" 2>/dev/null)" = ok ] ||
    die "PYTHON=$PYTHON cannot import flwr and this project; set PYTHON=.venv/bin/python (after make setup)"
BIN=$(dirname "$PYTHON_PATH")
[ -x "$BIN/flower-superlink" ] || die "no flower-superlink beside $PYTHON_PATH; set PYTHON=.venv/bin/python"
[[ $PORT =~ ^[0-9]{1,5}$ ]] && ((10#$PORT >= 1 && 10#$PORT <= 65533)) ||
    die "PORT=$PORT: expected a TCP port from 1 to 65533 (the SuperNodes take PORT+1 and PORT+2)"
PORT=$((10#$PORT))
[[ $ROUNDS =~ ^[0-9]{1,4}$ ]] && ((10#$ROUNDS >= 1)) || die "ROUNDS=$ROUNDS: expected a whole number of rounds >= 1"
ROUNDS=$((10#$ROUNDS))
"$PYTHON_PATH" - "$PORT" <<'PY' || exit 2
import socket, sys
port = int(sys.argv[1])
for p in (port, port + 1, port + 2):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", p))
        except OSError as exc:
            sys.exit(f"loopback: error: port {p} on 127.0.0.1 is not free ({exc.strerror}); the SuperLink takes "
                     "PORT and the SuperNodes PORT+1 and PORT+2: pick another PORT")
PY
if [ -n "${1:-}" ]; then
    if [ -e "$1" ] && [ ! -d "$1" ]; then die "WORK_DIR $1 exists and is not a folder; give a folder (or none)"; fi
    mkdir -p -- "$1" 2>/dev/null || die "cannot make WORK_DIR $1; give a folder you may write to"
    WORK=$(cd -- "$1" && pwd)
    [ -w "$WORK" ] || die "WORK_DIR $WORK is not writable; give a folder you may write to"
else
    WORK=$(mktemp -d -t powerfed-loopback.XXXXXX) || die "cannot make a temporary folder; give WORK_DIR"
fi
mkdir -p "$WORK/logs"
ADDRESS=127.0.0.1:$PORT
PIDS=()

say() { echo "loopback: $*"; }

# Flower: no telemetry, no update check, and never `uv sync` app dependencies at run time (it would
# install an unpinned, CUDA-sized torch on the coordinator): the SuperLink also gets
# --disable-runtime-dependency-installation below.
export FLWR_HOME=$WORK/flwr-home FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1 PYTHONUNBUFFERED=1
export PATH=$BIN:$PATH

# Every process starts in its own session (setsid): its pid is its process group, so stopping it by
# `kill -- -PID` also stops what it started (the SuperNodes' ClientApps, the SuperExec's ServerApp).
start() {  # start NAME COMMAND...: in the background, its output in $WORK/logs/NAME.log
    local name=$1
    shift
    setsid "$@" >"$WORK/logs/$name.log" 2>&1 </dev/null &
    PIDS+=("$!")
    echo "$! $name" >>"$WORK/pids"
    say "started $name (pid $!)"
}

stop_all() {  # SuperNodes first, the SuperLink last: SIGTERM, then SIGKILL after 60 s
    local code=$?
    trap - EXIT INT TERM
    local i pid
    for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do
        pid=${PIDS[i]}
        kill -TERM -- "-$pid" 2>/dev/null || continue
        for _ in $(seq 600); do kill -0 -- "-$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL -- "-$pid" 2>/dev/null && say "pid $pid did not stop in 60 s: killed" || true
    done
    [ ${#PIDS[@]} -eq 0 ] || say "stopped every process (pids ${PIDS[*]})"
    exit "$code"
}
trap stop_all EXIT
trap 'say "interrupted"; exit 130' INT TERM

wait_port() {  # wait_port PORT: until something listens there (60 s)
    for _ in $(seq 300); do
        "$PYTHON" -c "import socket,sys; socket.create_connection(('127.0.0.1', $1), 0.5)" 2>/dev/null && return 0
        sleep 0.2
    done
    say "nothing listens on 127.0.0.1:$1 after 60 s; see $WORK/logs"
    return 1
}

say "working in $WORK"

# 1. A CA and the SuperLink's certificate, with a SAN naming the address the boards connect to.
"$PYTHON" -m fl_server.certs --out "$WORK/certs" --san localhost --san 127.0.0.1
CA=$WORK/certs/ca.crt

# 2. One key per board (on a real deployment: made on the board; only KEY.pub goes to the coordinator).
mkdir -p "$WORK/keys"
for board in nano tx2nx; do ssh-keygen -q -t ecdsa -b 384 -N "" -f "$WORK/keys/$board"; done

# 3. The SuperLink: TLS, node authentication, its state in a database file (registrations and runs
#    survive a restart), ServerApps run by a SuperExec started apart (--isolation process).
start superlink flower-superlink --host 127.0.0.1 --port "$PORT" \
    --ssl-ca-certfile "$CA" --ssl-certfile "$WORK/certs/server.pem" --ssl-keyfile "$WORK/certs/server.key" \
    --enable-supernode-auth --database "$WORK/state.db" --isolation process \
    --disable-runtime-dependency-installation
wait_port "$PORT"
start superexec flower-superexec --runtime-api-address "$ADDRESS" --root-certificates "$CA"

# 4. The flwr connection (what `flwr run`, `flwr supernode register` and the supervisor use).
mkdir -p "$FLWR_HOME"
cat >"$FLWR_HOME/config.toml" <<EOF
[superlink]
default = "deploy"

[superlink.deploy]
address = "$ADDRESS"
root-certificates = "$CA"
EOF

# 5. Register the boards' public keys.
for board in nano tx2nx; do flwr supernode register "$WORK/keys/$board.pub" deploy; done

# 6. A fake Jetson Nano for the first SuperNode (a real board needs none of this).
"$BIN/powerctl" fake-board "$WORK/nano-sysfs" --kind jetson-nano

# 7. Check each board's connection the way its SuperNode will connect.
for board in nano tx2nx; do
    "$PYTHON" -m fl_client.check --superlink "$ADDRESS" --root-certificates "$CA" \
        --auth-supernode-private-key "$WORK/keys/$board"
done
"$PYTHON" -m fl_client.check --connection deploy

# 8. The SuperNodes, each with its own local API port, device and cap (the wrapper starts a SuperNode
#    again when Flower refuses it right after a crash).
start supernode-nano env POWERCTL_SYSFS_ROOT="$WORK/nano-sysfs" POWERCTL_STATE_DIR="$WORK/nano-state" \
    "$PYTHON" -m fl_client.supernode --superlink "$ADDRESS" --root-certificates "$CA" \
    --auth-supernode-private-key "$WORK/keys/nano" --port $((PORT + 1)) \
    --node-config 'device="jetson" power-cap-w=4.0 partition-id=0 num-partitions=2 name="nano-01"'
start supernode-tx2nx "$PYTHON" -m fl_client.supernode --superlink "$ADDRESS" --root-certificates "$CA" \
    --auth-supernode-private-key "$WORK/keys/tx2nx" --port $((PORT + 2)) \
    --node-config 'device="sim:jetson-tx2nx" power-cap-w=4.5 partition-id=1 num-partitions=2 name="tx2nx-01"'

# 9. The run, followed through any SuperLink restart; a small cnn-tiny run on synthetic data.
RUN_CONFIG="num-server-rounds=$ROUNDS min-nodes=2 model='cnn-tiny' relation-seeds='0' pretrain-samples=256
    relation-max-samples=3000 batch-sizes='8,32' target-accuracy=0.5 budget-samples=512 eval-every-samples=64
    eval-max-samples=200 profile-samples=1000 profile-steps=1 profile-warmup=0 round-timeout=300.0"
"$PYTHON" -m fl_server.supervise deploy --app "$REPO" --results-dir "$WORK/results" \
    --run-config "$(echo $RUN_CONFIG)" | tee "$WORK/logs/run.log"

say "the fake Nano is back at $(cat "$WORK"/nano-sysfs/sys/devices/gpu.0/devfreq/57000000.gpu/{min,max}_freq | xargs)"
