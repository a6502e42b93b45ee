"""How the control plane calls the desktop helper (``computer.run_helper``), over a scripted host link:
the seam beside the real thing in ``test_computer.py``, for the outcomes a live sandbox shows rarely —
a resident helper that dies holding a request."""

from __future__ import annotations

from typing import Any

import pytest

from paddock_controlplane.sandboxes.computer import helper_answer, run_helper
from paddock_core import errors


class ScriptedLink:
    """Answers each exec with the next scripted result, and records the programs it was asked to run."""

    def __init__(self, *results: dict[str, Any]) -> None:
        self.results = list(results)
        self.programs: list[str] = []

    async def exec(
        self, sandbox_id: str, cmd: str, args: list[str], env: dict[str, str], stdin: str | None
    ) -> dict[str, Any]:
        self.programs.append(cmd)
        return self.results.pop(0)


ANSWERED = {"exit_code": 0, "stdout": '{"data": {"ok": true}}\n', "stderr": ""}
LOST = {"exit_code": 52, "stdout": "", "stderr": "curl: (52) Empty reply from server\n"}
RESET = {"exit_code": 56, "stdout": "", "stderr": "curl: (56) Recv failure: Connection reset by peer\n"}
NOT_THERE = {"exit_code": 7, "stdout": "", "stderr": "curl: (7) Failed to connect\n"}


async def test_a_resident_answer_is_used_as_it_is() -> None:
    link = ScriptedLink(ANSWERED)
    assert await run_helper(link, "sb-1", "mouse_click", "{}") == ANSWERED
    assert link.programs == ["curl"]


@pytest.mark.parametrize("operation", ["mouse_click", "screenshot"])
async def test_no_resident_helper_means_the_python_way_for_any_operation(operation: str) -> None:
    link = ScriptedLink(NOT_THERE, ANSWERED)
    assert await run_helper(link, "sb-1", operation, "{}") == ANSWERED
    assert link.programs == ["curl", "python3"]


@pytest.mark.parametrize("lost", [LOST, RESET], ids=["empty-reply", "reset"])
async def test_a_lost_reply_to_a_read_is_asked_again(lost: dict[str, Any]) -> None:
    link = ScriptedLink(lost, ANSWERED)
    assert await run_helper(link, "sb-1", "screenshot", "{}") == ANSWERED
    assert link.programs == ["curl", "python3"]


@pytest.mark.parametrize("operation", ["mouse_click", "keyboard_type", "screen_create", "launch"])
async def test_a_lost_reply_to_an_action_is_not_repeated(operation: str) -> None:
    # The click may have happened: a second one would be a double click the agent never asked for.
    link = ScriptedLink(LOST)
    result = await run_helper(link, "sb-1", operation, "{}")
    assert link.programs == ["curl"]
    with pytest.raises(errors.ServerError, match=r"answer was lost .* may have taken effect"):
        helper_answer(result)
