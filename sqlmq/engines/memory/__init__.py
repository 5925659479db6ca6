"""The in-process engine behind ``memory://``, for users' unit tests and examples: the
whole contract in plain Python under one lock (:mod:`.engine`), with channels, schedules,
insights and operations in modules of their own. It passes the same contract suite as the
databases.

Imports no database's package and no SQL engine code; nothing outside ``sqlmq.engines``
imports it (:func:`sqlmq.engines.engine_for` picks it for ``memory://``).
"""
