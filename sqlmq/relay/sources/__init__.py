"""The inbox's far brokers, one module each (:mod:`.rabbitmq`, :mod:`.jetstream`,
:mod:`.redis_streams`), each imported only when an inbox from its kind of broker is made
(see :func:`sqlmq.relay.source.open_source`), so that its client is needed only then."""
