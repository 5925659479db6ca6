"""What every write of the dashboard does first and last (see :mod:`.actions`): the
read-only and anti-forgery checks and the bounded read of its form, the page that asks for
a confirmation, and where the browser goes once done. The pages that write (queues,
channels, schedules, groups, bulk repairs) share them."""

from __future__ import annotations

from urllib.parse import parse_qsl, quote

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import Response

from .auth import check_csrf
from .context import Dashboard
from .views import Problem


async def form_of(request: Request, dash: Dashboard) -> FormData:
    """The form of a write, once the dashboard may write and the form is its own."""
    if dash.read_only:
        raise Problem(403, "this dashboard is read-only (started with --read-only): it "
                           "changes nothing")
    form = await _read_form(request)
    refused = check_csrf(form, dash.csrf)
    if refused is not None:
        raise Problem(403, refused)
    return form


#: A write's form is a few short fields.
MAX_FORM = 64 * 1024


async def _read_form(request: Request) -> FormData:
    """The URL-encoded form the dashboard's pages send (parsed here: no multipart parser
    needed, and nothing larger than a form is read)."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/x-www-form-urlencoded":
        raise Problem(415, "a write is a form POST (application/x-www-form-urlencoded), as "
                           "the dashboard's pages send")
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM:
            raise Problem(413, f"the form is over {MAX_FORM // 1024} KiB")
    try:
        return FormData(parse_qsl(body.decode(), keep_blank_values=True))
    except (UnicodeDecodeError, ValueError):
        raise Problem(400, "the form is not valid URL-encoded UTF-8") from None


def next_page(request: Request, form: FormData, default: str) -> str:
    """Where to go once done: the page the form was on (a path of this site only, so a
    forged form cannot send the browser elsewhere), else ``default``."""
    base = request.scope.get("root_path", "")
    to = form.get("next")
    if isinstance(to, str) and to.startswith(f"{base}/") and not to.startswith("//") \
            and "\\" not in to and "\n" not in to and "\r" not in to:
        return to
    return base + default


def confirmation(request: Request, dash: Dashboard, form: FormData, question: str,
                  button: str, *, danger: bool = True) -> Response | None:
    """None if ``form`` was confirmed; else the page that asks."""
    if form.get("confirmed") == "1":
        return None
    fields = [(k, v) for k, v in form.multi_items()
              if k not in ("csrf", "confirmed") and isinstance(v, str)]
    return dash.render(request, "confirm.html", title="Confirm", nav="", question=question,
                       button=button, danger=danger, action=request.url.path, fields=fields,
                       back=next_page(request, form, "/"))


def quoted(name: str) -> str:
    return quote(name, safe="")


__all__ = ["MAX_FORM", "confirmation", "form_of", "next_page", "quoted"]
