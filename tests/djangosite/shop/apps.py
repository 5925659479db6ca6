from django.apps import AppConfig


class ShopConfig(AppConfig):
    name = "tests.djangosite.shop"
    label = "shop"
