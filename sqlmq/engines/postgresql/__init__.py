"""Everything sqlmq does on PostgreSQL: the engine (:mod:`.engine`), its statements
(:mod:`.statements`), the acquire's floors (:mod:`.floors`), ``LISTEN``/``NOTIFY`` wake-ups
and dead-letter notices (:mod:`.notify`, :mod:`.wakes`), the binary ``COPY`` publish
(:mod:`.copy_publish`), the driver's errors (:mod:`.errors`) and the Spark ledger
(:mod:`.spark_ledger`).

May import :mod:`sqlmq.engines.sql` and sqlmq's shared modules; nothing outside
``sqlmq.engines`` imports it (:func:`sqlmq.engines.engine_for` picks the engine).
"""
