"""A session that worked in a terminal is training data like any other: `finetune sft` reads its trajectory into
one sequence whose prompt carries the terminal tools' schemas and the screens exactly as the model saw them (as
context), and whose targets are the model's terminal calls."""

from __future__ import annotations

from agent.trajectory import Trajectory
from finetune.data.sources import load_sequences
from finetune.data.trajectories import DataOptions
from model.chat import render_for_training
from model.tokenizer import Tokenizer
from tests.agent.conftest import fake_model, repo  # noqa: F401 (fixtures)
from tests.agent.fake_model import reply
from tests.agent.helpers import make_session

TOK = Tokenizer.shipped()


def test_a_terminal_session_trains_as_recorded(repo, fake_model):  # noqa: F811
    fake_model.script = [
        reply(tools=[("terminal_open", {"session": "main"})]),
        reply(tools=[("terminal_send", {"session": "main", "input": ["echo screen-$((6*7))", "<Enter>"],
                                        "wait_for": "^screen-42$"})]),  # fmt: skip
        reply("done"),
    ]
    s = make_session(repo, fake_model, flags={"mode": "auto"})
    try:
        s.agent.run("use the terminal")
    finally:
        s.close()
    traj = Trajectory.load(s.path)
    seqs, report = load_sequences([s.path], TOK, DataOptions())
    assert len(seqs) == 1 and not report.skipped
    want = render_for_training(TOK, traj.messages(), traj.tools, clear_thinking=False)
    assert seqs[0].ids == want.ids and seqs[0].mask == want.generated_mask
    text = TOK.decode(seqs[0].ids)
    targets = TOK.decode([t for t, m in zip(seqs[0].ids, seqs[0].mask, strict=True) if m])
    assert "terminal_send" in targets and "[terminal main:" not in targets  # the call is trained, the screen context
    screen = next(r["result"] for r in traj.records if r["type"] == "tool" and r["name"] == "terminal_send")
    assert screen in text and "terminal_open" in text.split("use the terminal")[0]  # schemas in the prompt
