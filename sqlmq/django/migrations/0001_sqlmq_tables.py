"""sqlmq's tables, made by ``manage.py migrate``: sqlmq's own migration (``broker.migrate()``),
which creates them or brings them to the installed sqlmq's schema version. A sqlmq release
whose schema changes ships another Django migration that runs the same call.

Not atomic: sqlmq migrates on connections of its own, and on SQLite a transaction of
Django's migration around it would hold the write lock they wait for.
"""

from django.db import migrations

from sqlmq.django.schema import migrate_tables


class Migration(migrations.Migration):
    initial = True
    atomic = False
    dependencies: list[tuple[str, str]] = []
    operations = [migrations.RunPython(migrate_tables, migrations.RunPython.noop,
                                       elidable=False)]
