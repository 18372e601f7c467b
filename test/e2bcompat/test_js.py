"""npm e2b (test/e2bcompat/js, pinned by its package-lock.json), unchanged, against evalbox: run by `node --test`.

scripts/test.sh installs its node_modules (npm ci, cached by the lockfile's hash) and links them here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from .conftest import Server

JS = Path(__file__).resolve().parent / "js"


def test_npm_e2b(key: str, server: Server) -> None:
    node = shutil.which("node")
    assert node, "node is not installed (scripts/test.sh installs it)"
    assert (JS / "node_modules" / "e2b").is_dir(), "npm e2b is not installed: run scripts/test.sh (npm ci into js/)"
    env = dict(os.environ, E2B_API_URL=server.url, E2B_SANDBOX_URL=server.url, E2B_API_KEY=key)
    r = subprocess.run([node, "--test", "sdk.test.mjs"], cwd=JS, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
