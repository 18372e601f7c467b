#!/bin/bash
set -euo pipefail
echo "$(cat /app/data.txt) solved" > /app/answer.txt
