"""direct: the customer's words are the call to make, `tool_name {JSON input}`; the persona makes exactly that call,
then says what came back (the result, or the error) and ends the turn. A tool the request does not offer it
declines to call, as a model would.

It plays any agent's tools, not only the shop's (an agent's own, or an MCP server's): what to call is written by
the caller, who can so send a valid call, an invalid one or one naming another customer's entity.
"""

from __future__ import annotations

import json

from ..transcript import Transcript
from ._common import Reply, act, answer, call


def decide(t: Transcript) -> Reply:
    if t.last is None:
        name, _, raw = t.request.strip().partition(" ")
        try:
            arguments = json.loads(raw or "{}")
        except ValueError:
            arguments = None
        if not name or not isinstance(arguments, dict):
            return answer('Please write the call as: tool_name {"argument": "value"}.')
        if name not in t.tools:  # like a real model, it calls only the tools it is offered
            return answer(f"I cannot do that: there is no tool {name}.")
        return act(call(name, arguments))
    result = t.last.results[0]
    return answer(f"{'That did not work' if result.is_error else 'Done'}: {result.text}")
