#!/usr/bin/env bash
# Makes the TLS material of a fleet (docs/deploy-kubernetes.md): a CA, the
# node agents' certificate and the API replicas' certificate, signed by it.
#
#   bash scripts/fleet-certs.sh [--namespace NS] [--days N] [--api-san SAN]... DIR
#
# DIR gets ca.crt, ca.key, node.crt, node.key, api.crt and api.key (keys
# 0600; DIR must not hold them already). Both certificates serve and
# authenticate as clients (mutual TLS both ways):
#   - node.crt names evalbox-node: the replicas dial nodes by pod IP and
#     check this one name (serve --node-tls-server-name=evalbox-node);
#   - api.crt names the API's Service, evalbox-api.NS.svc (and .svc.cluster.local),
#     which the nodes fetch templates from (node --control-plane), and each
#     --api-san (DNS:name or IP:address) as well.
# Keep ca.key offline: it is needed only to sign again. The two Secrets:
#   kubectl -n NS create secret generic evalbox-node-tls --from-file=ca.crt=DIR/ca.crt \
#     --from-file=tls.crt=DIR/node.crt --from-file=tls.key=DIR/node.key
#   kubectl -n NS create secret generic evalbox-api-tls --from-file=ca.crt=DIR/ca.crt \
#     --from-file=tls.crt=DIR/api.crt --from-file=tls.key=DIR/api.key
set -euo pipefail

ns=evalbox
days=825
sans=()
while [ $# -gt 1 ]; do
  case "$1" in
    --namespace) ns=$2; shift 2 ;;
    --days) days=$2; shift 2 ;;
    --api-san) sans+=("$2"); shift 2 ;;
    *) break ;;
  esac
done
if [ $# -ne 1 ] || [[ "$1" == -* ]]; then
  echo "usage: fleet-certs.sh [--namespace NS] [--days N] [--api-san DNS:name|IP:addr]... DIR" >&2
  exit 2
fi
dir=$1
if ! [[ "$ns" =~ ^[a-z0-9]([-a-z0-9]*[a-z0-9])?$ ]]; then
  echo "fleet-certs: --namespace $ns: want a DNS-1123 label" >&2
  exit 2
fi
if ! [[ "$days" =~ ^[1-9][0-9]*$ ]]; then
  echo "fleet-certs: --days $days: want a positive number" >&2
  exit 2
fi
for s in "${sans[@]}"; do
  if ! [[ "$s" =~ ^(DNS|IP):[A-Za-z0-9.:*-]+$ ]]; then
    echo "fleet-certs: --api-san $s: want DNS:name or IP:address" >&2
    exit 2
  fi
done
command -v openssl >/dev/null || { echo "fleet-certs: needs openssl" >&2; exit 1; }
mkdir -p "$dir"
for f in ca.key node.key api.key; do
  if [ -e "$dir/$f" ]; then
    echo "fleet-certs: $dir/$f exists: not overwriting keys" >&2
    exit 1
  fi
done
umask 077
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }

key "$dir/ca.key"
openssl req -x509 -new -key "$dir/ca.key" -sha256 -days $((days * 2)) -subj "/CN=evalbox fleet CA ($ns)" \
  -addext "basicConstraints=critical,CA:TRUE,pathlen:0" -addext "keyUsage=critical,keyCertSign,cRLSign" \
  -out "$dir/ca.crt"

# leaf NAME CN SAN: NAME.key and NAME.crt, signed by the CA.
leaf() {
  key "$dir/$1.key"
  openssl req -new -key "$dir/$1.key" -subj "/CN=$2" -out "$tmp/$1.csr"
  cat >"$tmp/$1.ext" <<EOF
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=serverAuth,clientAuth
subjectAltName=$3
EOF
  openssl x509 -req -in "$tmp/$1.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" -CAcreateserial -CAserial "$tmp/ca.srl" \
    -sha256 -days "$days" -extfile "$tmp/$1.ext" -out "$dir/$1.crt" 2>/dev/null
}

leaf node evalbox-node "DNS:evalbox-node"
api="DNS:evalbox-api.$ns.svc,DNS:evalbox-api.$ns.svc.cluster.local"
for s in "${sans[@]}"; do api+=",$s"; done
leaf api "evalbox-api.$ns.svc" "$api"
chmod 0644 "$dir/ca.crt" "$dir/node.crt" "$dir/api.crt"
echo "fleet-certs: wrote $dir/{ca,node,api}.{crt,key} for namespace $ns" >&2
