"""The outbox on the caller's own driver connection: ``publish(…, connection=conn)`` with an
asyncpg, psycopg, sqlite3, aiosqlite, PyMySQL or asyncmy connection, in the caller's
transaction, through the engine's one publish path.

:mod:`.connection` is what every driver's connection offers (each database's package has
its drivers': ``postgresql/drivers.py``, ``mysql/drivers.py``, ``sqlite/drivers.py``);
:mod:`.statements` turns SQLAlchemy's compiled statements into the driver's text and
arguments; :mod:`.results` gives their rows back as the flows read them; :mod:`.runs` runs
a flow on the driver, for the SQL engines.
"""

from .connection import AsyncDriverConnection, DriverConnection, SyncDriverConnection
from .results import DriverResult, DriverRows, column_names

# .runs (the engines' side) is imported by the engines: what recognises a connection here
# loads no SQLAlchemy asyncio module (a Spark worker imports sqlmq.engines).
__all__ = ["AsyncDriverConnection", "DriverConnection", "DriverResult", "DriverRows",
           "SyncDriverConnection", "column_names"]
