"""The guard's decision for one iteration: continue the loop, finish, or drop the turn.

Pure functions of the iteration event and the policy: the history of calls is read back from the transcript the event
carries, so the rules need no other state.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from roundtrip._guard.replies import Replies
from roundtrip._kernel.settings import LoopRules
from roundtrip._kernel.wire.events import ModelResponded, Outcome, ToolCall
from roundtrip._kernel.wire.fingerprints import fingerprint

FINISHING = {
    "end_turn": Outcome.END_TURN,
    "max_tokens": Outcome.MAX_TOKENS,
    "stop_sequence": Outcome.STOP_SEQUENCE,
    "refusal": Outcome.REFUSAL,
    "model_context_window_exceeded": Outcome.CONTEXT_WINDOW_EXCEEDED,
}
CONTINUING = {"tool_use", "pause_turn"}


@dataclass(frozen=True)
class Policy:
    max_steps: int = 10
    loop_rules: bool = True
    max_identical_calls: int = 3
    cycle_max_period: int = 4
    cycle_repeats: int = 2
    failure_streak: int = 4
    budget_usd: float = 0.50
    replies: Replies = field(compare=False, kw_only=True)


@dataclass(frozen=True)
class PastCall:
    step: int
    id: str
    name: str
    fingerprint: str
    failed: bool
    error: str


@dataclass(frozen=True)
class Continue:
    """Run the tool calls (tool_use) or call the model again (pause_turn)."""

    resume_model: bool = False
    blocked: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Finish:
    outcome: Outcome
    text: str
    detail: str = ""


def text_of(event: ModelResponded) -> str:
    return "\n".join(b.get("text", "") for b in event.content if b.get("type") == "text").strip()


def results_of(messages: list[dict[str, Any]]) -> dict[str, tuple[bool, str]]:
    """tool_use id -> (whether its tool_result is an error, the result's text)."""
    results: dict[str, tuple[bool, str]] = {}
    for message in messages:
        if message.get("role") == "user" and isinstance(message.get("content"), list):
            for block in message["content"]:
                if block.get("type") == "tool_result":
                    content = block.get("content")
                    if isinstance(content, list):
                        content = " ".join(b.get("text", "") for b in content if isinstance(b, dict))
                    results[block.get("tool_use_id", "")] = (bool(block.get("is_error")), str(content or ""))
    return results


def history(messages: list[dict[str, Any]]) -> list[PastCall]:
    """Every earlier tool call of the turn, with its step and whether its result was an error."""
    results = results_of(messages)
    calls, step = [], 0
    for message in messages:
        if message.get("role") != "assistant":
            continue
        step += 1
        for block in message.get("content") or []:
            if isinstance(block, dict) and block.get("type") == "tool_use":
                failed, text = results.get(block["id"], (False, ""))
                calls.append(
                    PastCall(
                        step, block["id"], block["name"], fingerprint(block["name"], block.get("input")), failed, text
                    )
                )
    return calls


def _signature(calls: Iterable[PastCall | ToolCall]) -> tuple[str, ...]:
    return tuple(sorted(c.fingerprint for c in calls))


def _cycle(past: list[PastCall], current: list[ToolCall], policy: Policy) -> int | None:
    """The period of a cycle of steps (A, B, A, B ...) ending now, if there is one."""
    by_step: dict[int, list[PastCall]] = {}
    for call in past:
        by_step.setdefault(call.step, []).append(call)
    sequence = [_signature(by_step[s]) for s in sorted(by_step)] + [_signature(current)]
    for period in range(2, policy.cycle_max_period + 1):
        span = period * policy.cycle_repeats
        if len(sequence) < span:
            break
        block = sequence[-period:]
        if len(set(block)) > 1 and sequence[-span:] == block * policy.cycle_repeats:
            return period
    return None


def _streak(past: list[PastCall]) -> list[PastCall]:
    streak: list[PastCall] = []
    for call in reversed(past):
        if not call.failed:
            break
        streak.append(call)
    return streak[::-1]


def loop_check(event: ModelResponded, policy: Policy) -> Finish | dict[str, str]:
    """Finish for a runaway turn; otherwise the calls to block (first repeats of failed calls)."""
    say = policy.replies.polite
    # this turn's calls, not the conversation's earlier turns
    past = history(event.messages[event.turn.history_messages :])
    period = _cycle(past, event.tool_calls, policy)
    if period:
        return Finish(
            Outcome.CYCLE, say(Outcome.CYCLE), f"the same {period} steps repeated {policy.cycle_repeats} times"
        )
    blocked: dict[str, str] = {}
    for call in event.tool_calls:
        earlier = [c for c in past if c.fingerprint == call.fingerprint]
        failed = [c for c in earlier if c.failed]
        if failed and len(earlier) >= 2:
            return Finish(
                Outcome.REPEATED_CALL,
                say(Outcome.REPEATED_CALL),
                f"{call.name} repeated after failing at step {failed[0].step}",
            )
        if len(earlier) + 1 > policy.max_identical_calls:
            return Finish(
                Outcome.REPEATED_CALL,
                say(Outcome.REPEATED_CALL),
                f"{call.name} called {len(earlier) + 1} times with the same input",
            )
        if failed:
            first = failed[0]
            blocked[call.id] = (
                f"Not run: this exact call ({call.name} with the same input) already failed at step {first.step} "
                f"with: {first.error[:300]} Repeating it will fail again. Change course: use different arguments, "
                f"another tool, or answer the customer with what you know."
            )
    streak = _streak(past)
    if len(streak) >= policy.failure_streak:
        names = ", ".join(c.name for c in streak[-policy.failure_streak :])
        return Finish(
            Outcome.FAILURE_STREAK, say(Outcome.FAILURE_STREAK), f"{len(streak)} failing calls in a row ({names})"
        )
    return blocked


def decide(
    event: ModelResponded, policy: Policy, cost_usd: float = 0.0, next_call_usd: float = 0.0
) -> Continue | Finish:
    say = policy.replies.polite
    if event.error:
        outcome = Outcome.MODEL_BUSY if event.busy else Outcome.MODEL_ERROR
        return Finish(outcome, say(outcome), event.error)
    reason = event.stop_reason
    if reason in FINISHING:
        outcome = FINISHING[reason]
        text = text_of(event)
        if outcome is Outcome.END_TURN:
            return Finish(outcome, text or say(outcome))
        # A truncated or refused answer keeps what the model said, then says why it stopped.
        return Finish(outcome, f"{text}\n\n{say(outcome)}".strip() if text else say(outcome))
    if reason not in CONTINUING:
        return Finish(
            Outcome.UNKNOWN_STOP_REASON, text_of(event) or say(Outcome.UNKNOWN_STOP_REASON), f"stop_reason {reason!r}"
        )
    if reason == "tool_use" and not event.tool_calls:
        return Finish(Outcome.END_TURN, text_of(event) or say(Outcome.END_TURN))
    if event.step >= policy.max_steps:
        return Finish(Outcome.STEP_LIMIT, say(Outcome.STEP_LIMIT), f"{event.step} model calls")
    if cost_usd + next_call_usd > policy.budget_usd:
        return Finish(
            Outcome.BUDGET,
            say(Outcome.BUDGET),
            f"${cost_usd:.4f} spent, next call ~${next_call_usd:.4f}, budget ${policy.budget_usd:.2f}",
        )
    if reason == "pause_turn":
        return Continue(resume_model=True)
    # calls whose input could not be carried (too large, too deep) are answered with their error, never run
    unfit = {c.id: f"Not run: {c.error}. Send a smaller, flatter input." for c in event.tool_calls if c.error}
    if policy.loop_rules:
        checked = loop_check(event, policy)
        if isinstance(checked, Finish):
            return checked
        return Continue(blocked={**checked, **unfit})
    return Continue(blocked=unfit)


def policy_from(settings: LoopRules, replies: Replies) -> Policy:
    return Policy(
        max_steps=settings.max_steps,
        loop_rules=settings.loop_rules,
        max_identical_calls=settings.max_identical_calls,
        cycle_max_period=settings.cycle_max_period,
        cycle_repeats=settings.cycle_repeats,
        failure_streak=settings.failure_streak,
        budget_usd=settings.turn_budget_usd,
        replies=replies,
    )
