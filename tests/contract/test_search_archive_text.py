"""``search_archive_text``: the archived messages whose header values or error have each
word at a word's beginning, newest first, from the database's text index, kept as rows
enter and leave the archive."""

from __future__ import annotations

from sqlmq.lifecycle import Outcome
from sqlmq.records import Settlement

from .conftest import Env, ids


async def archive(env: Env, outcome: Outcome, error: str | None,
                  headers: dict[str, str] | None = None) -> int:
    (published,) = await env.publish("q", b"m", headers=headers)
    (d,) = await env.engine.acquire(["q"], 1, 30)
    assert d.id == published
    assert await env.engine.settle([Settlement(d.id, 1, outcome, error=error)]) == {d.id}
    return published


async def test_each_word_begins_a_word_of_the_error_or_a_header_value(env: Env) -> None:
    gateway = await archive(env, Outcome.FAIL, "TimeoutError: payment gateway",
                            {"tenant": "acme-corp"})
    plain = await archive(env, Outcome.COMPLETE, None, {"content-type": "application/json"})
    other = await archive(env, Outcome.CANCEL, "ValueError: user_identifier")
    await env.publish("q", b"live", headers={"tenant": "acme-corp"})  # live: not searched
    search = env.engine.search_archive_text

    assert ids(await search(["gatew"], 10)) == [gateway]
    assert ids(await search(["payment", "timeouterror"], 10)) == [gateway]
    assert ids(await search(["acme", "corp"], 10)) == [gateway]
    assert ids(await search(["identifier"], 10)) == [other]
    assert await search(["application"], 10) == []  # content-type's value is not searched
    assert await search(["ateway"], 10) == []
    assert await search(["acme", "identifier"], 10) == []
    assert plain not in ids(await search(["json"], 10))


async def test_pages_go_newest_first_and_the_index_forgets_rows_that_leave(env: Env) -> None:
    found = [await archive(env, Outcome.FAIL, f"gateway down {i}") for i in range(3)]
    search = env.engine.search_archive_text
    assert ids(await search(["gateway"], 2)) == found[:0:-1]
    assert ids(await search(["gateway"], 2, before=found[1])) == [found[0]]
    assert await env.engine.requeue_archived(ids=[found[2]]) == 1  # live again
    assert await env.engine.purge_archived(ids=[found[0]]) == 1  # gone
    assert ids(await search(["gateway"], 10)) == [found[1]]
    assert await search(["gateway"], 10, before=found[1]) == []
