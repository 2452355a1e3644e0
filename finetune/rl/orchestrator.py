"""The orchestrator: runs many agent sessions at once against the rollout server and yields rollouts.

Group g is `group_size` sessions on one task (task_order over groups: epochs of seeded permutations), sample i
of it is session "g{g}-s{i}". A session is: env.reset(task) -> the agent runs against a SessionModel (every
call token in, token out, with its weight version) -> env.grade() -> a Rollout handed to `sink` (the buffer).
An environment that fails anywhere gives an ENV_ERROR rollout; the rollout server failing stops the run.

Two ways to drive it, the same sessions either way:
- `run_groups(ids)`: run those groups' sessions (up to `concurrency` at once) and return when all are done;
  the synchronous run calls it, then trains. An env whose sessions make one call each (`single_call`: the
  completion env) has those calls gathered into one engine batch in session order (server.gather).
- `start(gate)`: a feeder thread keeps `concurrency` sessions in flight, starting group after group while
  `gate(n)` allows an n-th live group. The asynchronous run gates on staleness (AReaL's rule): a group may
  start only while live groups < (trainer version + tau + 1) * groups_per_step, so that nothing is sampled
  that the staleness rule would have to throw away, and tau = 0 is exactly the synchronous schedule.
Groups and samples already done (a resumed run's buffer, consumed steps) are skipped, never regenerated.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from finetune.rl.config import RLConfig
from finetune.rl.env import RolloutEnv, ServerFailure
from finetune.rl.rollout import ENV_ERROR, OK, Rollout
from finetune.rl.session_model import SessionModel


def task_order(n_tasks: int, step: int, per_step: int, seed: int) -> list[int]:
    """The tasks of `step`: epochs of seeded permutations, read `per_step` at a time (a resume reads the same).
    (Moved from finetune/grpo.py, which draws its tasks by it too.)"""
    out = []
    for k in range(step * per_step, (step + 1) * per_step):
        epoch, i = divmod(k, n_tasks)
        perm = list(range(n_tasks))
        random.Random(f"{seed}:{epoch}").shuffle(perm)
        out.append(perm[i])
    return out


class Orchestrator:
    def __init__(
        self,
        env: RolloutEnv,
        tasks: list,
        server,
        tokenizer,
        cfg: RLConfig,
        workdir: Path,
        sink: Callable[[Rollout], None],
        skip: Callable[[int, int], bool] = lambda g, i: False,
        skip_group: Callable[[int], bool] = lambda g: False,
        max_model_len: int | None = None,
    ):
        if not tasks:
            raise ValueError("no tasks")
        self.env, self.tasks, self.server, self.tok, self.cfg = env, tasks, server, tokenizer, cfg
        self.workdir, self.sink, self.skip, self.skip_group = Path(workdir), sink, skip, skip_group
        self.max_model_len = max_model_len
        self.next_group = 0
        self.error: BaseException | None = None
        self._pool = ThreadPoolExecutor(max_workers=cfg.concurrency, thread_name_prefix="glm5-rl-session")
        self._slots = threading.Semaphore(cfg.concurrency)
        self._stop = threading.Event()
        self._feeder: threading.Thread | None = None
        self.sessions_done = 0
        self.started = 0  # groups submitted by this process

    def task_of(self, group: int) -> int:
        return task_order(len(self.tasks), group, 1, self.cfg.seed)[0]

    def run_session(self, group: int, index: int) -> Rollout:
        t = self.task_of(group)
        sid = f"g{group}-s{index}"
        model = SessionModel(
            self.server, self.tok, sid, self.cfg.max_new_tokens, self.cfg.temperature, self.cfg.seed,
            self.cfg.keep_reasoning, self.max_model_len, self.cfg.thinking,
        )  # fmt: skip
        model.cancel_event = self._stop  # set when the run stops: sessions in flight end at their next call
        r = Rollout(group, index, t)
        t0 = time.monotonic()
        session = None
        try:
            session = self.env.reset(self.tasks[t], self.workdir / sid, index)
            session.run(model)
            if model.failure is not None:  # the agent loop may have caught it: the run stops all the same
                raise model.failure
            grade = session.grade()
            r.reward, r.solved, r.status, r.error, r.detail = (
                grade.reward,
                grade.solved,
                grade.status,
                grade.error,
                grade.detail,
            )
            if r.status == OK and r.reward is None:
                r.status, r.error = ENV_ERROR, r.error or "the grader gave no reward"
        except ServerFailure:
            raise
        except Exception as e:  # noqa: BLE001 - an environment crash is data for the crash-group rule
            if model.failure is not None:
                raise model.failure from e
            r.status, r.error = ENV_ERROR, f"{type(e).__name__}: {e}"
        finally:
            if session is not None:
                try:
                    session.close()
                except Exception:  # noqa: BLE001 - closing is best effort
                    pass
        r.calls = list(model.tito.calls)
        r.samples = model.tito.samples()
        r.seconds = round(time.monotonic() - t0, 3)
        return r

    def _one(self, group: int, index: int) -> None:
        try:
            if self.error is None and not self._stop.is_set():
                r = self.run_session(group, index)
                if not self._stop.is_set():  # a session cut short by the stop is not a finished rollout
                    self.sink(r)
                    self.sessions_done += 1
        except BaseException as e:  # noqa: BLE001 - reported to the run, which stops
            self.error = e
        finally:
            self._slots.release()

    def _submit_group(self, g: int) -> list:
        self.started += 1
        futs = []
        for i in range(self.cfg.group_size):
            if self.skip(g, i):
                continue
            self._slots.acquire()
            futs.append(self._pool.submit(self._one, g, i))
        return futs

    def next_ids(self, n: int) -> list[int]:
        """The next `n` groups that are not done yet (a resumed run skips consumed and dropped ones)."""
        out = []
        while len(out) < n:
            g = self.next_group
            self.next_group += 1
            if not self.skip_group(g):
                out.append(g)
        return out

    def run_groups(self, ids: list[int]) -> None:
        if getattr(self.env, "single_call", False) and hasattr(self.server, "gather"):
            # one call per session, all at once: the engine gets them as one batch, in session order
            todo = sum(1 for g in ids for i in range(self.cfg.group_size) if not self.skip(g, i))
            self.server.gather(min(todo, self.cfg.concurrency))
        futs = [f for g in ids for f in self._submit_group(g)]
        for f in futs:
            f.result()
        self.check()

    def start(self, gate: Callable[[int], bool], changed: threading.Condition) -> None:
        """Feed groups in the background while `gate(next group)` allows; `changed` is notified when the
        trainer's version moves or a group is dropped."""

        def feed():
            while not self._stop.is_set() and self.error is None:
                (g,) = self.next_ids(1)
                with changed:
                    while not gate(g) and not self._stop.is_set():
                        changed.wait(0.5)
                if self._stop.is_set():
                    return
                self._submit_group(g)

        self._feeder = threading.Thread(target=feed, name="glm5-rl-feeder", daemon=True)
        self._feeder.start()

    def check(self) -> None:
        if self.error is not None:
            raise self.error

    def close(self) -> None:
        self._stop.set()
        if self._feeder is not None:
            self._feeder.join(timeout=30)
        self._pool.shutdown(wait=True, cancel_futures=True)
