"""Training data has a provenance (issue 40, item 5): sessions this machine recorded carry a keyed chain; a
repository's committed `.glm5/sessions/*.jsonl` is neither trained on nor continued unless the user says so."""

from __future__ import annotations

import json
import os
import time

from agent.provenance import key_path
from agent.session import find_session
from agent.trajectory import file_is_ours
from finetune.data.sources import load_sequences
from finetune.data.trajectories import DataOptions
from model.tokenizer import Tokenizer
from tests.finetune.test_data import _session


def _foreign(path, text: str) -> None:
    """What a repository can commit: a well-formed trajectory, made elsewhere (no mark of this machine's key)."""
    _session(path)
    recs = [json.loads(line) for line in path.read_text().splitlines()]
    for r in recs:
        r.pop("mac")
    path.write_text("".join(json.dumps(r).replace('"done"', json.dumps(text)) + "\n" for r in recs))


def _texts(seqs, tok) -> str:
    return "".join(tok.decode(s.ids) for s in seqs)


def test_a_committed_session_is_not_trained_on_unless_allowed(tmp_path, monkeypatch):
    monkeypatch.setenv("GLM5_CONFIG_DIR", str(tmp_path / "config"))
    tok = Tokenizer.shipped()
    d = tmp_path / "repo" / ".glm5" / "sessions"
    d.mkdir(parents=True)
    _session(d / "mine.jsonl")
    _foreign(d / "planted.jsonl", "PLANTED TEXT")
    seqs, report = load_sequences([d], tok, DataOptions())
    assert "PLANTED" not in _texts(seqs, tok) and seqs  # ours is still trained on
    assert any("planted.jsonl:1" in s and "--allow-foreign" in s for s in report.skipped), report.skipped
    assert oct(key_path().stat().st_mode & 0o777) == "0o600"
    seqs, _ = load_sequences([d], tok, DataOptions(allow_foreign=True))
    assert "PLANTED" in _texts(seqs, tok)


def test_lines_appended_to_one_of_our_sessions_are_left_out(tmp_path, monkeypatch):
    monkeypatch.setenv("GLM5_CONFIG_DIR", str(tmp_path / "config"))
    tok = Tokenizer.shipped()
    p = tmp_path / "s.jsonl"
    _session(p)
    assert file_is_ours(p)
    with open(p, "a") as f:
        f.write(json.dumps({"type": "message", "index": 5, "message": {"role": "assistant", "content": "APPENDED"},
                            "ts": 2.0, "mac": "0" * 40}) + "\n")  # fmt: skip
    assert not file_is_ours(p)
    seqs, report = load_sequences([p], tok, DataOptions())
    assert "APPENDED" not in _texts(seqs, tok) and any("chain broken" in s for s in report.skipped)


def test_continue_picks_the_latest_session_recorded_here_not_a_newer_committed_one(tmp_path, monkeypatch):
    monkeypatch.setenv("GLM5_CONFIG_DIR", str(tmp_path / "config"))
    d = tmp_path / "sessions"
    d.mkdir()
    _session(d / "mine.jsonl")
    _foreign(d / "planted.jsonl", "x")
    later = time.time() + 100
    os.utime(d / "planted.jsonl", (later, later))  # the newest file
    assert find_session(d, None).name == "mine.jsonl"
    assert find_session(d, "planted").name == "planted.jsonl"  # named explicitly: the user's choice
    (d / "mine.jsonl").unlink()
    try:
        find_session(d, None)
        raise AssertionError("a foreign session was continued")
    except FileNotFoundError as e:
        assert "--resume" in str(e)
