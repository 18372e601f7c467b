#!/bin/bash
# The reward: 1 when the answer is right, the image's build step ran and
# its ENV reached the command; else 0.
mkdir -p /logs/verifier
if [ "$(cat /app/answer.txt 2>/dev/null)" = "hello solved" ] && [ -f /app/built.txt ] && [ "${TASK_MODE:-}" = eval ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
