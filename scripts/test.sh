#!/usr/bin/env bash
# Runs the whole test suite on a Debian/Ubuntu machine, as root: formatting
# and vet, every package's tests with the race detector, and the end-to-end
# suite through a real `evalbox serve` with real gVisor and namespaces
# sandboxes. Installs what it needs; templates are cached across runs in
# $EVALBOX_TEMPLATES_DIR (default /var/cache/evalbox/templates).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/build.sh
if ! command -v gcc >/dev/null; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc >/dev/null
fi
# scripts/fleet-certs.sh (the manifests' and the fleet's TLS tests) needs openssl.
if ! command -v openssl >/dev/null; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssl >/dev/null
fi

# The store's tests and the e2e suite run against real PostgreSQL servers
# that internal/pgtest starts from Debian's binaries (its own data dir and
# port; no systemd, no system cluster): install them if missing, with a
# policy-rc.d that keeps the package from starting its cluster, and set
# EVALBOX_PG_BIN_DIR, with which those tests fail instead of skipping.
pg_bin() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n1; }
if [ -z "${EVALBOX_PG_BIN_DIR:-}" ] && [ ! -x "$(pg_bin)/postgres" ]; then
  echo "== installing PostgreSQL (Debian's postgresql)"
  policy=/usr/sbin/policy-rc.d
  own_policy=
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy" && own_policy=1
    trap 'rm -f "$policy"' EXIT
  fi
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
  if [ -n "$own_policy" ]; then rm -f "$policy"; trap - EXIT; fi
  [ -x "$(pg_bin)/postgres" ] || { echo "test: installing postgresql gave no /usr/lib/postgresql/*/bin/postgres" >&2; exit 1; }
fi
export EVALBOX_PG_BIN_DIR=${EVALBOX_PG_BIN_DIR:-$(pg_bin)}

echo "== gofmt, go vet"
unformatted=$(gofmt -l cmd deploy internal pkg test)
if [ -n "$unformatted" ]; then
  echo "gofmt would change:"; echo "$unformatted"; exit 1
fi
go vet ./...

echo "== generated protobuf code matches proto/"
bash scripts/proto.sh --check

export EVALBOX_TEMPLATES_DIR=${EVALBOX_TEMPLATES_DIR:-/var/cache/evalbox/templates}
# Every built-in, polyglot among them (every toolchain of internal/lang:
# test/e2e's TestLanguages, the SandboxFusion suite's compiled languages),
# so that no test skips for want of one; a template whose spec is unchanged
# is kept (cached by its digest).
echo "== built-in templates in $EVALBOX_TEMPLATES_DIR"
bin/evalbox template init --templates-dir "$EVALBOX_TEMPLATES_DIR" --quiet
export EVALBOX_TEST_ROOTFS="$EVALBOX_TEMPLATES_DIR/base/rootfs"

echo "== Python SDK (sdk/python): ruff, mypy, pytest against a real evalbox serve"
if ! python3 -c 'import ensurepip, venv' 2>/dev/null; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
fi
python3 -m venv sdk/python/.venv
sdk/python/.venv/bin/pip install -q --disable-pip-version-check -e 'sdk/python[dev]' -c sdk/python/constraints.txt
wheeldir=$(mktemp -d); sdk/python/.venv/bin/pip wheel -q --no-deps -w "$wheeldir" sdk/python; rm -rf "$wheeldir"
(cd sdk/python && .venv/bin/ruff check . ../../examples ../../test/e2bcompat ../../test/integrations ../../internal/interpreter && .venv/bin/ruff format --check . ../../examples ../../test/e2bcompat ../../test/integrations ../../internal/interpreter && .venv/bin/mypy)
(cd sdk/python && EVALBOX_BIN_DIR="$PWD/../../bin" .venv/bin/pytest -q -W error)

# The official E2B SDKs, pinned by test/e2bcompat/constraints.txt, against a
# real evalbox serve, driven as their users drive them (docs/e2b.md); their
# venv is cached by the constraints' hash.
echo "== E2B SDKs (test/e2bcompat): e2b and e2b-code-interpreter from PyPI, e2b from npm, against a real evalbox serve"
e2b_venv=/var/cache/evalbox/venv-e2b-$(sha256sum test/e2bcompat/constraints.txt | cut -c1-16)
if [ ! -x "$e2b_venv/bin/pytest" ]; then
  rm -rf "$e2b_venv"
  python3 -m venv "$e2b_venv"
  "$e2b_venv/bin/pip" install -q --disable-pip-version-check -r test/e2bcompat/constraints.txt
fi
# npm e2b, pinned by its lockfile, on the host's Node.js (test_js.py):
# node_modules cached by the lockfile's hash, linked into the test's dir.
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
fi
js_cache=/var/cache/evalbox/npm-e2b-$(sha256sum test/e2bcompat/js/package-lock.json | cut -c1-16)
if [ ! -d "$js_cache/node_modules/e2b" ]; then
  rm -rf "$js_cache"
  mkdir -p "$js_cache"
  cp test/e2bcompat/js/package.json test/e2bcompat/js/package-lock.json "$js_cache/"
  (cd "$js_cache" && npm ci --no-audit --no-fund --loglevel=error)
fi
ln -sfn "$js_cache/node_modules" test/e2bcompat/js/node_modules
(cd test/e2bcompat && EVALBOX_BIN_DIR="$PWD/../../bin" "$e2b_venv/bin/pytest" -q -W error -p no:cacheprovider --ignore=harbor .)

# Harbor's E2B environment (harbor run -e e2b: a template build from a
# Dockerfile, the oracle and nop agents, a restart, --force-build), pinned
# by test/e2bcompat/harbor/constraints.txt, in a venv of Python >= 3.12
# (Harbor's floor: pyenv's on these machines) cached by the constraints'
# hash.
echo "== Harbor (test/e2bcompat/harbor): harbor run -e e2b from PyPI against a real evalbox serve"
harbor_python=$(bash scripts/python312.sh) || { echo "test: Harbor needs Python >= 3.12" >&2; exit 1; }
harbor_venv=/var/cache/evalbox/venv-harbor-$(sha256sum test/e2bcompat/harbor/constraints.txt | cut -c1-16)
if [ ! -x "$harbor_venv/bin/harbor" ]; then
  rm -rf "$harbor_venv"
  "$harbor_python" -m venv "$harbor_venv"
  "$harbor_venv/bin/pip" install -q --disable-pip-version-check -r test/e2bcompat/harbor/constraints.txt
fi
(cd test/e2bcompat && EVALBOX_BIN_DIR="$PWD/../../bin" "$harbor_venv/bin/pytest" -q -W error -p no:cacheprovider harbor)

# The integrations (test/integrations), each driven through its framework's
# real package from PyPI, pinned by its constraints.txt, in a venv cached by
# the constraints' hash.
echo "== SandboxFusion (test/integrations/sandboxfusion): the sandbox-fusion client from PyPI and verl's request against a real evalbox serve"
sf_venv=/var/cache/evalbox/venv-sandboxfusion-$(sha256sum test/integrations/sandboxfusion/constraints.txt | cut -c1-16)
if [ ! -x "$sf_venv/bin/pytest" ]; then
  rm -rf "$sf_venv"
  python3 -m venv "$sf_venv"
  "$sf_venv/bin/pip" install -q --disable-pip-version-check -r test/integrations/sandboxfusion/constraints.txt
fi
(cd test/integrations && EVALBOX_BIN_DIR="$PWD/../../bin" "$sf_venv/bin/pytest" -q -W error -p no:cacheprovider sandboxfusion)

# NeMo Gym 0.4.0 needs Python >= 3.12 (Harbor's, found above); it is
# installed without its dependencies (its sandbox API needs none), and the
# SDK from this checkout on every run (its entry point registers the provider).
echo "== NeMo Gym (test/integrations/nemogym): nemo-gym's AsyncSandbox and Sandbox on the evalbox provider against a real evalbox serve"
ng_venv=/var/cache/evalbox/venv-nemogym-$(sha256sum test/integrations/nemogym/constraints.txt | cut -c1-16)
if [ ! -x "$ng_venv/bin/pytest" ]; then
  rm -rf "$ng_venv"
  "$harbor_python" -m venv "$ng_venv"
  "$ng_venv/bin/pip" install -q --disable-pip-version-check -r <(grep -v '^nemo-gym==' test/integrations/nemogym/constraints.txt)
  "$ng_venv/bin/pip" install -q --disable-pip-version-check --no-deps "$(grep '^nemo-gym==' test/integrations/nemogym/constraints.txt)"
fi
"$ng_venv/bin/pip" install -q --disable-pip-version-check --no-deps --no-build-isolation --force-reinstall ./sdk/python
(cd test/integrations && EVALBOX_BIN_DIR="$PWD/../../bin" "$ng_venv/bin/pytest" -q -W error -p no:cacheprovider nemogym)

# Harbor's `harbor run` with evalbox's own environment
# (evalbox.integrations.harbor): Harbor's pins plus hatchling, in a venv of
# Harbor's Python cached by the hash of both constraints files; the SDK from
# this checkout on every run.
echo "== Harbor (test/integrations/harbor): harbor run -e evalbox.integrations.harbor:EvalboxEnvironment against a real evalbox serve"
hn_venv=/var/cache/evalbox/venv-harbor-native-$(cat test/integrations/harbor/constraints.txt test/e2bcompat/harbor/constraints.txt | sha256sum | cut -c1-16)
if [ ! -x "$hn_venv/bin/harbor" ]; then
  rm -rf "$hn_venv"
  "$harbor_python" -m venv "$hn_venv"
  "$hn_venv/bin/pip" install -q --disable-pip-version-check -r test/integrations/harbor/constraints.txt
fi
"$hn_venv/bin/pip" install -q --disable-pip-version-check --no-deps --no-build-isolation --force-reinstall ./sdk/python
(cd test/integrations && EVALBOX_BIN_DIR="$PWD/../../bin" "$hn_venv/bin/pytest" -q -W error -p no:cacheprovider harbor)

# OpenEnv: its venv (Python >= 3.12; openenv itself --no-deps: its
# gradio, openai and huggingface_hub are imported by neither path), and the
# same pins' wheels for Python 3.11, the python template's, which the env
# server's template installs offline; both cached by the constraints' hash.
echo "== OpenEnv (test/integrations/openenv): openenv's GenericEnvClient and an env server in a sandbox through EvalboxProvider"
oe_hash=$(sha256sum test/integrations/openenv/constraints.txt | cut -c1-16)
oe_venv=/var/cache/evalbox/venv-openenv-$oe_hash
if [ ! -x "$oe_venv/bin/pytest" ]; then
  rm -rf "$oe_venv"
  "$harbor_python" -m venv "$oe_venv"
  "$oe_venv/bin/pip" install -q --disable-pip-version-check -r <(grep -v '^openenv==' test/integrations/openenv/constraints.txt)
  "$oe_venv/bin/pip" install -q --disable-pip-version-check --no-deps "$(grep '^openenv==' test/integrations/openenv/constraints.txt)"
fi
oe_wheels=/var/cache/evalbox/openenv-wheels-$oe_hash
if [ ! -d "$oe_wheels" ]; then
  rm -rf "$oe_wheels.tmp"
  "$oe_venv/bin/pip" download -q --disable-pip-version-check --no-deps --only-binary=:all: --implementation cp \
    --python-version 3.11 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$oe_wheels.tmp" -r <(grep -v -E '^(pytest|hatchling|pluggy|iniconfig|trove-classifiers|pathspec)==' test/integrations/openenv/constraints.txt)
  mv "$oe_wheels.tmp" "$oe_wheels"
fi
"$oe_venv/bin/pip" install -q --disable-pip-version-check --no-deps --no-build-isolation --force-reinstall ./sdk/python
(cd test/integrations && EVALBOX_BIN_DIR="$PWD/../../bin" EVALBOX_OPENENV_WHEELS="$oe_wheels" "$oe_venv/bin/pytest" -q -W error -p no:cacheprovider openenv)

# The end-to-end suite runs a race-enabled server next to the real agent
# and runsc.
mkdir -p bin/race
CGO_ENABLED=1 go build -race -o bin/race/evalbox ./cmd/evalbox
ln -sf ../evalbox-agent bin/race/evalbox-agent
ln -sf ../runsc bin/race/runsc
ln -sf ../evalbox-nsinit bin/race/evalbox-nsinit
export EVALBOX_BIN_DIR="$PWD/bin/race"
# Memory measurements (TestOutputBudgetBoundsWaits) need a server without
# the race detector, which multiplies a process's memory.
export EVALBOX_PLAIN_BIN_DIR="$PWD/bin"

# TestSchemathesis fuzzes the API with schemathesis, pinned (with its
# dependencies) by scripts/schemathesis-constraints.txt, in a venv cached
# by version.
st_version=$(sed -n 's/^schemathesis==//p' scripts/schemathesis-constraints.txt)
st_venv=/var/cache/evalbox/venv-schemathesis-$st_version
if [ ! -x "$st_venv/bin/st" ]; then
  echo "== installing schemathesis $st_version into $st_venv"
  rm -rf "$st_venv"
  python3 -m venv "$st_venv"
  "$st_venv/bin/pip" install -q --disable-pip-version-check "schemathesis==$st_version" -c scripts/schemathesis-constraints.txt
fi
export EVALBOX_SCHEMATHESIS="$st_venv/bin/st"

# internal/kubetest runs a real kube-apiserver and etcd, built from the Go
# module versions pinned in scripts/kube-versions.txt and cached by version
# (minutes, once). Its tests skip without EVALBOX_KUBE_BIN_DIR: here it is
# always set.
echo "== kube-apiserver and etcd (scripts/kube.sh)"
EVALBOX_KUBE_BIN_DIR=$(bash scripts/kube.sh)
export EVALBOX_KUBE_BIN_DIR

echo "== go test -race ./..."
CGO_ENABLED=1 go test -race -count=1 -timeout 25m ./...
