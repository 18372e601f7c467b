#!/usr/bin/env bash
# Builds evalbox, the guest agent and runsc (static, from the gvisor module
# pinned in go.mod) into bin/. Installs the Debian packages evalbox needs
# when they are missing. Idempotent; Go's build cache makes re-runs fast.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v mmdebstrap >/dev/null || need+=(mmdebstrap)
command -v iptables >/dev/null || need+=(iptables)
[ -e /usr/share/keyrings/debian-archive-keyring.gpg ] || need+=(debian-archive-keyring)
command -v go >/dev/null || need+=(golang-go)
# The polyglot template's npm packages (TypeScript's compiler) are installed
# with the host's npm (internal/template: BuiltinSpec.Npm).
command -v npm >/dev/null || need+=(npm)
if [ ${#need[@]} -gt 0 ]; then
  echo "build: installing ${need[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need[@]}" >/dev/null
fi

mkdir -p bin
export CGO_ENABLED=0
go build -trimpath -o bin/evalbox ./cmd/evalbox
go build -trimpath -ldflags='-s -w' -o bin/evalbox-agent ./cmd/evalbox-agent
# The namespaces runtime's init stage, run once per sandbox start: a binary
# of its own starts several milliseconds sooner than evalbox would.
go build -trimpath -ldflags='-s -w' -o bin/evalbox-nsinit ./cmd/evalbox-nsinit
# runsc: the cgo build breaks the gofer, so it is always CGO_ENABLED=0. Its
# seccomp filters are precompiled (internal/runtime/gvisor/seccompgen) into
# a copy of the pinned gvisor module, cached by that module's version and
# the generator's source: a sandbox start then skips compiling them.
gvisor_version=$(go list -m -f '{{.Version}}' gvisor.dev/gvisor)
gen_key=$(cat go.mod go.sum internal/runtime/gvisor/seccompgen/*.go | sha256sum | cut -c1-16)
runsc_src=${EVALBOX_BUILD_CACHE:-/var/cache/evalbox/build}/runsc-src-$gvisor_version-$gen_key
if [ ! -f "$runsc_src/.done" ]; then
  echo "build: precompiling runsc's seccomp filters into $runsc_src (once per gvisor version)" >&2
  rm -rf "$runsc_src"
  go run ./internal/runtime/gvisor/seccompgen -out "$runsc_src"
  touch "$runsc_src/.done"
fi
go build -trimpath -modfile "$runsc_src/go.mod" -o bin/runsc gvisor.dev/gvisor/runsc
echo "build: bin/evalbox bin/evalbox-agent bin/evalbox-nsinit bin/runsc" >&2
