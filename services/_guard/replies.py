"""The polite words the fleet says when it, not the model, ends a turn: POLITE, unless the agent words them its own way.

A turn that ends early after it changed something says so instead (`acted`): the apology would be false there.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from roundtrip._kernel.wire.events import Outcome
from roundtrip._sdk.texts import ACTED_DEFAULT

POLITE = {
    Outcome.STEP_LIMIT: (
        "I'm sorry, I wasn't able to finish this request within the steps I'm allowed. "
        "I've stopped here so nothing is done twice; a member of our team can pick it up if you reply."
    ),
    Outcome.REPEATED_CALL: (
        "I'm sorry, I keep running into the same problem with this request, so I've stopped rather than keep trying. "
        "A member of our support team can look into it if you reply here."
    ),
    Outcome.CYCLE: (
        "I'm sorry, I was going round in circles on this request, so I've stopped. "
        "A member of our support team can look into it if you reply here."
    ),
    Outcome.FAILURE_STREAK: (
        "I'm sorry, several of the steps needed for this request failed, so I've stopped. "
        "A member of our support team can look into it if you reply here."
    ),
    Outcome.BUDGET: (
        "I'm sorry, this request needed more work than I'm allowed to spend on one question, so I've stopped here. "
        "A member of our support team can pick it up if you reply."
    ),
    Outcome.DEADLINE: (
        "I'm sorry, this is taking much longer than it should: one of our systems is not responding. "
        "I've stopped working on your request; please try again in a few minutes."
    ),
    Outcome.CANCELLED: "I'm sorry, our support team has stopped this request. Please reply if you still need help.",
    Outcome.MODEL_ERROR: (
        "I'm sorry, our assistant is temporarily unavailable and I couldn't complete your request. "
        "Nothing was changed after the error. Please try again in a few minutes."
    ),
    Outcome.MODEL_BUSY: (
        "I'm sorry, our assistant is very busy right now and couldn't get to your request in time. "
        "Please try again in a few minutes."
    ),
    Outcome.MAX_TOKENS: "I'm sorry, my answer was cut off before I could finish. Could you ask again, perhaps more "
    "specifically?",
    Outcome.REFUSAL: "I'm sorry, but I can't help with that request.",
    Outcome.CONTEXT_WINDOW_EXCEEDED: (
        "I'm sorry, this conversation has grown too long for me to continue. Please start a new one and I'll be glad "
        "to help."
    ),
    Outcome.STOP_SEQUENCE: "I'm sorry, I couldn't finish my answer.",
    Outcome.UNKNOWN_STOP_REASON: "I'm sorry, something unexpected happened and I couldn't finish your request.",
    Outcome.APPROVAL_TIMEOUT: (
        "I'm sorry, part of your request needs a review by a member of our team, and it could not be reviewed in time. "
        "Nothing was changed on your account. Please reply here and we'll pick it up."
    ),
    Outcome.END_TURN: "Is there anything else I can help you with?",
    Outcome.CONVERSATION_REFUSED: (
        "I'm sorry, I can't continue this conversation: it belongs to another account. "
        "Please start a new conversation and I'll be glad to help."
    ),
}

# why a turn stopped, said when it had already changed something
STOPPED = {
    Outcome.MAX_TOKENS: "my answer was cut off",
    Outcome.STOP_SEQUENCE: "my answer was cut off",
    Outcome.REFUSAL: "I can't help with the rest of it",
    Outcome.CONTEXT_WINDOW_EXCEEDED: "this conversation has grown too long for me to continue",
    Outcome.UNKNOWN_STOP_REASON: "something unexpected happened",
    Outcome.STEP_LIMIT: "it needed more steps than I'm allowed",
    Outcome.REPEATED_CALL: "I kept running into the same problem",
    Outcome.CYCLE: "I was going round in circles",
    Outcome.FAILURE_STREAK: "several of the steps it needed failed",
    Outcome.BUDGET: "it needed more work than I'm allowed to spend on one question",
    Outcome.DEADLINE: "one of our systems is not responding",
    Outcome.CANCELLED: "our support team stopped it",
    Outcome.MODEL_ERROR: "our assistant became temporarily unavailable",
    Outcome.MODEL_BUSY: "our assistant became too busy to finish it in time",
    Outcome.APPROVAL_TIMEOUT: "a step that needs a review by our team could not be reviewed in time",
}


ACTED = (
    "I'm sorry, I had to stop before finishing your request: {why}. What I did before stopping: {done}. "
    "Nothing else was changed. Please reply here if anything more is needed, rather than asking for all of it again."
)


@dataclass(frozen=True)
class Replies:
    own: Mapping[Outcome, str] = field(default_factory=dict, hash=False)
    own_acted: Mapping[str, str] = field(default_factory=dict, hash=False)  # outcome value or "default" -> template

    @classmethod
    def of(cls, texts: Mapping[str, str], acted: Mapping[str, str] | None = None) -> Replies:
        """From the agent's `replies` and `acted_replies` (outcome or "default" -> text with `{done}`)."""
        return cls({Outcome(outcome): text for outcome, text in texts.items()}, dict(acted or {}))

    def polite(self, outcome: Outcome) -> str:
        return self.own.get(outcome) or POLITE[outcome]

    def acted(self, outcome: Outcome, done: Sequence[str]) -> str:
        """The end of a turn that had already changed something: why it stopped, what was done, nothing more was."""
        said = "; ".join(done)
        own = self.own_acted.get(outcome.value) or self.own_acted.get(ACTED_DEFAULT)
        if own:
            return own.format(done=said)
        return ACTED.format(why=STOPPED.get(outcome, "something went wrong"), done=said)
