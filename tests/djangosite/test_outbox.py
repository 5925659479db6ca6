"""sqlmq.django.publish: a message in the transaction of Django's own connection, on
PostgreSQL, MariaDB and SQLite."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.db import IntegrityError, connections, transaction
from django.test import AsyncClient, Client, override_settings

import sqlmq.django
from sqlmq.django.portal import portal
from sqlmq.errors import PublishError

from ..conftest import rows
from .harness import Site
from .shop.models import Order


def messages(queue: str | None = None) -> list[Any]:
    b = sqlmq.django.broker()
    where = {} if queue is None else {"queue": queue}
    return portal.call(lambda: rows(b, "message", **where))


def orders(site: Site) -> list[float]:
    return list(Order.objects.using(site.alias).values_list("total", flat=True))


@pytest.mark.parametrize("path", ["/orders", "/orders/async"])
def test_view_commits_order_and_message_together(django_site: Site, path: str) -> None:
    response = Client().post(path, {"total": "9.5"})

    assert response.status_code == 200, response.content
    (message,) = messages("orders")
    assert json.loads(message["payload"]) == {"id": response.json()["id"], "total": 9.5}
    assert orders(django_site) == [9.5]


@pytest.mark.parametrize("path", ["/orders", "/orders/async"])
def test_view_that_raises_leaves_neither_order_nor_message(django_site: Site, path: str) -> None:
    response = Client().post(path, {"total": "9.5", "declined": "1"})

    assert response.status_code == 402
    assert messages() == [] and orders(django_site) == []


async def test_async_client_commits_and_rolls_back(django_site: Site) -> None:
    client = AsyncClient()
    declined = await client.post("/orders/async", {"total": "1", "declined": "1"})
    placed = await client.post("/orders/async", {"total": "2"})

    assert (declined.status_code, placed.status_code) == (402, 200)
    assert [json.loads(m["payload"])["total"] for m in messages()] == [2.0]


def test_batch_rolls_back_with_the_block(django_site: Site) -> None:
    with pytest.raises(RuntimeError), transaction.atomic(using=django_site.alias):
        Order.objects.using(django_site.alias).create(total=1)
        ids = sqlmq.django.publish_batch("orders", [{"n": i} for i in range(300)])
        assert len(ids) == 300
        raise RuntimeError("abandoned")

    assert messages() == [] and orders(django_site) == []


def test_publish_inside_a_savepoint_rolls_back_with_it(django_site: Site) -> None:
    with transaction.atomic(using=django_site.alias):
        sqlmq.django.publish("orders", {"kept": True})
        with pytest.raises(RuntimeError), transaction.atomic(using=django_site.alias):
            sqlmq.django.publish("orders", {"kept": False})
            raise RuntimeError("inner block abandoned")

    assert [json.loads(m["payload"]) for m in messages()] == [{"kept": True}]


def test_publish_outside_a_block_commits_at_once_like_the_orm(django_site: Site) -> None:
    connection = connections[django_site.alias]
    assert connection.get_autocommit() and not connection.in_atomic_block

    msg_id = sqlmq.django.publish("notices", {"text": "hello"}, priority=3)

    (message,) = messages("notices")
    assert (message["id"], message["priority"]) == (msg_id, 3)
    assert connection.get_autocommit() and not connection.in_atomic_block


def test_apublish_from_an_async_view_commits_at_once(django_site: Site) -> None:
    response = Client().post("/notify/async", {"text": "hi"})

    assert response.status_code == 200
    (message,) = messages("notices")
    assert message["id"] == response.json()["id"]


def test_publish_in_a_broken_block_is_refused_as_the_orm_would(django_site: Site) -> None:
    alias = django_site.alias
    first = Order.objects.using(alias).create(total=1)
    with transaction.atomic(using=alias):
        with pytest.raises(IntegrityError):
            Order.objects.using(alias).create(id=first.id, total=2)  # the same primary key
        with pytest.raises(transaction.TransactionManagementError):
            sqlmq.django.publish("orders", {"id": first.id})
        transaction.set_rollback(True, using=alias)

    assert messages() == []


def test_broker_on_another_kind_of_database_is_refused_naming_both(django_site: Site,
                                                                   tmp_path: Any) -> None:
    other = (f"sqlite:///{tmp_path}/other.db" if django_site.kind != "sqlite" else
             "postgresql://postgres@127.0.0.1:5432/test")
    with override_settings(SQLMQ={"DATABASE": django_site.alias, "URL": other,
                                  "TABLE_PREFIX": django_site.prefix}):
        with pytest.raises(PublishError, match="this broker's tables are in") as raised, \
                transaction.atomic(using=django_site.alias):
            sqlmq.django.publish("orders", {"id": 1})
    assert ("sqlite" in str(raised.value)) and ("postgresql" in str(raised.value)
                                                or "mysql" in str(raised.value))


def test_topic_dedup_and_channel_publishes_read_on_django_s_connection(
        django_site: Site) -> None:
    b = sqlmq.django.broker()
    portal.call(lambda: b.join_group("orders.*", "billing"))
    portal.call(lambda: b.set_channel("tenant-1", max_concurrency=1))
    with transaction.atomic(using=django_site.alias):
        fanout = sqlmq.django.publish_topic("orders.created", {"id": 1})
        first = sqlmq.django.publish("orders", {"id": 2}, dedup_key="order-2")
        again = sqlmq.django.publish("orders", {"id": 2}, dedup_key="order-2")
        limited = sqlmq.django.publish("orders", {"id": 3}, channel="tenant-1")

    assert list(fanout) == ["billing@orders.*"]
    assert again == first and again.duplicate
    assert sorted(m["id"] for m in messages()) == sorted([fanout["billing@orders.*"], first,
                                                          limited])
