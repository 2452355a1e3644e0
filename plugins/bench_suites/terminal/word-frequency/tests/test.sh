#!/bin/bash
# Verifier: 1 in /logs/verifier/reward.txt when /app is in the state instruction.md asks for, else 0.
# Copied to /tests only after the agent has finished; checks with Python's standard library only.
mkdir -p /logs/verifier
if python3 /tests/test_outputs.py; then
    echo 1 > /logs/verifier/reward.txt
else
    echo 0 > /logs/verifier/reward.txt
fi
