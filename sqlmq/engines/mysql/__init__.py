"""Everything sqlmq does on MySQL 8 and MariaDB: the engine (:mod:`.engine`, its
one-packet acquire, fair acquire and slot passing), its statements (:mod:`.statements`) and
the Spark ledger (:mod:`.spark_ledger`).

May import :mod:`sqlmq.engines.sql` and sqlmq's shared modules; nothing outside
``sqlmq.engines`` imports it (:func:`sqlmq.engines.engine_for` picks the engine).
"""
