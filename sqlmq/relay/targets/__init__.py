"""The far brokers a relay sends to, one module each, imported only when a relay to that
broker is made (:data:`sqlmq.relay.target.TARGETS` names them by URL scheme)."""
