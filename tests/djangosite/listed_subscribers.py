"""Handlers in a module SQLMQ["SUBSCRIBERS"] lists (no app's subscribers.py)."""

import sqlmq.django


@sqlmq.django.subscriber(["audit", "notices"], workers=2)
def audit(entry: dict) -> None:
    return None
