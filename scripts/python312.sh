#!/usr/bin/env bash
# Prints a Python >= 3.12 of this machine (python3.13, python3.12 or a pyenv version), the floor
# of Harbor, NeMo Gym's release and the TRL suite; exits 1 with a line on stderr when there is none.
set -euo pipefail
for py in python3.13 python3.12 $(ls -d "$(pyenv root 2>/dev/null || echo /nonexistent)"/versions/3.1[23]*/bin/python 2>/dev/null | sort -rV); do
  if command -v "$py" >/dev/null && "$py" -c 'import sys, venv; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
    echo "$py"; exit 0
  fi
done
echo "no Python >= 3.12 found (python3.12, python3.13 or a pyenv version)" >&2
exit 1
