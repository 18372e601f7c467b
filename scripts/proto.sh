#!/usr/bin/env bash
# Regenerates the Go code of proto/ with pinned tools: protoc from Debian
# 12's protobuf-compiler package (installed when missing, with
# libprotobuf-dev for the well-known types; its version is checked) and the
# plugins protoc-gen-go, protoc-gen-go-grpc and protoc-gen-connect-go at the
# versions of go.mod's tool directives.
#   proto/evalbox/node/v1  the node contract (gRPC)    → internal/nodeapi/nodepb
#   proto/e2b/envd         E2B's envd, served by evalbox (Connect)
#                                                      → internal/compat/e2b/envdpb
#
#   bash scripts/proto.sh          regenerate in place
#   bash scripts/proto.sh --check  fail when the checked-in code differs
#                                  from a fresh generation (scripts/test.sh)
set -euo pipefail
cd "$(dirname "$0")/.."

protoc_version="libprotoc 3.21.12"
if ! command -v protoc >/dev/null || [ ! -f /usr/include/google/protobuf/timestamp.proto ]; then
  echo "proto: installing protobuf-compiler and libprotobuf-dev" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq protobuf-compiler libprotobuf-dev >/dev/null
fi
if [ "$(protoc --version)" != "$protoc_version" ]; then
  echo "proto: need $protoc_version (Debian 12's protobuf-compiler), have $(protoc --version)" >&2
  exit 1
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
go build -o "$tmp/bin/" google.golang.org/protobuf/cmd/protoc-gen-go google.golang.org/grpc/cmd/protoc-gen-go-grpc \
  connectrpc.com/connect/cmd/protoc-gen-connect-go

mkdir -p "$tmp/out"
plugins=(--plugin=protoc-gen-go="$tmp/bin/protoc-gen-go" --go_out="$tmp/out" --go_opt=module=github.com/evalbox/evalbox)
protoc -I proto "${plugins[@]}" \
  --plugin=protoc-gen-go-grpc="$tmp/bin/protoc-gen-go-grpc" \
  --go-grpc_out="$tmp/out" --go-grpc_opt=module=github.com/evalbox/evalbox \
  evalbox/node/v1/node.proto
protoc -I proto -I /usr/include "${plugins[@]}" \
  --plugin=protoc-gen-connect-go="$tmp/bin/protoc-gen-connect-go" \
  --connect-go_out="$tmp/out" --connect-go_opt=module=github.com/evalbox/evalbox \
  e2b/envd/process.proto e2b/envd/filesystem.proto

gens=(internal/nodeapi/nodepb internal/compat/e2b/envdpb)
if [ "${1:-}" = "--check" ]; then
  for gen in "${gens[@]}"; do
    mkdir -p "$tmp/have/$gen"
    (cd "$gen" && find . \( -name '*.pb.go' -o -name '*.connect.go' \) -exec cp --parents {} "$tmp/have/$gen/" \;) 2>/dev/null || true
    if ! diff -r "$tmp/out/$gen" "$tmp/have/$gen"; then
      echo "proto: $gen is not what scripts/proto.sh generates from proto/: run it and commit the result" >&2
      exit 1
    fi
    echo "proto: $gen is up to date" >&2
  done
  exit 0
fi
for gen in "${gens[@]}"; do
  if [ -d "$gen" ]; then
    find "$gen" \( -name '*.pb.go' -o -name '*.connect.go' \) -delete
  fi
  mkdir -p "$gen"
  cp -r "$tmp/out/$gen/." "$gen/"
  echo "proto: regenerated $gen" >&2
done
