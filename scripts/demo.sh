#!/usr/bin/env bash
# Sets evalbox up on a fresh Debian/Ubuntu machine (as root) and runs the
# main job end to end: builds evalbox, the guest agent and runsc; builds the
# built-in templates; starts the embedded server; runs code in a gVisor and
# a namespaces sandbox; prints timings; scores the project's demo problem set
# (examples/evals: correct, wrong, timing-out and hostile samples, each in
# its own gVisor sandbox) and prints pass@k and trials/s; stops the server.
set -euo pipefail
cd "$(dirname "$0")/.."

DATA_DIR=${EVALBOX_DATA_DIR:-/var/lib/evalbox}
LISTEN=${EVALBOX_LISTEN:-127.0.0.1:8700}

bash scripts/build.sh
mkdir -p "$DATA_DIR"
# Only the templates the demo uses (the others, polyglot's 1.6 GiB of
# toolchains among them, are built on first use or by `template init`).
bin/evalbox template init --templates-dir "$DATA_DIR/templates" --quiet base python

bin/evalbox serve --data-dir "$DATA_DIR" --listen "$LISTEN" \
  --pool base:gvisor=2,base:namespaces=2 >"$DATA_DIR/serve.log" 2>&1 &
server=$!
trap 'kill -TERM $server 2>/dev/null; wait $server 2>/dev/null || true' EXIT
export EVALBOX_API_URL="http://$LISTEN"
for _ in $(seq 1 200); do
  [ -s "$DATA_DIR/admin.key" ] && bin/evalbox health >/dev/null 2>&1 && break
  sleep 0.1
done
export EVALBOX_API_KEY=$(cat "$DATA_DIR/admin.key")
echo "evalbox is serving on $EVALBOX_API_URL (admin key in $DATA_DIR/admin.key)"

for rt in gvisor namespaces; do
  echo "== $rt"
  start=$(date +%s%N)
  id=$(bin/evalbox sandbox create --template base --runtime "$rt")
  created=$(date +%s%N)
  bin/evalbox sandbox exec "$id" -- sh -c 'echo "hello from $(hostname) ($(uname -sr))"; echo "to stderr" >&2; exit 3' || echo "exit code $? (expected 3)"
  printf 'print(sum(range(10)))\n' > /tmp/evalbox-demo.py
  bin/evalbox sandbox rm "$id" >/dev/null
  id=$(bin/evalbox sandbox create --template python --runtime "$rt")
  bin/evalbox sandbox cp /tmp/evalbox-demo.py "$id:/work/demo.py"
  echo "python says: $(bin/evalbox sandbox exec "$id" -- python3 /work/demo.py)"
  bin/evalbox sandbox rm "$id" >/dev/null
  echo "create: $(( (created - start) / 1000000 )) ms, whole round: $(( ($(date +%s%N) - start) / 1000000 )) ms"
done
bin/evalbox sandbox ls --all | sed -n 1,5p   # sed reads it all: no SIGPIPE under pipefail

echo "== eval run: examples/evals (8 tasks x 5 samples: correct, wrong, timing-out and hostile ones)"
bin/evalbox eval run --problems examples/evals/problems.jsonl --samples examples/evals/samples.jsonl --k 1,5 --seed 1
echo "expected: pass@1 0.3250  pass@5 0.8750, 0 infra errors (every sample's verdict: examples/evals/expected.jsonl)"
