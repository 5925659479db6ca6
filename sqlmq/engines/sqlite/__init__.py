"""Everything sqlmq does on SQLite: the engine (:mod:`.engine`), its statements
(:mod:`.statements`), the channel statements run straight on the driver (:mod:`.channels`),
the connections' set-up and write turns (:mod:`.connections`, :mod:`.waiters`), the bound
on the write-ahead log (:mod:`.log`), row decoding (:mod:`.rows`) and the Spark ledger
(:mod:`.spark_ledger`).

May import :mod:`sqlmq.engines.sql` and sqlmq's shared modules; nothing outside
``sqlmq.engines`` imports it (:func:`sqlmq.engines.engine_for` picks the engine).
"""
