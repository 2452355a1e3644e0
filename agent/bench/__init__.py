"""`glm5 bench`: SWE-bench and Harbor / Terminal-Bench tasks run by an agent, graded, recorded in a run folder.

    tasks.py        SWETask / TerminalTask; load_swe_tasks (JSONL / JSON / parquet), load_terminal_task(s)
    environments.py the Environment protocol (start, exec, copy_in, copy_out, stop), Harbor's fixed paths, kinds
    log_parsers.py  per-test statuses from pytest, unittest, go test, cargo, jest, mocha, JUnit XML logs
    grading.py      grade_swe (apply, test_patch, run, parse, the SWE-bench rule), grade_terminal (reward file)

Life of a run: tasks -> (per task, per attempt) trial: environment up -> agent -> patch / verifier -> grade ->
trial folder + one line of results.jsonl -> reports derived from the folder.
"""
