"""Results and request/reply: a subscriber keeps its handler's return value, and a caller
waits for a message to end.

::

    @broker.subscriber("thumbs", results=True)
    async def thumbnail(image: dict) -> dict:
        return {"url": make_thumbnail(image)}

    msg_id = await broker.publish("thumbs", {"path": "cat.png"})
    thumb = await broker.result(msg_id, timeout=10)      # {"url": ...}
    thumb = await broker.request("thumbs", {"path": "dog.png"}, timeout=10)

The return value is encoded as a body is (:func:`sqlmq.codec.encode_state`: bytes, text,
JSON, a pydantic model), bounded by ``max_payload_bytes`` (over it, or not encodable, the
run fails with :class:`~sqlmq.errors.UnstorableResult` and the retry strategy decides),
and written on the message's archive row by the transaction that archives it, after the
settle's fenced statements and for those they wrote only: a stale delivery's result is
never kept, and a crash keeps both or neither. So a result lives as long as its archive
row (``retention`` applies); a subscriber whose ``archive=`` deletes completed messages
cannot keep results, and is refused at registration.

A batch handler (``batch=``) returns one result per message, a list in the order it
received them; each message's item is kept as a single handler's value is, fenced per
message (see :func:`sqlmq.runtime.carried.carried_batch`).

A caller waits with :meth:`Results.result <sqlmq.results.requester.Results.result>` (or
``request``, which publishes and waits). It is woken as soon as the ending commits: by the
settle's NOTIFY on PostgreSQL, by this process's own settles everywhere, by SQLite's commit
counter, and by polling that backs off on MariaDB (:mod:`.watch`).

* :mod:`.keeping`: the runtime's side (encoding the value, which settlements announce
  their ending);
* :mod:`.answers`: an ending as a value or an error;
* :mod:`.watch`: the waiting callers of one broker and their reads;
* :mod:`.requester`: the broker's calls (``result``, ``request`` and their sync twins).
"""

from __future__ import annotations

from .keeping import AWAITED_HEADER

__all__ = ["AWAITED_HEADER"]
