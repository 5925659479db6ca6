"""The test project's settings: one Django database per engine sqlmq runs on, each made for
this test process (see harness.py), whose names and sqlmq's table prefix come from the
environment, so that ``manage.py sqlmq_worker`` started by a test finds the same ones."""

import os

import pymysql
from sqlalchemy import make_url

from sqlmq import Retry

# Django's MySQL backend imports MySQLdb (mysqlclient, a C extension); PyMySQL stands in
pymysql.install_as_MySQLdb()

_PG = make_url(os.environ.get("SQLMQ_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"))
_MY = make_url(os.environ.get("SQLMQ_TEST_MYSQL_URL", "mariadb://root@127.0.0.1:3306/test"))
NAME = os.environ.get("SQLMQ_DJANGO_NAME", "sqlmq_django")

SECRET_KEY = "sqlmq-tests"
DEBUG = False
ALLOWED_HOSTS = ["testserver", "localhost"]
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
ROOT_URLCONF = "tests.djangosite.urls"
INSTALLED_APPS = ["django_tasks", "tests.djangosite.shop", "sqlmq.django"]
MIDDLEWARE: list[str] = []

DATABASES = {
    "default": {"ENGINE": "django.db.backends.sqlite3",
                "NAME": os.environ.get("SQLMQ_DJANGO_SQLITE", f"/tmp/{NAME}.db"),
                # a write transaction from BEGIN on, as sqlmq's own SQLite transactions
                "OPTIONS": {"transaction_mode": "IMMEDIATE", "timeout": 60}},
    "postgresql": {"ENGINE": "django.db.backends.postgresql", "NAME": NAME,
                   "USER": _PG.username, "PASSWORD": _PG.password or "",
                   "HOST": _PG.host, "PORT": _PG.port or 5432},
    "mariadb": {"ENGINE": "django.db.backends.mysql", "NAME": NAME,
                "USER": _MY.username, "PASSWORD": _MY.password or "",
                "HOST": _MY.host, "PORT": _MY.port or 3306,
                "OPTIONS": {"charset": "utf8mb4"}},
}

SQLMQ = {"DATABASE": os.environ.get("SQLMQ_DJANGO_DATABASE", "default"),
         "TABLE_PREFIX": os.environ.get("SQLMQ_DJANGO_PREFIX", "sqlmq_")}

TASKS = {"default": {"BACKEND": "sqlmq.django.TaskBackend",
                     "QUEUES": ["default", "emails"],
                     "OPTIONS": {"RETRY": Retry.constant(0.2, max_attempts=3), "LEASE": 30}}}
