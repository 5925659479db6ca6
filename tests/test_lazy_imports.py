"""The package root imports its names on first use, so that a Spark worker importing
``sqlmq.spark`` loads neither the broker nor SQLAlchemy's asyncio and ORM modules."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import sqlmq


def _declared_sources() -> dict[str, str]:
    """Each name of ``__all__`` and the module its ``TYPE_CHECKING`` import names."""
    tree = ast.parse(Path(sqlmq.__file__).read_text())
    block = next(n for n in tree.body if isinstance(n, ast.If))
    return {alias.name: f"sqlmq.{node.module}" for node in block.body
            if isinstance(node, ast.ImportFrom) for alias in node.names}


def test_every_public_name_is_the_object_its_module_defines() -> None:
    sources = _declared_sources()
    assert sorted(sources) == sorted(sqlmq.__all__)
    for name, module in sources.items():
        assert getattr(sqlmq, name) is getattr(importlib.import_module(module), name), name
    assert set(sqlmq.__all__) <= set(dir(sqlmq))


def test_an_unknown_name_is_an_attribute_error() -> None:
    try:
        sqlmq.Brokr  # type: ignore[attr-defined]  # noqa: B018
    except AttributeError as exc:
        assert "Brokr" in str(exc)
    else:
        raise AssertionError("no AttributeError")


def test_the_spark_source_loads_no_broker_and_no_orm() -> None:
    code = ("import sys, sqlmq.spark.source; "
            "print(sorted(m for m in ('sqlmq.broker', 'sqlalchemy.orm', "
            "'sqlalchemy.ext.asyncio') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120).stdout
    assert out.strip() == "[]"


def test_the_inbox_loads_no_far_brokers_client_until_it_is_made() -> None:
    """``import sqlmq`` and its ``Inbox`` load none of aio-pika, nats-py or redis: the
    inbox's client is imported when an inbox from that kind of broker is made."""
    code = ("import sys, sqlmq; sqlmq.Broker; sqlmq.Inbox; "
            "print(sorted(m for m in ('aio_pika', 'nats', 'redis') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120).stdout
    assert out.strip() == "[]"
