"""Request bodies of the OpenAI-compatible routes and of /generate, validated as strictly as OpenAI does.

Bodies are parsed from raw bytes (`parse_body`) in pydantic's strict JSON mode: a string where a number belongs is
an error, not a conversion, and bad JSON is an error too; both become a 400 naming the field. Unknown fields are
accepted and ignored, as sglang and vLLM do (the official client sends fields a local server has no use for).
Checks that need the tokenizer or the context length (prompt too long, max_tokens past the context) are made by
the route handlers, which know both.
"""

from __future__ import annotations

import re
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from serve.http.errors import bad_request

FUNCTION_NAME = re.compile(r"^[a-zA-Z0-9_.-]{1,64}$")
JSON_SCHEMA_TYPES = {"object", "array", "string", "number", "integer", "boolean", "null"}


class _Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")


class StreamOptions(_Body):
    include_usage: bool = False


class FunctionDefinition(_Body):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Body):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(_Body):
    name: str


class NamedToolChoice(_Body):
    type: Literal["function"] = "function"
    function: NamedFunction


class _Sampling(_Body):
    """Sampling fields shared by chat and completions (OpenAI's, plus sglang / vLLM extensions)."""

    n: int = Field(1, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    repetition_penalty: float | None = Field(None, gt=0.0)
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(None, ge=1)

    @property
    def stop_strings(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return [s for s in stops if s]

    @model_validator(mode="after")
    def _check_stream_options(self):
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed with stream: true")
        if isinstance(self.stop, list) and len(self.stop) > 16:
            raise ValueError("stop: at most 16 stop sequences")
        return self


class ChatTemplateKwargs(_Body):
    enable_thinking: bool | None = None
    clear_thinking: bool | None = None


class ChatCompletionRequest(_Sampling):
    model: str
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0)
    chat_template_kwargs: ChatTemplateKwargs | None = None
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "max"] | None = None
    separate_reasoning: bool = True
    response_format: dict[str, Any] | None = None
    # vLLM (>= 0.10.2) and sglang: the sampled ids per choice and the prompt's ids, for training on what was sampled.
    return_token_ids: bool = False

    @model_validator(mode="after")
    def _check_chat(self):
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        if self.response_format is not None:
            kind = self.response_format.get("type", "text")
            if kind not in ("text", "json_object", "json_schema"):
                raise ValueError(f"response_format.type must be 'text', 'json_object' or 'json_schema', not {kind!r}")
        if isinstance(self.tool_choice, NamedToolChoice) and not self.tools:
            raise ValueError("tool_choice names a function but no tools were given")
        if self.tool_choice == "required" and not self.tools:
            raise ValueError("tool_choice 'required' needs tools")
        if self.tools:
            names = [check_tool(i, t) for i, t in enumerate(self.tools)]
            if len(set(names)) != len(names):
                raise ValueError("tools: function names must be unique")
            if isinstance(self.tool_choice, NamedToolChoice) and self.tool_choice.function.name not in names:
                raise ValueError(f"tool_choice names {self.tool_choice.function.name!r}, which is not among the tools")
        return self

    @property
    def completion_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


def check_tool(i: int, tool: Tool) -> str:
    """A tool's name, after checking the schema is usable: a valid name and an object-typed JSON schema."""
    f = tool.function
    if not FUNCTION_NAME.match(f.name):
        raise ValueError(f"tools[{i}].function.name {f.name!r} must be 1-64 letters, digits, '_', '-' or '.'")
    params = f.parameters
    if params is None:
        return f.name
    kind = params.get("type", "object")
    if kind != "object":
        raise ValueError(f"tools[{i}].function.parameters must be a JSON schema of type 'object', not {kind!r}")
    props = params.get("properties", {})
    if not isinstance(props, dict):
        raise ValueError(f"tools[{i}].function.parameters.properties must be an object")
    for key, schema in props.items():
        if not isinstance(schema, dict):
            raise ValueError(f"tools[{i}].function.parameters.properties.{key} must be a JSON schema object")
        t = schema.get("type")
        types = t if isinstance(t, list) else [t] if t is not None else []
        bad = [x for x in types if not isinstance(x, str) or x not in JSON_SCHEMA_TYPES]  # a dict is unhashable
        if bad:
            raise ValueError(f"tools[{i}].function.parameters.properties.{key}.type {bad[0]!r} is not a JSON type")
    required = params.get("required", [])
    if not isinstance(required, list) or any(not isinstance(r, str) for r in required):
        raise ValueError(f"tools[{i}].function.parameters.required must be a list of names")
    return f.name


class TokenizeRequest(_Body):
    model: str | None = None
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    add_generation_prompt: bool = True

    @model_validator(mode="after")
    def _one_input(self):
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("send exactly one of prompt or messages")
        return self


class DetokenizeRequest(_Body):
    model: str | None = None
    tokens: list[int]


class CompletionRequest(_Sampling):
    model: str
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(16, ge=1)  # OpenAI's default for this route
    logprobs: int | None = Field(None, ge=0)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None

    @model_validator(mode="after")
    def _check_completion(self):
        if self.suffix:
            raise ValueError("suffix is not supported")
        if self.best_of is not None and self.best_of != self.n:
            raise ValueError("best_of other than n is not supported")
        if isinstance(self.prompt, list) and not self.prompt:
            raise ValueError("prompt must not be empty")
        return self

    def prompts(self) -> list[str | list[int]]:
        """The batch: a string, a list of ids, or a list of either."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if all(isinstance(x, int) for x in p):
            return [list(p)]  # type: ignore[arg-type]
        return list(p)  # type: ignore[arg-type]


# sglang's SamplingParams fields (sglang/api/v1/api_types.py, 0.5.23: "unknown keys rejected"); glm5 serve takes the
# ones GenerateSamplingParams declares and names the others, so a body that sglang refuses is refused here too.
SGLANG_SAMPLING_FIELDS = frozenset(
    "max_new_tokens stop stop_token_ids stop_regex temperature top_p top_k min_p frequency_penalty presence_penalty "
    "repetition_penalty min_new_tokens n json_schema regex ebnf structural_tag ignore_eos skip_special_tokens "
    "spaces_between_special_tokens no_stop_trim stream_interval logit_bias sampling_seed custom_params beam_width "
    "watermark choice".split()
)


class GenerateSamplingParams(_Body):
    """/generate's `sampling_params`: sglang's names, and as strict as sglang about keys it does not know."""

    model_config = ConfigDict(strict=True, extra="forbid")

    max_new_tokens: int = Field(128, ge=1)
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=-1)
    min_p: float = Field(0.0, ge=0.0, le=1.0)
    repetition_penalty: float = Field(1.0, gt=0.0)
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    sampling_seed: int | None = None
    # sglang's constrained decoding: at most one of a JSON schema (as a JSON string), a regex, an EBNF grammar.
    json_schema: str | None = None
    regex: str | None = None
    ebnf: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _sglang_keys(cls, data):
        if isinstance(data, dict):
            for key in data:
                if key in cls.model_fields:
                    continue
                if key == "seed":
                    raise ValueError("unknown field 'seed': sglang's name for it is sampling_seed")
                if key in SGLANG_SAMPLING_FIELDS:
                    raise ValueError(f"sglang's field {key!r} is not supported by glm5 serve")
                raise ValueError(f"unknown field {key!r} (sglang's SamplingParams has no such field)")
        return data

    @model_validator(mode="after")
    def _one_constraint(self):
        given = [k for k in ("json_schema", "regex", "ebnf") if getattr(self, k) is not None]
        if len(given) > 1:
            raise ValueError(f"give at most one of json_schema, regex and ebnf (got {', '.join(given)})")
        return self


class GenerateRequest(_Body):
    """/generate (sglang's native route, token ids only): what an RL trainer sends. Other top-level keys are
    ignored, as sglang ignores them."""

    input_ids: list[int] = Field(min_length=1)
    sampling_params: GenerateSamplingParams = Field(default_factory=GenerateSamplingParams)
    return_logprob: bool = False
    top_logprobs_num: int = Field(0, ge=0)
    stream: bool = False
    rid: str | None = None
    lora_path: str | None = None  # the name of a loaded adapter (/load_lora_adapter's lora_name)
    session_id: str | None = None


M = TypeVar("M", bound=BaseModel)


def parse_body(model: type[M], raw: bytes) -> M:
    """Validate `raw` as `model`; any problem is a 400 whose message and `param` name the field."""
    if not raw.strip():
        raise bad_request("the request body is empty; send a JSON object")
    try:
        return model.model_validate_json(raw)
    except ValidationError as e:
        errors = e.errors()
        err = errors[0]
        if err["type"] == "json_invalid":
            raise bad_request(f"the request body is not valid JSON: {err['msg']}", code="invalid_json") from None
        loc = ".".join(str(p) for p in err.get("loc", ()) if not _is_type_tag(p))
        msg = err["msg"]
        if any(_is_type_tag(p) for p in err.get("loc", ())) and len(errors) > 1:
            # A union field (e.g. `prompt`, `stop`, `tool_choice`): one error per member; say what was sent.
            loc = str(err["loc"][0]) if err.get("loc") else loc
            msg = f"has the wrong type or value (got {_json_kind(err.get('input'))})"
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        if err["type"] == "model_type":
            raise bad_request("the request body must be a JSON object", code="invalid_json") from None
        text = f"{loc}: {msg}" if loc else msg
        if err["type"] == "missing":
            text = f"{loc}: this field is required"
        raise bad_request(text, param=loc or None) from None


def _is_type_tag(part) -> bool:
    """pydantic names union members in error locations (`str`, `list[int]`, `function-after[...]`)."""
    return isinstance(part, str) and (part in {"str", "int", "float", "bool", "dict"} or "[" in part)


def _json_kind(value) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return "null" if value is None else type(value).__name__
