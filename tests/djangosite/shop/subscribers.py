"""The test project's handlers for ``manage.py sqlmq_worker``."""

import sqlmq.django


@sqlmq.django.subscriber("orders", results=True)
def confirm(order: dict) -> dict:
    return {"confirmed": order["id"]}
