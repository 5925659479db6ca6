"""FastStream's command line on an sqlmq app: ``faststream run`` (a real process: lifespan
hooks, publish and consume, a graceful stop on SIGTERM) on each database, and ``faststream
docs gen``, whose AsyncAPI document is checked for its structure and its payload schemas
(valid JSON Schemas, validating the app's real bodies, checked with ``jsonschema``).

No AsyncAPI 3.0 meta-schema ships in a Python package here, so the document itself is
checked by structure (version, servers, channels per queue, operations, messages and their
payloads), not against the official specification's schema."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from sqlmq import Broker

from ..conftest import drop_tables, rows, wait_until

FASTSTREAM = str(Path(sys.executable).with_name("faststream"))

APP = textwrap.dedent('''
    import os
    from pathlib import Path

    from faststream import FastStream
    from faststream.specification import AsyncAPI
    from pydantic import BaseModel

    from sqlmq import Retry
    from sqlmq.faststream import SqlmqBroker

    broker = SqlmqBroker(os.environ["APP_URL"], table_prefix=os.environ["APP_PREFIX"],
                         migrate=True, graceful_timeout=5)
    app = FastStream(broker, specification=AsyncAPI(title="Billing", version="1.2"))
    marks = Path(os.environ["APP_MARKS"])


    class Order(BaseModel):
        id: int
        total: float


    class Invoice(BaseModel):
        order: int
        due: float


    @app.on_startup
    async def starting() -> None:
        (marks / "starting").touch()


    @app.after_startup
    async def publish_orders() -> None:
        for i in range(3):
            await broker.publish(Order(id=i, total=i * 1.5), "orders")
        (marks / "started").touch()


    @app.on_shutdown
    async def stopping() -> None:
        (marks / "stopped").touch()


    @broker.subscriber("orders", workers=2, retry=Retry.constant(0.1, max_attempts=3),
                       description="Orders to bill")
    @broker.publisher("invoices", description="Invoices to send")
    async def bill(order: Order) -> Invoice:
        return Invoice(order=order.id, due=order.total * 2)


    @broker.subscriber("audit", publish_to="archived-audit")
    async def audit(entry: dict) -> dict:
        return entry
''')


def write_app(tmp_path: Path, db_url: str, prefix: str) -> dict[str, str]:
    (tmp_path / "billing.py").write_text(APP)
    return {**os.environ, "APP_URL": db_url, "APP_PREFIX": prefix,
            "APP_MARKS": str(tmp_path), "PYTHONPATH": str(tmp_path)}


async def test_faststream_run_publishes_consumes_and_stops_on_sigterm(
        db_url: str, prefix: str, tmp_path: Path) -> None:
    env = write_app(tmp_path, db_url, prefix)
    proc = subprocess.Popen([FASTSTREAM, "run", "billing:app", "--app-dir", str(tmp_path)],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    reader = Broker(db_url, table_prefix=prefix)
    try:
        async def billed() -> bool:
            if proc.poll() is not None:
                pytest.fail(f"faststream run ended early:\n{proc.stdout.read()}")  # type: ignore[union-attr]
            if not (tmp_path / "started").exists():
                return False
            return len(await rows(reader, "archive", queue="orders", state="COMPLETED")) == 3

        await wait_until(billed, timeout=60, message="the app to bill three orders")
        invoices = sorted(json.loads(r["payload"])["order"]
                          for r in await rows(reader, "message", queue="invoices"))
        assert invoices == [0, 1, 2]
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0, out
        assert (tmp_path / "starting").exists() and (tmp_path / "stopped").exists(), out
        assert "`Bill` waiting for messages" in out and "Processed" in out, out
        assert await rows(reader, "message", queue="orders") == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        await reader.close()
        drop_tables(db_url, prefix)


def test_docs_gen_writes_an_asyncapi_document_of_the_queues(tmp_path: Path) -> None:
    env = write_app(tmp_path, "sqlite:///" + str(tmp_path / "app.db"), "t_")
    out = tmp_path / "asyncapi.json"
    subprocess.run([FASTSTREAM, "docs", "gen", "billing:app", "--out", str(out)],
                   cwd=tmp_path, env=env, check=True, capture_output=True, timeout=60)
    doc = json.loads(out.read_text())

    assert doc["asyncapi"].startswith("3.")
    assert (doc["info"]["title"], doc["info"]["version"]) == ("Billing", "1.2")
    (server,) = doc["servers"].values()
    assert server["protocol"] == "sqlite"
    channels = {c["address"]: c for c in doc["channels"].values()}
    # the pipeline step's output queue (publish_to) is documented as a publisher's channel
    assert set(channels) == {"orders", "invoices", "audit", "archived-audit"}
    assert channels["orders"]["description"] == "Orders to bill"
    actions = sorted((op["action"], op["channel"]["$ref"].rsplit("/", 1)[1])
                     for op in doc["operations"].values())
    names = {address: key for key, c in doc["channels"].items()
             for address in [c["address"]]}
    assert actions == sorted([("receive", names["orders"]), ("send", names["invoices"]),
                              ("receive", names["audit"]),
                              ("send", names["archived-audit"])])
    schemas = doc["components"]["schemas"]
    order = payload_schema(doc, channels["orders"])
    invoice = payload_schema(doc, channels["invoices"])
    for schema in (order, invoice):
        jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate({"id": 1, "total": 2.5}, order)
    jsonschema.validate({"order": 1, "due": 5.0}, invoice)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"id": "seven"}, order)
    assert order["title"] == "Order" and invoice["title"] == "Invoice", schemas


def payload_schema(doc: dict[str, Any], channel: dict[str, Any]) -> dict[str, Any]:
    """The payload schema of a channel's (one) message, its ``$ref`` resolved."""
    (message,) = channel["messages"].values()
    message = resolve(doc, message)
    return resolve(doc, message["payload"])


def resolve(doc: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        target: Any = doc
        for part in node["$ref"].lstrip("#/").split("/"):
            target = target[part]
        node = target
    return node
