"""The answer conventions: how a model ends its tool use.

* Replying **without any tool call** is the final answer: ToolEnv passes that turn to the
  inner env's ``step`` unchanged.
* ``submit_answer(answer)`` does the same explicitly, for models trained to always call a
  function: the inner env's ``step`` receives ``Action(text=answer)``, and its result (reward,
  termination) stands.
* ``finish(answer="")`` also hands ``answer`` to the inner env, and then ends the episode even
  if the inner env would go on (``info["tools"]["finished"] = True``).

Other calls in the same turn as an answer tool are not run (they are listed in
``info["tools"]["skipped_calls"]``): the answer ends the tool phase of the turn.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator

from relax_gym.types import TextPart

from .declaration import ToolResult, tool


def _number_to_text(value: Any) -> Any:
    """Models often send numeric answers as JSON numbers; the answer is text."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return value


AnswerText = Annotated[str, BeforeValidator(_number_to_text)]
ANSWER_TOOL_NAMES = ("submit_answer", "finish")


@tool
def submit_answer(answer: AnswerText) -> ToolResult:
    """Submit your final answer to the task; it is scored and no more tools can be used.

    Args:
        answer: The final answer, written as the task asks.
    """
    return ToolResult([TextPart("answer submitted")], final_answer=answer)


@tool
def finish(answer: AnswerText = "") -> ToolResult:
    """End the episode now, optionally giving a final answer.

    Args:
        answer: The final answer, written as the task asks (may be empty).
    """
    return ToolResult([TextPart("finished")], final_answer=answer, end_episode=True)
