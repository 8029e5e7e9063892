"""Kafka: every client the fleet builds, the key-ordered consumer, messaging and dead letters, transactions,
topic admin, ACLs, and the two seams into FastStream's and aiokafka's insides."""
