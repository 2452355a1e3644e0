"""`glm5 bench`: SWE-bench and Harbor / Terminal-Bench tasks run by an agent, graded, recorded in a run folder.

    tasks.py        SWETask / TerminalTask; load_swe_tasks (JSONL / JSON / parquet), load_terminal_task(s)
    task_schema.py  what a SWE-bench row and a Harbor task.toml may hold: pydantic models (SWERow, HarborToml)
    environments.py the Environment protocol (start, exec, copy_in, copy_out, stop), Harbor's fixed paths
    env_kinds.py    the kinds by name: local, docker and plugins' (register_environments); make_environment
    process.py      run_argv: a command in its own session, its output kept head and tail (every environment's exec)
    local_env.py    LocalEnvironment: a folder of the trial behind /app, every command in bubblewrap
    docker_env.py   DockerEnvironment: the task's image or Dockerfile, /app and /logs bind-mounted
    repos.py        RepoCache: sources (path, URL, owner/name via --repos), a mirror each, a clone per trial;
                    working_tree_diff (the prediction)
    setup_cache.py  a task's setup once per repo + version, into a cached venv of the task's Python version
    run_folder.py   RunFolder: config.json (resume refusals), results.jsonl (appended, fsynced), the lock
    runner.py       run_bench: filter, --shard I/N, k attempts, n at a time, infra retries, resume
    scores.py       resolved rate + Wilson 95% interval, pass@k (unbiased), pass^k, tokens, cost, time; paired diff
    reports.py      report.json / junit.xml (junitparser) / summary.md from run folders; shards merged; compare
    suites.py       `--suite NAME`: suites plugins register as "<kind>:NAME", materialized
    validate.py     oracle solves, nop does not, FAIL_TO_PASS fails before the gold patch; validate_kinds for the CLI
    job.py          what the CLI commands do between parsing and showing
    log_parsers.py  per-test statuses from pytest, unittest, go test, cargo, jest, mocha, JUnit XML logs; plugins'
                    (register_log_parsers)
    harness_specs.py rows as the official SWE-bench harness publishes them (image, eval_script, log_parser,
                    eval_type; task repos): its test command, parsers, rules, image names (the swebench extra)
    harness_io.py   the harness's predictions JSONL out, its run report in (bench compare RUN REPORT.json)
    local_gaps.py   what --env local cannot honour of a task (a Dockerfile's RUN, ENV, base image; a row's image)
    agents.py       Glm5Agent (the `glm5 code -p` session in the trial's sandbox), OracleAgent, NopAgent, CmdAgent
    trial.py        run_trial: one attempt end to end -> TrialResult and the trial folder (also used by RL);
                    run_hidden / hidden_from_trials: what a trial (or an RL session) must not see
    grades.py       Grade (a trial's verdict) and the SWE-bench resolution rule on a status map (no I/O)
    grading.py      grade_swe (apply, test_patch, run, parse, then the rule), grade_terminal (reward file);
                    patch_files (unidiff)

Life of a run: job.load_tasks -> runner.run_bench (config.json claimed; finished trials skipped) -> per task and
attempt trial.run_trial: environment up -> agent -> patch.diff / verifier -> grade -> trial folder -> one line of
results.jsonl -> reports.build_report derives report.json, junit.xml, summary.md from the folder.
"""
