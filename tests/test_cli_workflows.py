"""``sqlmq workflows``: list, show and cancel from scripts, on the three databases; an
unknown name is an error on stderr with exit status 1."""

from __future__ import annotations

import asyncio
import json

from sqlmq import Broker

from .conftest import run_cli
from .test_cli import arun, cli_tables  # noqa: F401 (a fixture)


async def test_workflows_list_show_and_cancel(db_url: str, prefix: str,
                                              cli_tables: None) -> None:  # noqa: F811
    await arun("migrate", "--url", db_url, "--prefix", prefix)
    base = ("--url", db_url, "--prefix", prefix)
    broker = Broker(db_url, table_prefix=prefix)
    try:
        flow = broker.workflow("order-9")
        a = flow.add("charge", {"id": 9})
        flow.add("ship", {"id": 9}, after=[a])
        ids = await flow.publish()
        listed = json.loads((await arun("workflows", "list", *base, "--json")).stdout)
        assert [(w["name"], w["steps"], w["ended"]) for w in listed] == [("order-9", 2, 0)]
        shown = json.loads((await arun("workflows", "show", *base, "order-9", "--json")).stdout)
        assert shown["state"] == "RUNNING"
        assert [(s["name"], s["id"], s["state"], s["after"]) for s in shown["steps"]] == [
            ("charge", ids["charge"], "PENDING", []), ("ship", ids["ship"], "WAITING", ["charge"])]
        table = await arun("workflows", "show", *base, "order-9")
        assert table.stdout.splitlines()[0] == "workflow order-9: RUNNING"
        cancelled = await arun("workflows", "cancel", *base, "order-9")
        assert "2 step(s) cancelled" in cancelled.stdout
        shown = json.loads((await arun("workflows", "show", *base, "order-9", "--json")).stdout)
        assert [s["state"] for s in shown["steps"]] == ["CANCELLED", "CANCELLED"]
        unknown = await asyncio.to_thread(run_cli, "workflows", "show", *base, "nope")
        assert unknown.returncode == 1 and unknown.stdout == ""
        assert "no workflow is named 'nope'" in unknown.stderr
        # a signal: kept for a live message, refused for one that ended
        (live,) = await broker.publish_batch("q", ["waits"])
        sent = await arun("signal", *base, str(live), "go", "--payload", '{"by": "ann"}')
        assert sent.stdout.strip() == f"signal 'go' sent to message {live}"
        ended = await asyncio.to_thread(run_cli, "signal", *base, str(ids["ship"]), "go")
        assert ended.returncode == 1 and "ended or does not exist" in ended.stderr
        bad = await asyncio.to_thread(run_cli, "signal", *base, str(live), "go",
                                      "--payload", "{nope")
        assert bad.returncode == 2 and "--payload is not JSON" in bad.stderr
    finally:
        await broker.close()
