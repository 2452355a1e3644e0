#!/bin/bash
# Verifier: 1 in /logs/verifier/reward.txt when /app is in the state instruction.md asks for, else 0; the checks
# one by one in /logs/verifier/ctrf.json. Copied to /tests only after the agent has finished. When the checks
# cannot run at all (no python3, killed) no reward is written: that is an infrastructure failure, not a 0.
mkdir -p /logs/verifier
python3 /tests/test_outputs.py
status=$?
case $status in
    0) echo 1 > /logs/verifier/reward.txt ;;
    1) echo 0 > /logs/verifier/reward.txt ;;
    *) echo "the checks could not run (exit $status): no reward written" >&2; exit "$status" ;;
esac
