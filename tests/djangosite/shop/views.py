"""An order and its message in one transaction, from a sync and an async view."""

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import transaction
from django.http import HttpRequest, JsonResponse

import sqlmq.django

from . import tasks
from .models import Order


def database() -> str:
    """The database sqlmq's tables are in (each test picks one)."""
    return settings.SQLMQ["DATABASE"]


class PaymentDeclined(Exception):
    pass


def place_order(total: float, declined: bool) -> Order:
    with transaction.atomic(using=database()):
        order = Order.objects.using(database()).create(total=total)
        sqlmq.django.publish("orders", {"id": order.id, "total": total})
        if declined:
            raise PaymentDeclined(f"payment of {total} declined")
    return order


def _answer(request: HttpRequest) -> tuple[float, bool]:
    return float(request.POST["total"]), request.POST.get("declined") == "1"


def order(request: HttpRequest) -> JsonResponse:
    try:
        placed = place_order(*_answer(request))
    except PaymentDeclined as exc:
        return JsonResponse({"error": str(exc)}, status=402)
    return JsonResponse({"id": placed.id})


async def order_async(request: HttpRequest) -> JsonResponse:
    try:
        placed = await sync_to_async(place_order)(*_answer(request))
    except PaymentDeclined as exc:
        return JsonResponse({"error": str(exc)}, status=402)
    return JsonResponse({"id": placed.id})


async def notify_async(request: HttpRequest) -> JsonResponse:
    """A message of its own, outside any block: committed at once, like ``acreate()``."""
    msg_id = await sqlmq.django.apublish("notices", {"text": request.POST["text"]})
    return JsonResponse({"id": msg_id})


def _result(result) -> JsonResponse:
    return JsonResponse({"result_id": result.id,
                         "result": result.return_value if result.is_finished else None,
                         "status": result.status})


def meaning(request: HttpRequest) -> JsonResponse:
    return _result(tasks.calculate_meaning_of_life.enqueue())


async def meaning_async(request: HttpRequest) -> JsonResponse:
    return _result(await tasks.calculate_meaning_of_life.aenqueue())


def result(request: HttpRequest, result_id: str) -> JsonResponse:
    return _result(tasks.calculate_meaning_of_life.get_result(result_id))
