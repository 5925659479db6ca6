"""What the three SQL engines share: the :class:`~.engine.SqlEngine` base and the
mixins it is built from (channels, fair order, slot passing, publish, control, topics,
schedules, insights, operations), the statements common to all three databases, row
decoding, id lists, kept connections and the SQLAlchemy engines made from a URL.

Imports the package's own modules and sqlmq's shared ones (records, lifecycle, schema,
channels); never a database's package: each database builds on this one, not the other way.
"""
