"""A cluster of embedded brokers: n Apache Kafka nodes (KRaft, each a broker and a controller) on one machine.

The same jars and `EmbeddedKafka` as the one-node broker: one data folder per node, one cluster id formatted into
all of them, a static controller quorum of every node on loopback. Topics default to what production runs:
replication factor 3 and min.insync.replicas 2. It is for seeing the fleet through a broker's failure on one machine;
the fleet's runtime does not use it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

from roundtrip._broker.embedded import (
    DEFAULT_JAVA_OPTS,
    BrokerError,
    BrokerStartError,
    EmbeddedKafka,
    free_port,
    random_cluster_id,
)
from roundtrip._kernel.kafka.clients import clients_of

NODE_JAVA_OPTS = DEFAULT_JAVA_OPTS.replace("-Xmx512m", "-Xmx384m")  # three JVMs share the machine with the fleet


class ClusterNode(EmbeddedKafka):
    """One node of a Cluster: an EmbeddedKafka that knows its node id and can be SIGKILLed."""

    def __init__(self, node_id: int, data_dir: Path, port: int, controller_port: int, **options: Any) -> None:
        super().__init__(data_dir, port, controller_port, **options)
        self.node_id = node_id

    def kill(self) -> int | None:
        """SIGKILL the node's JVM (its whole process group): no controlled shutdown. Returns its exit code (-9)."""
        if self.running():
            assert self.proc is not None
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        return self.stop()


def node_properties(node_id: int, voters: str, n: int) -> dict[str, object]:
    """What a node of an n-node cluster sets beyond the one-node broker's properties."""
    factor, min_isr = min(3, n), min(2, n)
    return {
        "node.id": node_id,
        "controller.quorum.voters": voters,
        "default.replication.factor": factor,
        "min.insync.replicas": min_isr,
        "offsets.topic.replication.factor": factor,
        "transaction.state.log.replication.factor": factor,
        "transaction.state.log.min.isr": min_isr,
        "share.coordinator.state.topic.replication.factor": factor,
        "share.coordinator.state.topic.min.isr": min_isr,
    }


class Cluster:
    """The nodes of one cluster, with ids 1..n; a context manager that stops them all."""

    def __init__(self, nodes: list[ClusterNode], cluster_id: str) -> None:
        self.nodes, self.cluster_id = nodes, cluster_id

    @property
    def bootstrap(self) -> str:
        return ",".join(node.bootstrap for node in self.nodes)

    def node(self, node_id: int) -> ClusterNode:
        return self.nodes[node_id - 1]

    def running(self) -> list[ClusterNode]:
        return [node for node in self.nodes if node.running()]

    def start(self, node_id: int | None = None, timeout: float = 120.0) -> Cluster:
        """Start one node (or every node not running) on its data; return once each serves clients (a KRaft broker
        answers a metadata request only once caught up with the metadata log and unfenced)."""
        targets = [self.node(node_id)] if node_id else [node for node in self.nodes if not node.running()]
        unformatted = [node for node in targets if not node.is_formatted]
        for node in unformatted:
            node.write_properties()
        with ThreadPoolExecutor(max(1, len(unformatted))) as pool:
            list(pool.map(lambda node: node.format_storage(self.cluster_id), unformatted))
        for node in targets:
            node.start()
        deadline = time.monotonic() + timeout
        for node in targets:
            node.wait_ready(max(1.0, deadline - time.monotonic()))
        return self

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM every node at once (one by one, the last would wait for a quorum that is gone)."""
        with ThreadPoolExecutor(len(self.nodes)) as pool:
            list(pool.map(lambda node: node.stop(timeout), self.nodes))

    async def _describe(self, topics: list[str] | None = None) -> list[dict[str, Any]]:
        running = self.running()
        if not running:
            raise BrokerError("no node of the cluster is running")
        admin = clients_of(",".join(n.bootstrap for n in running)).admin(
            client_id="roundtrip-cluster", request_timeout_ms=10000
        )
        await admin.start()
        try:
            return await admin.describe_topics(topics)  # type: ignore[no-any-return]  # aiokafka ships no types
        finally:
            await admin.close()

    async def leader_of(self, topic: str, partition: int) -> int:
        """Node id of the partition's leader (-1: none now)."""
        (described,) = await self._describe([topic])
        return cast(int, next(p["leader"] for p in described["partitions"] if p["partition"] == partition))

    async def out_of_sync(self) -> list[str]:
        """'topic/partition' of every partition whose in-sync replicas are fewer than its replicas."""
        return [
            f"{t['topic']}/{p['partition']}"
            for t in await self._describe()
            for p in t["partitions"]
            if set(p["isr"]) != set(p["replicas"])
        ]

    async def wait_in_sync(self) -> None:
        """Until every partition has all its replicas in sync again (a rolling restart waits for it), 120 s at most."""
        deadline = time.monotonic() + 120.0
        while lagging := await self.out_of_sync():
            if time.monotonic() > deadline:
                raise BrokerStartError(f"replicas still out of sync after 120 s: {', '.join(lagging[:10])}")
            await asyncio.sleep(0.5)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<Cluster {self.cluster_id} {self.bootstrap} running {[n.node_id for n in self.running()]}>"


def _ports(count: int) -> list[int]:
    ports: list[int] = []
    while len(ports) < count:
        if (port := free_port()) not in ports:
            ports.append(port)
    return ports


def start(
    data_dir: Path | str,
    n: int = 3,
    *,
    timeout: float = 120.0,
    **options: Any,
) -> Cluster:
    """n nodes in data_dir/node-<id> on free ports, formatted with one cluster id, started and serving clients."""
    ports = _ports(2 * n)
    voters = ",".join(f"{i}@127.0.0.1:{ports[n + i - 1]}" for i in range(1, n + 1))
    nodes = [
        ClusterNode(
            i,
            Path(data_dir) / f"node-{i}",
            ports[i - 1],
            ports[n + i - 1],
            java_opts=NODE_JAVA_OPTS,
            properties=node_properties(i, voters, n),
            **options,
        )
        for i in range(1, n + 1)
    ]
    cluster = Cluster(nodes, random_cluster_id())
    try:
        return cluster.start(timeout=timeout)
    except BaseException:
        cluster.stop(timeout=5)
        raise
