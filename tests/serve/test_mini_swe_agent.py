"""A real third-party agent harness against `glm5 serve`: mini-swe-agent (through LiteLLM's OpenAI provider)
runs a two-step bash task end to end, so the whole OpenAI tool-calling round trip is exercised by someone else's
client: tools in, GLM-5 `<tool_call>` parsed out, the assistant's call and the tool's result rendered back into
the next prompt. The model is the scripted engine (a random-weight model never calls a tool); LiteLLM's
streaming chunk builder checks our streamed tool-call deltas too."""

from __future__ import annotations

import json
import os
import tempfile

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network lookups at import
os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
os.environ.setdefault("MSWEA_GLOBAL_CONFIG_DIR", tempfile.mkdtemp(prefix="mswea-"))  # not the user's config

minisweagent = pytest.importorskip("minisweagent")
litellm = pytest.importorskip("litellm")

from model.tokenizer import Tokenizer  # noqa: E402
from serve.http.app import create_app  # noqa: E402
from serve.http.settings import ServerSettings  # noqa: E402
from tests.serve.scripted_engine import ScriptedEngine  # noqa: E402
from tests.serve.server_thread import ServerThread  # noqa: E402

MODEL = "glm-5-test"
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # litellm's pydantic models warn on import


def bash_call(command: str) -> str:
    return f"<tool_call>bash<arg_key>command</arg_key><arg_value>{command}</arg_value></tool_call>"


def agent_script(tok):
    def write(prompt_ids, params):
        prompt = tok.decode(prompt_ids)
        if "<tool_response>" not in prompt:
            return "First write the file.</think>I will create it." + bash_call("echo hello > out.txt && cat out.txt")
        return "The file is there.</think>Done." + bash_call(
            "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && cat out.txt"
        )

    return write


@pytest.fixture(scope="module")
def server():
    tok = Tokenizer.shipped()
    engine = ScriptedEngine(tok, agent_script(tok), max_model_len=4096)
    with ServerThread(create_app(engine, tok, ServerSettings(MODEL, api_key="k"))) as s:
        s.wait_healthy()
        s.engine, s.tok = engine, tok
        yield s


def test_mini_swe_agent_solves_a_bash_task(server, tmp_path):
    import yaml
    from minisweagent.agents.default import DefaultAgent
    from minisweagent.config import builtin_config_dir
    from minisweagent.environments.local import LocalEnvironment
    from minisweagent.models.litellm_model import LitellmModel

    config = yaml.safe_load((builtin_config_dir / "default.yaml").read_text())["agent"]
    model = LitellmModel(
        model_name=f"openai/{MODEL}",
        model_kwargs={"api_base": server.url + "/v1", "api_key": "k", "temperature": 0.0},
        cost_tracking="ignore_errors",
    )
    agent = DefaultAgent(model, LocalEnvironment(cwd=str(tmp_path)), **{**config, "step_limit": 5})
    result = agent.run("Create out.txt containing hello, then submit.")

    assert result["exit_status"] == "Submitted" and result["submission"] == "hello\n"
    assert (tmp_path / "out.txt").read_text() == "hello\n"
    assistant = [m for m in agent.messages if m["role"] == "assistant"]
    assert len(assistant) == 2 and assistant[0]["tool_calls"][0]["function"]["name"] == "bash"
    assert assistant[0]["content"] == "I will create it."
    second_prompt = server.tok.decode(server.engine.seen[-1][0])
    # The agent's first call and the tool's output came back to the model in GLM-5's format.
    assert bash_call("echo hello > out.txt && cat out.txt") in second_prompt
    assert "<|observation|><tool_response>" in second_prompt and "hello" in second_prompt.rsplit("<tool_response>")[-1]


def test_litellm_streaming_rebuilds_the_tool_call(server):
    tools = [
        {
            "type": "function",
            "function": {
                "name": "bash",
                "parameters": {
                    "type": "object",
                    "properties": {"command": {"type": "string"}},
                    "required": ["command"],
                },
            },
        }
    ]
    messages = [{"role": "user", "content": "make the file"}]
    kwargs = dict(model=f"openai/{MODEL}", api_base=server.url + "/v1", api_key="k", tools=tools, messages=messages)
    chunks = list(litellm.completion(stream=True, **kwargs))
    rebuilt = litellm.stream_chunk_builder(chunks, messages=messages)
    call = rebuilt.choices[0].message.tool_calls[0]
    assert call.function.name == "bash"
    assert json.loads(call.function.arguments) == {"command": "echo hello > out.txt && cat out.txt"}
    assert rebuilt.choices[0].finish_reason == "tool_calls"
    whole = litellm.completion(**kwargs)
    assert whole.choices[0].message.tool_calls[0].function.arguments == call.function.arguments
    assert whole.choices[0].message.content == "I will create it."
