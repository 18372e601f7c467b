#!/usr/bin/env bash
# Builds a static kube-apiserver and etcd from the Go module versions pinned
# in scripts/kube-versions.txt, the way controller-runtime's envtest uses
# them: a real API server for the tests (internal/kubetest), with no kubelet,
# scheduler or controller manager. Prints the directory that holds both
# binaries on stdout (everything else goes to stderr), so that
#
#   EVALBOX_KUBE_BIN_DIR=$(bash scripts/kube.sh); export EVALBOX_KUBE_BIN_DIR
#
# is all a caller needs. The binaries are cached in
# ${EVALBOX_KUBE_CACHE:-/var/cache/evalbox}/kube-<kubernetes>-etcd-<etcd>/bin;
# a cached build is reused at once. A cold build (module downloads
# included) took 17 min on this 2-core machine while other builds shared it
# (11.4 min of user CPU), and its largest process (kube-apiserver's link)
# peaked at 2.3 GB RSS; expect about 7 min on an idle one.
#
# Neither server is a dependency of evalbox: each is built in a throwaway
# module of its own under the cache directory, so evalbox's go.mod only ever
# holds client-go. k8s.io/kubernetes is not meant to be used as a module: its
# go.mod requires its staging modules (k8s.io/api, k8s.io/apiserver, …) at
# v0.0.0 and replaces them by ./staging/src/… paths, which a dependent module
# ignores; so the build module replaces each of them by its published v0.X.Y
# release, the one tagged with v1.X.Y. etcd's server module
# (go.etcd.io/etcd/server/v3) is its binary's main package and needs no such
# help.
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=kube-versions.txt
. scripts/kube-versions.txt
: "${KUBERNETES:?scripts/kube-versions.txt sets no KUBERNETES}" "${ETCD:?scripts/kube-versions.txt sets no ETCD}"

dir=${EVALBOX_KUBE_CACHE:-/var/cache/evalbox}/kube-$KUBERNETES-etcd-$ETCD
bin=$dir/bin
# One build at a time per version pair: test runs of several worktrees may
# start together on one machine.
mkdir -p "$(dirname "$dir")"
exec 9>"$dir.lock"
flock 9
if [ -f "$dir/.done" ] && [ -x "$bin/kube-apiserver" ] && [ -x "$bin/etcd" ]; then
  echo "kube: cached in $bin (kube-apiserver $KUBERNETES, etcd $ETCD)" >&2
  echo "$bin"
  exit 0
fi

echo "kube: building kube-apiserver $KUBERNETES and etcd $ETCD into $bin (once per version pair; minutes)" >&2
rm -rf "$dir"
mkdir -p "$bin" "$dir/src/kube-apiserver" "$dir/src/etcd"

# Both are static, trimmed binaries, as their releases are. The evalbox
# module's own settings (a go.work, a -mod flag) must not leak into the
# throwaway modules; GOFLAGS keeps what the caller set otherwise (e.g.
# -buildvcs=false).
export CGO_ENABLED=0 GOWORK=off GOFLAGS="${GOFLAGS:-} -mod=mod"

# kube-apiserver. The staging modules are listed from the .mod of the
# pinned k8s.io/kubernetes itself, so a release that adds one needs no edit.
minor=${KUBERNETES#v1.}            # 37.2
staging=v0.$minor                  # v0.37.2
(
  cd "$dir/src/kube-apiserver"
  cat >go.mod <<EOF
// Throwaway module that builds kube-apiserver $KUBERNETES for evalbox's tests
// (scripts/kube.sh). Not part of evalbox.
module evalbox.invalid/kube-apiserver

go 1.26.0
EOF
  kmod=$(go mod download -json "k8s.io/kubernetes@$KUBERNETES" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
  [ -n "$kmod" ] || { echo "kube: cannot download k8s.io/kubernetes@$KUBERNETES" >&2; exit 1; }
  mods=$(sed -n 's#^[[:space:]]*\(k8s\.io/[^[:space:]]*\) => \./staging/src/.*#\1#p' "$kmod")
  [ -n "$mods" ] || { echo "kube: no staging replacements found in $kmod" >&2; exit 1; }
  args=()
  for m in $mods; do args+=("-replace=$m=$m@$staging"); done
  go mod edit "${args[@]}" "-require=k8s.io/kubernetes@$KUBERNETES"
  go get -tool "k8s.io/kubernetes/cmd/kube-apiserver@$KUBERNETES" >&2
  # The version the server reports (/version) and judges its own
  # compatibility by: a module build would otherwise say v0.0.0-master.
  major=1 kminor=${minor%%.*}
  ld="-s -w"
  for p in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
    ld+=" -X $p.gitVersion=$KUBERNETES -X $p.gitMajor=$major -X $p.gitMinor=$kminor -X $p.gitTreeState=clean"
  done
  go build -trimpath -ldflags "$ld" -o "$bin/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver
)

# etcd.
(
  cd "$dir/src/etcd"
  cat >go.mod <<EOF
// Throwaway module that builds etcd $ETCD for evalbox's tests
// (scripts/kube.sh). Not part of evalbox.
module evalbox.invalid/etcd

go 1.26.0
EOF
  go get -tool "go.etcd.io/etcd/server/v3@$ETCD" >&2
  go build -trimpath -ldflags "-s -w" -o "$bin/etcd" go.etcd.io/etcd/server/v3
)

"$bin/kube-apiserver" --version >&2
"$bin/etcd" --version >&2
touch "$dir/.done"
echo "kube: built into $bin" >&2
echo "$bin"
