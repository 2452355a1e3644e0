"""The checkpoint's chat template: GLM-5's shipped one renders what model/chat.py renders (through the server's own
jinja2 path, no transformers), so a checkpoint carrying it is served with model/chat.py; one whose template
differs is served with that template; one whose template cannot be rendered is refused at startup by name."""

from __future__ import annotations

import itertools
import shutil

import httpx
import pytest

from model.chat import render
from model.tokenizer import CHAT_TEMPLATE, Tokenizer, save_tokenizer_files
from serve.http.app import create_app
from serve.http.server import run_embedded
from serve.http.settings import ServerSettings
from serve.http.template import JinjaTemplate, TemplateUnusable, load_renderer
from tests.model.chat_corpus import CORPUS, NAMES
from tests.serve.scripted_engine import ScriptedEngine
from tests.serve.server_thread import ServerThread

SHIPPED = CHAT_TEMPLATE.read_text(encoding="utf-8")
FLAGS = list(itertools.product([True, False], repeat=3))  # add_generation_prompt, enable_thinking, clear_thinking


@pytest.mark.parametrize("name", NAMES)
def test_builtin_renderer_equals_the_shipped_template(name):
    _, messages, tools = CORPUS[NAMES.index(name)]
    tpl = JinjaTemplate(SHIPPED, str(CHAT_TEMPLATE))
    for gen, thinking, clear in FLAGS:
        assert tpl.render(messages, tools, gen, thinking, clear) == render(messages, tools, gen, thinking, clear)


def checkpoint_with(tmp_path, template: str | None):
    save_tokenizer_files(tmp_path)
    if template is None:
        (tmp_path / "chat_template.jinja").unlink()
    else:
        (tmp_path / "chat_template.jinja").write_text(template, encoding="utf-8")
    return tmp_path


CUSTOM = SHIPPED.replace("{{- '[gMASK]<sop>' -}}", "{{- '[gMASK]<sop><|system|>Always answer in French.' -}}")


def test_which_renderer_a_checkpoint_gets(tmp_path):
    assert load_renderer(checkpoint_with(tmp_path / "a", SHIPPED)) is None
    assert load_renderer(checkpoint_with(tmp_path / "b", None)) is None  # no template: GLM-5's
    tpl = load_renderer(checkpoint_with(tmp_path / "c", CUSTOM))
    assert tpl is not None and tpl.origin.endswith("chat_template.jinja")


@pytest.mark.parametrize(
    "template, words",
    [
        ("{% for m in messages %}{{ m.content }", "does not compile"),
        ("{{ raise_exception('tools are not supported') if tools else '' }}", "tools are not supported"),
        ("{{ messages[0].content.upper(1, 2) }}", "cannot render"),
    ],
)
def test_a_template_that_cannot_be_rendered_is_refused_by_name(tmp_path, template, words):
    ckpt = checkpoint_with(tmp_path / "ckpt", template)
    with pytest.raises(TemplateUnusable, match=words) as e:
        load_renderer(ckpt)
    assert "chat_template.jinja" in str(e.value)
    # `glm5 serve` refuses it before loading the weights (there are none here), saying what to do.
    with pytest.raises(SystemExit, match="remove it to serve with GLM-5's built-in chat format"):
        run_embedded(ckpt, "127.0.0.1", 0, None, None, None, False, None, 8, None)


def test_a_checkpoint_with_its_own_template_is_served_with_it(tmp_path):
    tok = Tokenizer.shipped()
    engine = ScriptedEngine(tok, "D'accord.", max_model_len=512)
    tpl = load_renderer(checkpoint_with(tmp_path / "ckpt", CUSTOM))
    with ServerThread(create_app(engine, tok, ServerSettings("m", chat_template=tpl))) as s:
        s.wait_healthy()
        messages = [{"role": "user", "content": "Hello"}]
        off = {"chat_template_kwargs": {"enable_thinking": False}}
        r = httpx.post(s.url + "/v1/chat/completions", json={"model": "m", "messages": messages, **off})
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "D'accord."
        prompt = tok.decode(engine.seen[-1][0])
        expected = render(messages, enable_thinking=False)
        assert prompt == expected.replace("<sop>", "<sop><|system|>Always answer in French.", 1)
        counted = httpx.post(s.url + "/v1/tokenize", json={"messages": messages}).json()
        assert tok.decode(counted["tokens"]).startswith("[gMASK]<sop><|system|>Always answer in French.<|user|>")
        # what the template refuses is a 400 naming it
        bad = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]
        r = httpx.post(s.url + "/v1/chat/completions", json={"model": "m", "messages": bad})
        assert r.status_code == 400 and "content parts" in r.json()["error"]["message"]


def test_tokenizer_config_chat_template_is_read_too(tmp_path):
    import json

    ckpt = checkpoint_with(tmp_path / "ckpt", None)
    cfg = json.loads((ckpt / "tokenizer_config.json").read_text())
    cfg["chat_template"] = CUSTOM
    (ckpt / "tokenizer_config.json").write_text(json.dumps(cfg))
    tpl = load_renderer(ckpt)
    assert tpl is not None and "tokenizer_config.json" in tpl.origin
    shutil.rmtree(ckpt)
