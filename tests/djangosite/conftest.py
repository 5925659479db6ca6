from __future__ import annotations

from collections.abc import Iterator

import pytest

from .harness import Site, set_up, site

# The test modules import the project's models: Django is set up before they are collected
set_up()


@pytest.fixture
def django_site(db_kind: str, prefix: str) -> Iterator[Site]:
    with site(db_kind, prefix) as s:
        yield s
