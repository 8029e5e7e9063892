"""Request validation: the checks the real API makes that a fleet bug would trip.

Every failure is a 400 invalid_request_error whose message names the offending field by
path (`messages.2.content.0`), worded like the real API where we know its wording.
Unknown keys inside content blocks are tolerated (SDK `model_dump()` adds nulls such as
`citations: null`); unknown top-level parameters are not.
"""

from __future__ import annotations

import re
from typing import Any

from .errors import ApiError, invalid

# The parameters the SDK (anthropic 2.10) can send, as its own type definitions declare them. Spelled out here so
# the simulator starts without importing the SDK.
COUNT_TOKENS_PARAMS = frozenset(
    {
        "cache_control",
        "messages",
        "model",
        "output_config",
        "speed",
        "system",
        "thinking",
        "tool_choice",
        "tools",
        "user_profile_id",
        "workspace_id",
    }
)
CREATE_PARAMS = COUNT_TOKENS_PARAMS | {
    "container",
    "diagnostics",
    "inference_geo",
    "max_tokens",
    "metadata",
    "service_tier",
    "stop_sequences",
    "stream",
    "temperature",
    "top_k",
    "top_p",
}

TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,128}$")
TOOL_USE_ID = re.compile(r"^[a-zA-Z0-9_-]+$")
USER_BLOCKS = {"text", "image", "document", "search_result", "tool_result"}
ASSISTANT_BLOCKS = {"text", "tool_use", "thinking", "redacted_thinking"}
MAX_CACHE_BREAKPOINTS = 4


def validate_create(body: Any) -> None:
    """Validate a `POST /v1/messages` body; raise ApiError on the first problem."""
    _validate(body, count_tokens=False)


def validate_count_tokens(body: Any) -> None:
    """Validate a `POST /v1/messages/count_tokens` body."""
    _validate(body, count_tokens=True)


def _validate(body: Any, *, count_tokens: bool) -> None:
    if not isinstance(body, dict):
        raise invalid("Request body must be a JSON object")
    allowed = COUNT_TOKENS_PARAMS if count_tokens else CREATE_PARAMS
    for key in body:
        if key not in allowed:
            raise invalid(f"{key}: Extra inputs are not permitted")
    if "stream" in body and not isinstance(body["stream"], bool):
        raise invalid("stream: Input should be a valid boolean")
    _model(body)
    if not count_tokens:
        _max_tokens(body)
    _system(body.get("system"))
    _stop_sequences(body.get("stop_sequences"))
    tool_names = _tools(body.get("tools"))
    _tool_choice(body.get("tool_choice"), tool_names)
    _messages(body, has_tools=body.get("tools") is not None)
    _cache_breakpoints(body)


def _model(body: dict[str, Any]) -> None:
    if "model" not in body:
        raise invalid("model: Field required")
    model = body["model"]
    if not isinstance(model, str) or not model:
        raise invalid("model: Input should be a valid string")
    if not model.startswith("claude"):
        raise ApiError(404, f"model: {model}")


def _max_tokens(body: dict[str, Any]) -> None:
    if "max_tokens" not in body:
        raise invalid("max_tokens: Field required")
    value = body["max_tokens"]
    if not isinstance(value, int) or isinstance(value, bool):
        raise invalid("max_tokens: Input should be a valid integer")
    if value < 1:
        raise invalid("max_tokens: Input should be greater than or equal to 1")


def _system(system: Any) -> None:
    if system is None or isinstance(system, str):
        return
    if not isinstance(system, list):
        raise invalid("system: Input should be a valid string or a list of text blocks")
    for i, block in enumerate(system):
        if not isinstance(block, dict) or block.get("type") != "text":
            raise invalid(f"system.{i}.type: Input should be 'text'")
        if not isinstance(block.get("text"), str) or not block["text"]:
            raise invalid(f"system.{i}.text: text content blocks must be non-empty")


def _stop_sequences(value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, list) or not all(isinstance(s, str) and s for s in value):
        raise invalid("stop_sequences: Input should be a list of non-empty strings")


def _tools(tools: Any) -> set[str]:
    if tools is None:
        return set()
    if not isinstance(tools, list):
        raise invalid("tools: Input should be a valid list")
    names: set[str] = set()
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise invalid(f"tools.{i}: Input should be a valid dictionary")
        name = tool.get("name")
        if not isinstance(name, str) or not TOOL_NAME.match(name):
            raise invalid(f"tools.{i}.name: String should match pattern '^[a-zA-Z0-9_-]{{1,128}}$'")
        if name in names:
            raise invalid(f"tools: Tool names must be unique; '{name}' appears twice")
        names.add(name)
        if tool.get("type") not in (None, "custom"):
            continue  # a server tool (web search, ...): nothing more to check here
        schema = tool.get("input_schema")
        if schema is None:
            raise invalid(f"tools.{i}.custom.input_schema: Field required")
        if not isinstance(schema, dict) or schema.get("type") != "object":
            raise invalid(f"tools.{i}.custom.input_schema.type: Input should be 'object'")
        if "description" in tool and not isinstance(tool["description"], str):
            raise invalid(f"tools.{i}.custom.description: Input should be a valid string")
    return names


def _tool_choice(choice: Any, tool_names: set[str]) -> None:
    if choice is None:
        return
    if not isinstance(choice, dict) or choice.get("type") not in ("auto", "any", "tool", "none"):
        raise invalid("tool_choice.type: Input should be 'auto', 'any', 'tool' or 'none'")
    if "disable_parallel_tool_use" in choice:
        if choice["type"] == "none":
            raise invalid("tool_choice.none.disable_parallel_tool_use: Extra inputs are not permitted")
        if not isinstance(choice["disable_parallel_tool_use"], bool):
            raise invalid(f"tool_choice.{choice['type']}.disable_parallel_tool_use: Input should be a valid boolean")
    if choice["type"] == "tool":
        name = choice.get("name")
        if not isinstance(name, str):
            raise invalid("tool_choice.tool.name: Field required")
        if name not in tool_names:
            raise invalid(f"tool_choice.tool.name: tool '{name}' is not in the request's tools")
    if choice["type"] in ("any", "tool") and not tool_names:
        raise invalid(f"tool_choice: type '{choice['type']}' requires tools")


def _messages(body: dict[str, Any], *, has_tools: bool) -> None:
    if "messages" not in body:
        raise invalid("messages: Field required")
    messages = body["messages"]
    if not isinstance(messages, list):
        raise invalid("messages: Input should be a valid list")
    if not messages:
        raise invalid("messages: List should have at least 1 item after validation, not 0")
    seen_ids: set[str] = set()
    uses_tools = False
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise invalid(f"messages.{i}: Input should be a valid dictionary")
        role = message.get("role")
        if role not in ("user", "assistant"):
            raise invalid(f"messages.{i}.role: Input should be 'user' or 'assistant'")
        if i == 0 and role != "user":
            raise invalid('messages: first message must use the "user" role')
        if i > 0 and messages[i - 1].get("role") == role:
            raise invalid(
                f'messages: roles must alternate between "user" and "assistant", '
                f'but found multiple "{role}" roles in a row (messages.{i - 1} and messages.{i})'
            )
        content = message.get("content")
        final_assistant = role == "assistant" and i == len(messages) - 1
        if isinstance(content, str):
            if not content and not final_assistant:
                raise invalid(
                    f"messages.{i}: all messages must have non-empty content except for the optional final assistant "
                    "message"
                )
            continue
        if not isinstance(content, list):
            raise invalid(f"messages.{i}.content: Input should be a valid string or a list of content blocks")
        if not content and not final_assistant:
            raise invalid(
                f"messages.{i}: all messages must have non-empty content except for the optional final assistant "
                "message"
            )
        for j, block in enumerate(content):
            uses_tools |= _block(block, f"messages.{i}.content.{j}", role, seen_ids)
        if role == "user":
            _tool_results_first(content, i)
    if uses_tools and not has_tools:
        raise invalid("Requests which include `tool_use` or `tool_result` blocks must define tools.")
    _tool_pairing(messages)


def _block(block: Any, path: str, role: str, seen_ids: set[str]) -> bool:
    """Check one content block; return True when it is a tool_use or tool_result."""
    if not isinstance(block, dict):
        raise invalid(f"{path}: Input should be a valid dictionary")
    kind = block.get("type")
    allowed = USER_BLOCKS if role == "user" else ASSISTANT_BLOCKS
    if kind not in allowed:
        raise invalid(
            f"{path}.type: '{kind}' blocks are not allowed in {role} messages (expected one of {sorted(allowed)})"
        )
    if kind == "text":
        if not isinstance(block.get("text"), str) or not block["text"]:
            raise invalid(f"{path}.text: text content blocks must be non-empty")
    elif kind == "tool_use":
        tool_id = block.get("id")
        if not isinstance(tool_id, str) or not TOOL_USE_ID.match(tool_id):
            raise invalid(f"{path}.id: String should match pattern '^[a-zA-Z0-9_-]+$'")
        if tool_id in seen_ids:
            raise invalid(f"{path}: `tool_use` ids must be unique; '{tool_id}' appears twice")
        seen_ids.add(tool_id)
        if not isinstance(block.get("name"), str) or not block["name"]:
            raise invalid(f"{path}.name: Field required")
        if not isinstance(block.get("input"), dict):
            raise invalid(f"{path}.input: Input should be a valid dictionary")
        return True
    elif kind == "tool_result":
        if not isinstance(block.get("tool_use_id"), str):
            raise invalid(f"{path}.tool_use_id: Field required")
        content = block.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise invalid(f"{path}.content: Input should be a valid string or a list of content blocks")
        if isinstance(content, list):
            for k, inner in enumerate(content):
                if not isinstance(inner, dict) or inner.get("type") not in (
                    "text",
                    "image",
                    "document",
                    "search_result",
                ):
                    raise invalid(
                        f"{path}.content.{k}.type: Input should be 'text', 'image', 'document' or 'search_result'"
                    )
                if inner["type"] == "text" and (not isinstance(inner.get("text"), str) or not inner["text"]):
                    raise invalid(f"{path}.content.{k}.text: text content blocks must be non-empty")
        if "is_error" in block and block["is_error"] is not None and not isinstance(block["is_error"], bool):
            raise invalid(f"{path}.is_error: Input should be a valid boolean")
        return True
    return False


def _tool_results_first(content: list[Any], i: int) -> None:
    seen_other = False
    for j, block in enumerate(content):
        if block.get("type") == "tool_result":
            if seen_other:
                raise invalid(
                    f"messages.{i}.content.{j}: `tool_result` blocks must come first in a user message, "
                    "before any text or other content"
                )
        else:
            seen_other = True


def _tool_pairing(messages: list[Any]) -> None:
    """Each assistant tool_use is answered by a tool_result in the very next user message, and vice versa."""
    for i, message in enumerate(messages):
        if message["role"] != "user" or not isinstance(message["content"], list):
            continue
        previous = messages[i - 1] if i > 0 else None
        offered = _tool_use_ids(previous) if previous is not None else []
        answered: set[str] = set()
        for j, block in enumerate(message["content"]):
            if block.get("type") != "tool_result":
                continue
            tool_use_id = block["tool_use_id"]
            if tool_use_id not in offered:
                raise invalid(
                    f"messages.{i}.content.{j}: unexpected `tool_use_id` found in `tool_result` blocks: {tool_use_id}. "
                    "Each `tool_result` block must have a corresponding `tool_use` block in the previous message."
                )
            if tool_use_id in answered:
                raise invalid(
                    f"messages.{i}.content.{j}: `tool_result` for tool_use_id {tool_use_id} appears more than once; "
                    "each `tool_use` block takes exactly one `tool_result` block."
                )
            answered.add(tool_use_id)
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        offered = _tool_use_ids(message)
        if not offered:
            continue
        following = messages[i + 1] if i + 1 < len(messages) else None
        answered_ids = set()
        if following is not None and isinstance(following["content"], list):
            answered_ids = {b["tool_use_id"] for b in following["content"] if b.get("type") == "tool_result"}
        missing = [tool_id for tool_id in offered if tool_id not in answered_ids]
        if missing:
            raise invalid(
                f"messages.{i}: `tool_use` ids were found without `tool_result` blocks immediately after: "
                f"{', '.join(missing)}. Each `tool_use` block must have a corresponding `tool_result` block in the "
                "next message."
            )


def _tool_use_ids(message: dict[str, Any]) -> list[str]:
    if message.get("role") != "assistant" or not isinstance(message.get("content"), list):
        return []
    return [b["id"] for b in message["content"] if b.get("type") == "tool_use"]


def _cache_breakpoints(body: dict[str, Any]) -> None:
    found = 0
    for tool in body.get("tools") or []:
        found += bool(tool.get("cache_control"))
    if isinstance(body.get("system"), list):
        found += sum(bool(b.get("cache_control")) for b in body["system"])
    for message in body["messages"]:
        if isinstance(message["content"], list):
            found += sum(bool(b.get("cache_control")) for b in message["content"])
    if found > MAX_CACHE_BREAKPOINTS:
        raise invalid(f"A maximum of {MAX_CACHE_BREAKPOINTS} blocks with cache_control may be provided. Found {found}.")
