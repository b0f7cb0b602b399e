"""A cell's questions as MCP asks them: input()/getpass() prompts and code mode's approvals, in the server's words.

Over the call's back-channel (an elicitation request, protocol <= 2025-11-25) through ``asker`` and
``approver``; from 2026-07-28 on, embedded in an ``InputRequiredResult`` (``input_required``) or a task's
input requests (``question_request``). Apart from ``app.py`` so the wording and the forms sit in one place.

Every question goes out with its single-use id (``Question.id``) and comes back to ``Run.answer`` with it: the
direct elicitation answers the question object it asked; a retry's ``request_state`` names the run and the
question (``request_state``, sealed by the SDK); a task binds each input key to one question (tasks.py);
send_input takes the ``question_id`` its awaiting_input answer gave.

A getpass() is never a form (the specification forbids asking for secrets that way): where the client declares
URL-mode elicitation (``url_elicits``), it is a URL-mode elicitation to a one-time page (secret_page.py) whose
POST answers it; elsewhere the cell's getpass() raises (runs.NO_SECRET_CHANNEL).
"""

import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from mcp.server.mcpserver import Context
from mcp_types import ElicitRequest, ElicitRequestFormParams, ElicitRequestURLParams, InputRequiredResult
from pydantic import BaseModel, Field

from kernelexec.display import display
from kernelexec.session.runs import Question, Run
from kernelexec.store import QuestionRecord

logger = logging.getLogger(__name__)


class _Answer(BaseModel):
    answer: str = Field(description="Your answer, passed to the code as the value input() returns")


INPUT_KEY = "input"  # the one embedded elicitation of an InputRequiredResult (2026-07-28)
STATE_SEPARATOR = " "  # request_state: "<run id> <question id>" (neither id has a space)
MULTI_ROUND_TRIP = "2026-07-28"  # from this protocol on, no server-to-client requests: InputRequiredResult


def question_message(handle: str, prompt: str, password: bool) -> str:
    """The words around a cell's prompt, the server's, so that a cell's prompt cannot pass for the assistant's."""
    how = "getpass() — it asks for a password or secret" if password else "input()"
    message = (f"Code running in kernelexec session {handle} asks for input through {how}. This question comes "
               f"from the code, not from the assistant or kernelexec:\n\n{display(prompt.strip(), 500).strip() or '(no prompt)'}")
    if password:
        message += "\n\nYour answer goes to the code only; the notebook records it as ***."
    return message


def elicits(ctx: Context | None) -> bool:
    """The client declared (form) elicitation."""
    try:
        capabilities = ctx.client_capabilities if ctx is not None else None
    except Exception:  # noqa: BLE001 - outside a request
        return False
    elicitation = getattr(capabilities, "elicitation", None)
    return elicitation is not None and (getattr(elicitation, "form", None) is not None or getattr(elicitation, "url", None) is None)


def url_elicits(ctx: Context | None) -> bool:
    """The client declared URL-mode elicitation (``elicitation.url``): a getpass() can be asked on a page."""
    try:
        capabilities = ctx.client_capabilities if ctx is not None else None
    except Exception:  # noqa: BLE001 - outside a request
        return False
    elicitation = getattr(capabilities, "elicitation", None)
    return elicitation is not None and getattr(elicitation, "url", None) is not None


def page_message(handle: str, prompt: str) -> str:
    """A URL-mode elicitation's words: who asks, and that the secret is typed on the page, not in the chat."""
    return (f"Code running in kernelexec session {handle} asks for a password or secret through getpass(). This "
            f"question comes from the code, not from the assistant or kernelexec:\n\n"
            f"{display(prompt.strip(), 500).strip() or '(no prompt)'}\n\nOpen the page to type it there: it goes "
            "to the code only, never to the assistant, and the notebook records it as ***. The page works once.")


def multi_round_trip(ctx: Context | None) -> bool:
    """The request has no back-channel: questions go out in an InputRequiredResult (2026-07-28 and later)."""
    version = ctx.protocol_version if ctx is not None else None
    return version is not None and version >= MULTI_ROUND_TRIP


def asker(ctx: Context | None, handle: str) -> Callable[[Question], Awaitable[str | None]] | None:
    """input()/getpass() of a cell as an MCP elicitation to the human over the call's back-channel (a
    server-to-client request, protocol <= 2025-11-25); None when the client cannot be asked that way. The
    answer is to this one question (the elicitation's response to its request), which Run.asker answers by id."""
    if ctx is None or not elicits(ctx) or multi_round_trip(ctx):
        return None

    async def ask(question: Question) -> str | None:
        if question.password:  # never a secret in a form (SEP-1036): Run._ask_secret asks those on a page
            return None
        try:
            result = await ctx.elicit(question_message(handle, question.prompt, question.password), _Answer)
        except Exception:  # noqa: BLE001 - no back-channel (stateless HTTP), the client refused: not answered
            return None
        data = getattr(result, "data", None)
        return data.answer if result.action == "accept" and isinstance(data, _Answer) else None

    return ask


def page_asker(ctx: Context | None, handle: str) -> Callable[[Question], Awaitable[str | None]] | None:
    """A getpass() as a URL-mode elicitation to its page over the call's back-channel (protocol <= 2025-11-25);
    None when the client declared no URL mode or has no back-channel (2026-07-28: an InputRequiredResult)."""
    if ctx is None or not url_elicits(ctx) or multi_round_trip(ctx):
        return None

    async def ask(question: Question) -> str | None:
        return await on_page(ctx, handle, question)

    return ask


async def on_page(ctx: Context, handle: str, question: Question) -> str | None:
    """A getpass() as a URL-mode elicitation (protocol 2025-11-25) over the call's back-channel: accepted, the question
    waits for its page's POST (which answers it, and is told to the client as notifications/elicitation/complete);
    declined, cancelled or not deliverable: None (the cell gets EOFError)."""
    assert question.url is not None
    elicitation_id = "e-" + secrets.token_urlsafe(12)  # not the question's id: the client has no use for that
    try:
        result = await ctx.elicit_url(page_message(handle, question.prompt), question.url, elicitation_id)
    except Exception:  # noqa: BLE001 - no back-channel, the client refused: not answered
        return None
    if result.action != "accept":
        return None

    async def typed() -> None:
        await ctx.session.send_elicit_complete(elicitation_id, related_request_id=ctx.request_id)

    question.typed, question.sent = typed, True
    await question.answered.wait()
    return question.answer


TYPED_PATIENCE = 5.0  # seconds the notice that a page was submitted may take to go out


async def typed(question: Question) -> None:
    """Tell the client the page was submitted (notifications/elicitation/complete, 2025-11-25), if it can be told.
    Shielded (the secret is in: the notice must not be lost to a cancel), but within ``TYPED_PATIENCE``: the send
    waits on the call's stream, and a client that keeps it open without reading would otherwise hold the caller
    (the relay's poll loop for every run of the replica, or a drain) for ever."""
    if question.typed is not None:
        with anyio.CancelScope(shield=True), anyio.move_on_after(TYPED_PATIENCE):
            try:
                await question.typed()
            except Exception:  # noqa: BLE001 - the client may be gone: the secret is in already
                logger.debug("elicitation/complete not sent", exc_info=True)


class _Approval(BaseModel):
    approve: bool = Field(description="Yes: make this one tool call; no: the code gets mcp_tools.ToolRefused")


def approver(ctx: Context | None) -> Callable[[Question], Awaitable[bool | None]] | None:
    """Code mode's approval of one tool call (--tools-approve), asked of the human as an elicitation over the call's
    back-channel, in the broker's words; None when the client cannot be asked that way (the call is refused). The
    yes or no is for this question's call only (Run.approver turns it into the verdict for that call)."""
    if ctx is None or not elicits(ctx) or multi_round_trip(ctx):
        return None

    async def approve(question: Question) -> bool | None:
        try:
            result = await ctx.elicit(display(question.prompt, None), _Approval)
        except Exception:  # noqa: BLE001 - no back-channel, the client refused: nobody was asked
            return None
        data = getattr(result, "data", None)
        return result.action == "accept" and isinstance(data, _Approval) and data.approve

    return approve


def input_required(run: Run, question: Question) -> InputRequiredResult:
    """The 2026-07-28 form of the question: an InputRequiredResult the client answers by retrying the call with
    input_responses; request_state names the run and the question (sealed by the SDK: encrypted, bound to this
    call and caller — not to a question, hence the question's own single-use id in it)."""
    return InputRequiredResult(input_requests={INPUT_KEY: question_request(run, question)},
                               request_state=run.id + STATE_SEPARATOR + question.id)


def resumed(request_state: Any) -> tuple[str, str]:
    """The run id and the question id a retried call's (unsealed) request_state names."""
    run_id, _, question_id = str(request_state).partition(STATE_SEPARATOR)
    return run_id, question_id


def stored_request(handle: str, question: QuestionRecord) -> ElicitRequest:
    """A question another replica's run asks (its store record), as ``question_request`` would put it; never a
    getpass() (its page is the holder's)."""
    if question.approval:
        return ElicitRequest(params=ElicitRequestFormParams(message=display(question.prompt, None),
                                                            requested_schema=_Approval.model_json_schema()))
    return ElicitRequest(params=ElicitRequestFormParams(message=question_message(handle, question.prompt, question.password),
                                                        requested_schema=_Answer.model_json_schema()))


def question_request(run: Run, question: Question) -> ElicitRequest:
    """A cell's question as the elicitation/create request embedded in an InputRequiredResult or a task's
    inputRequests (tasks.py): one form field, ``answer``, and the server's words around the prompt; for code
    mode's approval, the broker's own words (broker.approval_message) and a yes/no."""
    if question.url is not None:  # a getpass(): its page (2026-07-28 has no elicitation id, nor elicitation/complete)
        return ElicitRequest(params=ElicitRequestURLParams(message=page_message(run.session.handle, question.prompt),
                                                           url=question.url))
    if question.approval:
        return ElicitRequest(params=ElicitRequestFormParams(message=display(question.prompt, None),
                                                            requested_schema=_Approval.model_json_schema()))
    return ElicitRequest(params=ElicitRequestFormParams(
        message=question_message(run.session.handle, question.prompt, question.password),
        requested_schema=_Answer.model_json_schema()))
