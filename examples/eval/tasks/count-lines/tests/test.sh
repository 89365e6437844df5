#!/bin/bash
# reward.json: 1 for the right count, 0.5 for a number that is off, 0 otherwise.
answer=$(tr -d '[:space:]' < /app/count.txt 2>/dev/null)
if [ "$answer" = "5" ]; then reward=1
elif [[ "$answer" =~ ^[0-9]+$ ]]; then reward=0.5
else reward=0; fi
echo "{\"reward\": $reward}" > /logs/verifier/reward.json
