"""The training proof: GLM-5's post-training pipeline in miniature, measured stage by stage (`glm5 bench proof`).

    config.py         ProofConfig (every knob; RUN/proof.json pins it for a resume), the 4.6M-parameter model, smoke()
    expert.py         the scripted expert: reads the repair family's issue and the tool results, emits read -> edit
                      -> bash (the failing test) -> answer; never sees the gold patch or the hidden test
    expert_server.py  that expert behind an OpenAI-compatible endpoint (FastAPI + uvicorn, 127.0.0.1, port 0), so
                      `glm5 bench swe --agent glm5` records its sessions as it records a model's
    corpus.py         the base model's corpus: synthetic sessions (read / run tests / rename / glob) with the
                      deployed system prompt and tool schemas, train-split names only; the copy drills
                      (write_drills, its draws in _Drills); distill's prompts (every turn's context)
    commands.py       the glm5 command of every stage (argv), and the run folder's layout
    measure.py        serve a stage's checkpoint (INT4 + MTP) and bench held-out against it; subprocess plumbing
    driver.py         the steps in order (one builder per kind: tasks, expert, corpus, init, base pretraining,
                      stage + measure + compare, RL's curve points), each skipped when its output exists; a
                      failure stops what needs it
    table.py          the stage table (markdown + JSON) and the plots, derived from the run folder

Life of a proof run: the family (plugins/bench_suites/repair_suite.py) is materialized into RUN/tasks/{train,heldout}
-> the expert's sessions on train are recorded by `glm5 bench swe` -> the corpus is written -> `glm5 model init`
-> base (`finetune sft --full` on the corpus) -> SFT (on the expert's resolved sessions) -> RL (`finetune rl --env
swe` on train) -> forget (SFT on renames) -> distill (`finetune distill --full`, teacher the stage before
forget), each a subprocess, every session with the compact agent profile; after each stage `glm5 serve` + `glm5 bench swe -k K` on held-out, and
`glm5 bench compare` with the stage before -> RUN/table.md, RUN/plots/.
"""
