"""A Griffe extension for the API reference: sqlmq's docstrings use Sphinx roles
(:class:`~sqlmq.Published`, :mod:`sqlmq.channels`), which Markdown would print as they are.

A role naming a name of ``sqlmq.__all__`` becomes a link to its entry in the reference; any
other (a module, a private class, a method) becomes code, so the strict build has no link
that leads nowhere.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

import sqlmq

ROLE = re.compile(r":(?:class|func|meth|mod|attr|data|exc|obj):`(~?)([^`]+)`")
PUBLIC = set(sqlmq.__all__)


def _replace(match: re.Match[str]) -> str:
    short, target = match.group(1) == "~", match.group(2).strip()
    shown = target.rsplit(".", 1)[-1] if short else target
    name = target.removeprefix("sqlmq.")
    if target.startswith("sqlmq.") and name in PUBLIC:
        return f"[`{shown}`][{target}]"
    return f"`{shown}`"


class SphinxRoles(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = ROLE.sub(_replace, obj.docstring.value)
