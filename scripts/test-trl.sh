#!/usr/bin/env bash
# One real GRPOTrainer step on CPU with evalbox's rewards (test/integrations/trl), apart from
# scripts/test.sh because torch and its libraries are several GB. Builds evalbox, makes a venv of
# Python >= 3.12 with the pins of test/integrations/trl/constraints.txt (cached under
# /var/cache/evalbox by their hash) and runs the suite against a real `evalbox serve`.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/build.sh
export EVALBOX_TEMPLATES_DIR=${EVALBOX_TEMPLATES_DIR:-/var/cache/evalbox/templates}
bin/evalbox template init --templates-dir "$EVALBOX_TEMPLATES_DIR" --quiet

py=$(bash scripts/python312.sh) || { echo "test-trl: TRL's suite needs Python >= 3.12" >&2; exit 1; }
venv=/var/cache/evalbox/venv-trl-$(sha256sum test/integrations/trl/constraints.txt | cut -c1-16)
if [ ! -x "$venv/bin/pytest" ]; then
  rm -rf "$venv"
  "$py" -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check -r test/integrations/trl/constraints.txt
fi
"$venv/bin/pip" install -q --disable-pip-version-check --no-deps --no-build-isolation --force-reinstall ./sdk/python
echo "== TRL (test/integrations/trl): a real GRPOTrainer step on CPU with evalbox's rewards"
(cd test/integrations && EVALBOX_BIN_DIR="$PWD/../../bin" "$venv/bin/pytest" -q -W error::pytest.PytestUnraisableExceptionWarning -p no:cacheprovider trl)
