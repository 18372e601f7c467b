#!/usr/bin/env bash
# Regenerates the Go code of proto/ (internal/nodeapi/nodepb) with pinned
# tools: protoc from Debian 12's protobuf-compiler package (installed when
# missing; its version is checked) and the plugins protoc-gen-go and
# protoc-gen-go-grpc at the versions of go.mod's tool directives.
#
#   bash scripts/proto.sh          regenerate in place
#   bash scripts/proto.sh --check  fail when the checked-in code differs
#                                  from a fresh generation (scripts/test.sh)
set -euo pipefail
cd "$(dirname "$0")/.."

protoc_version="libprotoc 3.21.12"
if ! command -v protoc >/dev/null; then
  echo "proto: installing protobuf-compiler" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq protobuf-compiler >/dev/null
fi
if [ "$(protoc --version)" != "$protoc_version" ]; then
  echo "proto: need $protoc_version (Debian 12's protobuf-compiler), have $(protoc --version)" >&2
  exit 1
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
go build -o "$tmp/bin/" google.golang.org/protobuf/cmd/protoc-gen-go google.golang.org/grpc/cmd/protoc-gen-go-grpc

protos=(proto/evalbox/node/v1/node.proto)
mkdir -p "$tmp/out"
protoc -I proto \
  --plugin=protoc-gen-go="$tmp/bin/protoc-gen-go" --plugin=protoc-gen-go-grpc="$tmp/bin/protoc-gen-go-grpc" \
  --go_out="$tmp/out" --go_opt=module=github.com/evalbox/evalbox \
  --go-grpc_out="$tmp/out" --go-grpc_opt=module=github.com/evalbox/evalbox \
  "${protos[@]#proto/}"

gen=internal/nodeapi/nodepb
if [ "${1:-}" = "--check" ]; then
  mkdir -p "$tmp/have"
  cp "$gen"/*.pb.go "$tmp/have/" 2>/dev/null || true
  if ! diff -r "$tmp/out/$gen" "$tmp/have"; then
    echo "proto: $gen is not what scripts/proto.sh generates from proto/: run it and commit the result" >&2
    exit 1
  fi
  echo "proto: $gen is up to date" >&2
  exit 0
fi
mkdir -p "$gen"
rm -f "$gen"/*.pb.go
cp "$tmp/out/$gen"/*.pb.go "$gen/"
echo "proto: regenerated $gen" >&2
