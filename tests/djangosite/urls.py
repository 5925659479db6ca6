from django.urls import path

from .shop import views

urlpatterns = [
    path("orders", views.order),
    path("orders/async", views.order_async),
    path("notify/async", views.notify_async),
    path("meaning", views.meaning),
    path("meaning/async", views.meaning_async),
    path("results/<str:result_id>", views.result),
]
