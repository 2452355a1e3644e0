#!/usr/bin/env bash
# The main job, end to end on one CPU machine: create a tiny GLM-5 checkpoint, serve it over the OpenAI API,
# load-test the server, run the coding agent headless against it in a scratch git repository, recording its
# trajectory, fine-tune the checkpoint on that trajectory with LoRA (glm5 finetune sft --merge), and re-align
# the fine-tuned model's MTP layer (glm5 finetune align-mtp).
# A tiny random model writes nonsense: this shows the loop works, not the model's skill.
# Usage: bash scripts/main_job.sh [WORKDIR]   (default: a new temporary folder)
# Rerun with the same WORKDIR to resume: finished stages are kept and skipped, a killed training run resumes.
set -euo pipefail
cd "$(dirname "$0")/.."
GLM5=${GLM5:-.venv/bin/glm5}
WORK=${1:-$(mktemp -d -t glm5-main-XXXX)}
PORT=${GLM5_PORT:-$(.venv/bin/python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
export GLM5_API_KEY=${GLM5_API_KEY:-main-job-key}
mkdir -p "$WORK"

echo "== 1. checkpoint: $WORK/tiny"
[ -f "$WORK/tiny/config.json" ] || $GLM5 model init --preset tiny --out "$WORK/tiny"
$GLM5 model info "$WORK/tiny"

echo "== 2. glm5 serve on 127.0.0.1:$PORT (log: $WORK/serve.log)"
$GLM5 serve "$WORK/tiny" --port "$PORT" --served-model-name glm5-tiny --max-model-len 4096 >"$WORK/serve.log" 2>&1 &
SERVER=$!
trap 'kill -INT $SERVER 2>/dev/null; wait $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 1 240); do
  curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && break
  kill -0 $SERVER 2>/dev/null || { cat "$WORK/serve.log"; exit 1; }
  sleep 0.5
done
curl -sf "http://127.0.0.1:$PORT/health" >/dev/null || { echo "server not healthy"; cat "$WORK/serve.log"; exit 1; }

echo "== 3. glm5 bench serve (16 requests, 4 at a time)"
$GLM5 bench serve --base-url "http://127.0.0.1:$PORT" --model glm5-tiny --num-prompts 16 --max-concurrency 4 \
  --random-input-len 64 --random-output-len 16 --output-file "$WORK/bench_serve.jsonl"

echo "== 4. glm5 code -p in a scratch repository (every tool call denied, 2 turns at most)"
REPO="$WORK/repo"
if [ -s "$WORK/code_result.json" ] && ls "$REPO/.glm5/sessions/"*.jsonl >/dev/null 2>&1; then
  echo "(done before: $WORK/code_result.json)"
else
if [ ! -d "$REPO/.git" ]; then
  mkdir -p "$REPO" && git -C "$REPO" init -q
  printf 'def add(a, b):\n    return a - b\n' >"$REPO/calc.py"
  git -C "$REPO" add -A && git -C "$REPO" -c user.email=glm5@localhost -c user.name=glm5 commit -qm init
fi
set +e
(cd "$REPO" && "$OLDPWD/$GLM5" code -p "Fix the bug in calc.py" --base-url "http://127.0.0.1:$PORT/v1" \
  --model glm5-tiny --api-key-env GLM5_API_KEY --approval deny --max-turns 2 --output-format json) \
  >"$WORK/code_result.json"
rc=$?
set -e
echo "glm5 code exit code: $rc (0 done, 3 turn limit reached)"
.venv/bin/python -c "import json,sys; r=json.load(open(sys.argv[1])); print('trajectory:', r['trajectory']); print('stats:', r['stats'])" "$WORK/code_result.json"
[ "$rc" = 0 ] || [ "$rc" = 3 ]
fi
# Each training command below works in .OUT.partial and renames it to OUT when it finishes: an OUT that exists is
# a finished stage (skipped), and a killed one resumes from its .partial folder.
echo "== 5. glm5 finetune sft (LoRA) on what the agent just recorded, merged into a servable checkpoint"
[ -d "$WORK/tiny-sft" ] && echo "(done before: $WORK/tiny-sft)" \
  || $GLM5 finetune sft "$WORK/tiny" --out "$WORK/tiny-sft" --trajectories "$REPO/.glm5/sessions" --steps 10 --merge
echo "== 6. glm5 finetune align-mtp: the MTP layer re-aligned with the fine-tuned model (outputs unchanged)"
[ -d "$WORK/tiny-sft-aligned" ] && echo "(done before: $WORK/tiny-sft-aligned)" \
  || $GLM5 finetune align-mtp "$WORK/tiny-sft" --out "$WORK/tiny-sft-aligned" \
    --trajectories "$REPO/.glm5/sessions" --steps 20
echo "== 7. glm5 finetune rl: GRPO on tasks a command checks (here: does the completion contain a digit?)"
printf '%s\n' '{"prompt": "def add(a, b):"}' '{"messages": [{"role": "user", "content": "Count to three."}]}' \
  >"$WORK/rl_tasks.jsonl"
[ -d "$WORK/tiny-rl" ] && echo "(done before: $WORK/tiny-rl)" \
  || $GLM5 finetune rl "$WORK/tiny-sft" --out "$WORK/tiny-rl" --tasks "$WORK/rl_tasks.jsonl" --steps 4 \
  --prompts-per-step 2 --group-size 4 --max-new-tokens 16 \
  --reward '{"type": "command", "run": "grep -qE \"[0-9]\"", "timeout": 10}'
echo "== done: everything is under $WORK"
