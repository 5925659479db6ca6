"""A subscriber of one MQTT topic in a process of its own, for the relay tests: prints
``subscribed`` once it is, then writes a line per message (its sqlmq-id, its
sqlmq-published-at and its payload in hex, tab-separated) to the file it is given, until
SIGTERM. paho's network thread acknowledges as fast as messages come."""

from __future__ import annotations

import signal
import sys
import threading

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion


def main(topic: str, out_path: str) -> None:
    out = open(out_path, "a", buffering=1)
    done = threading.Event()
    client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)

    def on_connect(client: mqtt.Client, userdata: object, flags: object, rc: object,
                   properties: object = None) -> None:
        client.subscribe(topic, qos=1)

    def on_subscribe(*args: object) -> None:
        print("subscribed", flush=True)

    def on_message(client: mqtt.Client, userdata: object, msg: mqtt.MQTTMessage) -> None:
        props = dict(getattr(msg.properties, "UserProperty", []))
        out.write(f"{props.get('sqlmq-id')}\t{props.get('sqlmq-published-at')}\t"
                  f"{msg.payload.hex()}\n")

    client.on_connect = on_connect
    client.on_subscribe = on_subscribe
    client.on_message = on_message
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    client.connect("127.0.0.1", 1883)
    client.loop_start()
    done.wait()
    client.loop_stop()
    out.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
