"""The simulator's scripted mode over real HTTP with the real SDK: a script file or a PUT gives the responses of a
turn, each turn of a conversation starts its script again, a bad script is refused with its reason, and the requests
it received can be read back (the system prompt a test checks)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import anthropic
import httpx
import pytest
from jsonschema import Draft202012Validator

from roundtrip._cli.evals.cases import CaseError, load_case
from roundtrip._simulator import running_simulator
from roundtrip._simulator.scripted import ScriptError, Scripts, load_scripts, parse_script

TOOLS = [
    {
        "name": "get_line",
        "description": "Look up one phone line of the customer.",
        "input_schema": {
            "type": "object",
            "properties": {"line_id": {"type": "string"}},
            "required": ["line_id"],
            "additionalProperties": False,
        },
    }
]
MODEL = "claude-sonnet-4-6"
SCRIPT = {
    "look": [
        [
            {"type": "text", "text": "Let me look."},
            {"type": "tool_use", "name": "get_line", "input": {"line_id": "ln_1"}},
        ],
        {"content": [{"type": "text", "text": "Your line is active."}], "stop_reason": "end_turn"},
    ]
}


def _client(url: str, script: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=url, api_key="test", max_retries=0, default_headers={"x-roundtrip-persona": f"script:{script}"}
    )


def test_a_script_file_plays_one_response_per_request_of_the_turn_and_each_turn_starts_it_again(tmp_path):
    path = tmp_path / "scripts.json"
    path.write_text(json.dumps(SCRIPT))
    with running_simulator(scripts=Scripts(load_scripts(path))) as url:
        sdk = _client(url, "look")
        messages = [{"role": "user", "content": "is my line ok?"}]
        first = sdk.messages.create(
            model=MODEL, max_tokens=500, system="You are Telco's agent.", tools=TOOLS, messages=messages
        )
        assert first.stop_reason == "tool_use" and first.content[0].text == "Let me look."
        (use,) = [b for b in first.content if b.type == "tool_use"]
        assert use.name == "get_line" and use.input == {"line_id": "ln_1"} and use.id.startswith("toolu_")
        messages += [
            {"role": "assistant", "content": [b.model_dump() for b in first.content]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "{}"}]},
        ]
        second = sdk.messages.create(
            model=MODEL, max_tokens=500, system="You are Telco's agent.", tools=TOOLS, messages=messages
        )
        assert second.stop_reason == "end_turn" and second.content[0].text == "Your line is active."
        messages += [
            {"role": "assistant", "content": [b.model_dump() for b in second.content]},
            {"role": "user", "content": "and again?"},
        ]  # a new turn of the conversation
        again = sdk.messages.create(
            model=MODEL, max_tokens=500, system="You are Telco's agent.", tools=TOOLS, messages=messages
        )
        assert again.stop_reason == "tool_use"
        messages += [
            {"role": "assistant", "content": [b.model_dump() for b in again.content]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": again.content[1].id, "content": "{}"}]},
            {"role": "assistant", "content": "Your line is active."},
        ]
        with pytest.raises(
            anthropic.BadRequestError, match="script 'look' has 2 responses; this request asks for response 3"
        ):
            sdk.messages.create(model=MODEL, max_tokens=500, tools=TOOLS, messages=messages)
        received = httpx.get(f"{url}/v1/_received", params={"persona": "script:look"}).json()["requests"]
        assert len(received) == 3 and received[0]["body"]["system"] == "You are Telco's agent."
        assert received[0]["body"]["tools"][0]["name"] == "get_line"
        later = httpx.get(f"{url}/v1/_received", params={"persona": "script:look", "after": received[0]["n"]})
        assert later.json()["requests"] == received[1:]  # numbered: a reader asks only for what came after
        bad = httpx.get(f"{url}/v1/_received", params={"after": "the start"})
        assert bad.status_code == 400 and "after" in bad.json()["error"]


def test_a_script_put_at_run_time_is_played_and_an_unknown_one_is_refused_by_name():
    with running_simulator() as url:
        put = httpx.put(f"{url}/v1/_scripts/hello", json=[[{"type": "text", "text": "Hello from a script."}]])
        assert put.status_code == 200 and put.json() == {"script": "hello", "responses": 1}
        reply = _client(url, "hello").messages.create(
            model=MODEL, max_tokens=100, messages=[{"role": "user", "content": "hi"}]
        )
        assert reply.stop_reason == "end_turn" and reply.content[0].text == "Hello from a script."
        with pytest.raises(anthropic.BadRequestError, match="no simulator script 'nope' \\(loaded: hello\\)"):
            _client(url, "nope").messages.create(
                model=MODEL, max_tokens=100, messages=[{"role": "user", "content": "hi"}]
            )
        bad = httpx.put(f"{url}/v1/_scripts/bad", json=[[{"type": "image"}]])
        assert bad.status_code == 400 and "script 'bad' response 1: a block is" in bad.json()["error"]
        personas = {r["persona"] for r in httpx.get(f"{url}/v1/_received").json()["requests"]}
        assert personas == {"script:hello"}  # a refused request is not kept as received


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("[]", "expected an object of script name -> list of responses"),
        ('{"a": []}', "script 'a': expected a non-empty list of responses"),
        ('{"a": [{"content": [{"type": "text", "text": "x"}], "stop_reason": "done"}]}', "unknown stop_reason 'done'"),
        ("{not json", "simulator script"),
    ],
)
def test_a_bad_script_file_is_refused_with_its_reason(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ScriptError, match=message):
        load_scripts(path)


def test_the_simulator_stops_with_one_line_on_a_bad_script_file(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{"a": []}')
    done = subprocess.run(
        [sys.executable, "-m", "roundtrip._simulator", "--script", str(path), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == ["error: script 'a': expected a non-empty list of responses"]


SCRIPT_SCHEMA = json.loads((Path(__file__).resolve().parents[2] / "schemas" / "script.json").read_text("utf-8"))


@pytest.mark.parametrize(
    "script",
    [
        ["Hello."],
        [[{"type": "tool_use", "name": "get_line", "input": {"line_id": "ln_1"}}], "Your line is active."],
        [{"content": [{"type": "text", "text": "x"}], "stop_reason": "end_turn"}],
        [[{"type": "tool_use", "name": "get_line"}]],
        [],
        "Hello.",
        [[]],
        [["Hello."]],
        [{"content": "Hello."}],
        [{"content": [{"type": "text", "text": "x"}], "stop_reason": "done"}],
        [[{"type": "tool_use", "name": "get_line", "input": "ln_1"}]],
        [[{"type": "image"}]],
    ],
)
def test_the_script_schema_and_the_one_parser_agree_on_what_a_script_is(script):
    """schemas/script.json documents what parse_script takes: a script one accepts, the other does too."""
    by_schema = Draft202012Validator(SCRIPT_SCHEMA).is_valid(script)
    try:
        parse_script("s", script)
        by_parser = True
    except ScriptError:
        by_parser = False
    assert by_schema == by_parser


def test_a_plain_string_is_a_text_response_in_a_put_and_the_loaded_scripts_are_listed():
    with running_simulator() as url:
        assert httpx.get(f"{url}/v1/_scripts").json() == {"scripts": []}
        put = httpx.put(f"{url}/v1/_scripts/hi", json=["Hello from a plain string."])
        assert put.status_code == 200 and put.json() == {"script": "hi", "responses": 1}
        reply = _client(url, "hi").messages.create(
            model=MODEL, max_tokens=100, messages=[{"role": "user", "content": "hi"}]
        )
        assert reply.stop_reason == "end_turn" and reply.content[0].text == "Hello from a plain string."
        assert httpx.get(f"{url}/v1/_scripts").json() == {"scripts": ["hi"]}


def test_a_wrong_script_is_refused_with_the_same_words_by_the_simulator_its_file_and_an_eval_case(tmp_path):
    bad = ["Hi.", [{"type": "tool_use", "name": "x", "input": "not an object"}]]
    reason = "response 2: a block is"
    with running_simulator() as url:
        put = httpx.put(f"{url}/v1/_scripts/bad", json=bad)
    assert put.status_code == 400
    by_put = put.json()["error"]
    (tmp_path / "scripts.json").write_text(json.dumps({"bad": bad}))
    with pytest.raises(ScriptError) as by_file:
        load_scripts(tmp_path / "scripts.json")
    (tmp_path / "case.json").write_text(json.dumps({"customer": "cus_1", "message": "hi", "script": bad}))
    with pytest.raises(CaseError) as by_case:
        load_case(tmp_path / "case.json")
    assert by_put == str(by_file.value) and by_put.startswith(f"script 'bad' {reason}")
    assert str(by_case.value).endswith(by_put.removeprefix("script 'bad' "))
