"""Bodies to payloads and back, and what a handler receives for its annotation; a payload
that cannot be decoded for its handler fails alone and the worker carries on."""

from __future__ import annotations

from typing import Annotated, Any, Optional

import pydantic

from sqlmq import Broker, Message

from .conftest import drained, on_every_engine, rows, wait_until

pytestmark = on_every_engine

FAST = {"flush_interval": 0.01, "max_fetch_interval": 0.05, "workers": 1}


class Order(pydantic.BaseModel):
    id: int
    items: list[str]


async def run_until_drained(broker: Broker, queues: list[str]) -> None:
    await broker.start()
    try:
        for q in queues:
            await wait_until(lambda q=q: drained(broker, q), message=f"{q} drained")
    finally:
        await broker.stop()


async def test_bodies_round_trip_with_their_content_type(broker: Broker) -> None:
    bodies: dict[str, Any] = {
        "bytes": b"\x00\xff raw",
        "text": "héllo ✓ 😀",
        "object": {"a": [1, 2, {"b": None}], "é": 1.5},
        "list": [1, "x", True],
        "scalar": 42,
        "null": None,
        "model": Order(id=7, items=["a", "b"]),
    }
    received: dict[str, tuple[str | None, Any]] = {}

    @broker.subscriber("q", **FAST)
    async def handle(msg: Message) -> None:
        received[msg.headers["name"]] = (msg.content_type, msg.body)

    for name, body in bodies.items():
        await broker.publish("q", body, headers={"name": name})
    await run_until_drained(broker, ["q"])

    assert received == {
        "bytes": ("application/octet-stream", b"\x00\xff raw"),
        "text": ("text/plain; charset=utf-8", "héllo ✓ 😀"),
        "object": ("application/json", {"a": [1, 2, {"b": None}], "é": 1.5}),
        "list": ("application/json", [1, "x", True]),
        "scalar": ("application/json", 42),
        "null": ("application/json", None),
        "model": ("application/json", {"id": 7, "items": ["a", "b"]}),
    }


async def test_a_content_type_given_by_the_publisher_is_kept(broker: Broker) -> None:
    received: list[Any] = []

    @broker.subscriber("q", **FAST)
    async def handle(msg: Message) -> None:
        received.append((msg.content_type, msg.body))

    await broker.publish("q", b'{"x": 1}', headers={"content-type": "application/json"})
    await run_until_drained(broker, ["q"])

    assert received == [("application/json", {"x": 1})]


async def test_handler_receives_what_its_parameter_is_annotated_with(broker: Broker) -> None:
    received: dict[str, Any] = {}
    json_body = {"id": 7, "items": ["a"]}

    @broker.subscriber("bytes", **FAST)
    async def as_bytes(body: bytes) -> None:
        received["bytes"] = body

    @broker.subscriber("str", **FAST)
    async def as_str(body: str) -> None:
        received["str"] = body

    @broker.subscriber("dict", **FAST)
    async def as_dict(body: dict[str, Any]) -> None:
        received["dict"] = body

    @broker.subscriber("list", **FAST)
    async def as_list(body: list) -> None:  # type: ignore[type-arg]
        received["list"] = body

    @broker.subscriber("union", **FAST)
    async def as_union(body: dict | list) -> None:  # type: ignore[type-arg]
        received["union"] = body

    @broker.subscriber("model", **FAST)
    async def as_model(order: Order) -> None:
        received["model"] = order

    @broker.subscriber("message", **FAST)
    async def as_message(msg: Message) -> None:
        received["message"] = msg

    @broker.subscriber("plain", **FAST)
    async def unannotated(msg) -> None:  # type: ignore[no-untyped-def]
        received["plain"] = msg

    @broker.subscriber("sync", **FAST)
    def in_a_thread(body: dict, extra: int = 1) -> None:  # type: ignore[type-arg]
        received["sync"] = body

    queues = ["bytes", "str", "dict", "list", "union", "model", "message", "plain", "sync"]
    for q in queues:
        await broker.publish(q, [1, 2] if q == "list" else json_body)
    await run_until_drained(broker, queues)

    assert received["bytes"] == b'{"id":7,"items":["a"]}'  # the raw payload
    assert received["str"] == '{"id":7,"items":["a"]}'  # the payload as text
    assert received["dict"] == json_body
    assert received["list"] == [1, 2]
    assert received["union"] == json_body
    assert received["model"] == Order(id=7, items=["a"])
    for q in ("message", "plain"):
        assert isinstance(received[q], Message)
        assert received[q].queue == q
        assert received[q].body == json_body
        assert received[q].deliveries == 1
        assert received[q].created_at.tzinfo is not None
    assert received["sync"] == json_body


async def test_undecodable_payload_fails_with_decode_error_and_the_worker_carries_on(
    broker: Broker,
) -> None:
    handled: list[Any] = []

    @broker.subscriber("dicts", **FAST)
    async def as_dict(body: dict) -> None:  # type: ignore[type-arg]
        handled.append(body)

    @broker.subscriber("orders", **FAST)
    async def as_model(order: Order) -> None:
        handled.append(order)

    @broker.subscriber("texts", **FAST)
    async def as_str(body: str) -> None:
        handled.append(body)

    json_header = {"content-type": "application/json"}
    good = [await broker.publish("dicts", {"n": 1})]
    bad = {
        "invalid json": await broker.publish("dicts", b"{not json", headers=json_header),
        "wrong type": await broker.publish("dicts", [1, 2]),
        "model mismatch": await broker.publish("orders", {"id": "x", "items": []}),
        "invalid utf-8": await broker.publish("texts", b"\xff\xfe"),
    }
    good += [
        await broker.publish("dicts", {"n": 2}),
        await broker.publish("orders", {"id": 3, "items": []}),
        await broker.publish("texts", "fine"),
    ]
    await run_until_drained(broker, ["dicts", "orders", "texts"])

    assert sorted(map(str, handled)) == sorted(
        map(str, [{"n": 1}, {"n": 2}, Order(id=3, items=[]), "fine"])
    )
    archived = {r["id"]: r for r in await rows(broker, "archive")}
    assert all(archived[i]["state"] == "COMPLETED" for i in good)
    for case, msg_id in bad.items():
        row = archived[msg_id]
        assert row["state"] == "FAILED", case
        assert row["error"].startswith("decode error: "), case
        assert row["attempts_count"] == 0, case  # the handler never ran
        assert row["deliveries_count"] == 1, case  # and it was not retried
    assert "not valid application/json" in archived[bad["invalid json"]]["error"]
    assert "body is list, handler" in archived[bad["wrong type"]]["error"]
    assert "does not match Order" in archived[bad["model mismatch"]]["error"]
    assert "not valid text/plain" in archived[bad["invalid utf-8"]]["error"]


_FAILS = object()  # the message is archived FAILED with a decode error naming the types

# (annotation, JSON body, what the handler receives). pydantic's TypeAdapter in its default,
# lax mode, like a bare model class: 1 is a float; true passes for int, unless strict.
ANNOTATION_TABLE: list[tuple[Any, Any, Any]] = [
    (Order | None, {"id": 7, "items": ["a"]}, Order(id=7, items=["a"])),
    (Order | None, None, None),
    (Optional[Order], {"id": 8, "items": []}, Order(id=8, items=[])),  # noqa: UP045
    (list[Order], [{"id": 1, "items": []}, {"id": 2, "items": ["b"]}],
     [Order(id=1, items=[]), Order(id=2, items=["b"])]),
    (list[Order], [{"id": "x"}], _FAILS),
    (Message | None, {"n": 1}, Message),
    (Optional[Message], {"n": 2}, Message),  # noqa: UP045
    (float, 1, 1.0),
    (float, 2.5, 2.5),
    (int, True, 1),
    (Annotated[int, pydantic.Strict()], True, _FAILS),
    (int, 1.5, _FAILS),
    (bool, True, True),
    (dict[str, int], {"a": 1}, {"a": 1}),
    (dict[str, int], {"a": "x"}, _FAILS),
    (str | None, "text", "text"),
    (set[int], [1, 2, 2], {1, 2}),
]


async def test_handler_annotations_are_validated_like_pydantic_does(broker: Broker) -> None:
    received: dict[str, Any] = {}

    def subscribe(queue: str, annotation: Any) -> None:
        async def handle(value):  # type: ignore[no-untyped-def]
            received[queue] = value

        handle.__annotations__ = {"value": annotation, "return": None}
        broker.subscriber(queue, **FAST)(handle)

    ids: dict[str, int] = {}
    for i, (annotation, body, _) in enumerate(ANNOTATION_TABLE):
        queue = f"a{i}"
        subscribe(queue, annotation)
        ids[queue] = await broker.publish(queue, body)
    await run_until_drained(broker, list(ids))

    archived = {r["id"]: r for r in await rows(broker, "archive")}
    for i, (annotation, body, expected) in enumerate(ANNOTATION_TABLE):
        queue, case = f"a{i}", f"{annotation} with {body!r}"
        row = archived[ids[queue]]
        if expected is _FAILS:
            assert row["state"] == "FAILED", case
            assert row["error"].startswith("decode error: body is "), case
            assert " expects " in row["error"], case
            assert queue not in received, case
            continue
        assert row["state"] == "COMPLETED", case
        if expected is Message:
            assert isinstance(received[queue], Message), case
            assert received[queue].body == body, case
        else:
            assert received[queue] == expected, case
            assert type(received[queue]) is type(expected), case
