"""RocketMQ remoting protocol: the codec and the translation to ZNS/1 ops (sans-I/O)."""
