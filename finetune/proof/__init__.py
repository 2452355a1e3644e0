"""The training proof: GLM-5's post-training pipeline in miniature, measured stage by stage (`glm5 bench proof`).

    expert.py         the scripted expert: reads the repair family's issue and the tool results, emits read -> edit
                      -> bash (the failing test) -> answer; never sees the gold patch
    expert_server.py  that expert behind an OpenAI-compatible endpoint (FastAPI + uvicorn, 127.0.0.1, port 0), so
                      `glm5 bench swe --agent glm5` records its sessions as it records a model's

Life of a proof run: the family (plugins/bench_suites/repair_suite.py) is materialized into RUN/tasks/{train,heldout}
-> the expert's sessions on train are recorded by `glm5 bench swe` -> each stage is a glm5 command (a subprocess)
-> each stage's model is served and benched on held-out.
"""
