#!/bin/bash
passed=0
for case in "1 2 3" "10 5 15" "0 0 0"; do
  set -- $case
  [ "$(bash /app/add.sh "$1" "$2")" = "$3" ] && passed=$((passed + 1))
done
if [ "$passed" = 3 ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
