"""The inbox's far brokers, one module each (:mod:`.rabbitmq`, :mod:`.jetstream`,
:mod:`.redis_streams`), each imported only when an inbox from its kind of broker is made
(see :func:`sqlmq.relay.source.open_source`), so that its client is needed only then."""


def describe(exc: BaseException) -> str:
    """A far broker's error in one line for the inbox's log and refusals: its first line,
    at most 300 characters (client errors can carry whole server replies)."""
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:300]
