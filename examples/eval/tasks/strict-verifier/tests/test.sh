#!/bin/bash
# This verifier fails itself (no reward written) when the answer file is missing:
# keel scores that verifier_error, never 0.
set -e
answer=$(cat /app/answer.txt)
if [ "$answer" = "ok" ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
