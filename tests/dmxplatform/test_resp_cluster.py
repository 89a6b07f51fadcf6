"""The request path's Redis client on a real Redis Cluster of three masters (tests/faults.py):
commands reach their slot's master, redirections are followed, a dead master fails only its
own slots."""

from __future__ import annotations

import asyncio
import uuid

import pytest
import redis
from redis.crc import key_slot

from dmxplatform.resp import ClusterRespClient, RedisUnavailable, RespError, Script, seed_nodes

INCR = Script("return redis.call('INCRBY', KEYS[1], ARGV[1])")


def run(cluster, scenario):
    async def main():
        client = ClusterRespClient(cluster.url, timeout=1.0)
        try:
            return await scenario(client)
        finally:
            await client.close()

    return asyncio.run(main())


def node(cluster, index: int) -> redis.Redis:
    return redis.Redis(port=cluster.ports[index], socket_timeout=5)


def keys_on_every_master(cluster, count: int = 30) -> list[str]:
    keys = [f"dmxtest-rc-{uuid.uuid4().hex}" for _ in range(count)]
    assert {cluster.node_of(key) for key in keys} == set(range(len(cluster.ports)))
    return keys


def test_seed_nodes_parse_hosts_ports_and_credentials():
    assert seed_nodes("redis://a:7000,b,[::1]:7002") == (
        [("a", 7000), ("b", 6379), ("::1", 7002)],
        None,
        None,
    )
    assert seed_nodes("redis://dmx:p%40ss@10.0.0.1:7000,10.0.0.2:7001") == (
        [("10.0.0.1", 7000), ("10.0.0.2", 7001)],
        "dmx",
        "p@ss",
    )
    assert seed_nodes("redis://:secret@r:6380")[1:] == (None, "secret")


def test_each_command_goes_to_its_slots_master(redis_cluster):
    keys = keys_on_every_master(redis_cluster)

    async def scenario(client):
        await asyncio.gather(*(client.execute(b"SET", key, key) for key in keys))
        return await asyncio.gather(*(client.execute(b"GET", key) for key in keys))

    assert run(redis_cluster, scenario) == [key.encode() for key in keys]
    # Each key is on its own master (a plain client there reads it without a redirection).
    for key in keys:
        assert node(redis_cluster, redis_cluster.node_of(key)).get(key) == key.encode()


def test_scripts_run_on_their_keys_master_and_refuse_keys_across_slots(redis_cluster):
    tag = f"{{dmxtest-{uuid.uuid4().hex}}}"

    async def scenario(client):
        ran = await client.run(INCR, [f"{tag}:a", f"{tag}:b"], [5])
        submitted = await (await client.submit(INCR, [f"{tag}:a"], [2]))
        # Keys across slots: Redis refuses them, the client routes by the first.
        elsewhere = next(
            key
            for key in (f"dmxtest-elsewhere-{i}" for i in range(3))
            if key_slot(key.encode()) != key_slot(tag.encode())
        )
        with pytest.raises(RespError, match="CROSSSLOT"):
            await client.run(INCR, [f"{tag}:a", elsewhere], [1])
        return ran, submitted

    assert run(redis_cluster, scenario) == (5, 7)
    assert node(redis_cluster, redis_cluster.node_of(tag)).get(f"{tag}:a") == b"7"


def test_a_wrong_slot_map_is_corrected_by_moved_replies(redis_cluster):
    keys = keys_on_every_master(redis_cluster)
    for key in keys:
        node(redis_cluster, redis_cluster.node_of(key)).set(key, "v")

    async def scenario(client):
        await client.execute(b"PING")
        # As if every slot had moved to the first master since the map was read.
        client._owners = [client._owners[0]] * len(client._owners)
        return await asyncio.gather(*(client.execute(b"GET", key) for key in keys))

    assert run(redis_cluster, scenario) == [b"v"] * len(keys)


def test_each_master_runs_a_keyless_command_on_all(redis_cluster):
    async def scenario(client):
        return await client.each_master(b"CLUSTER", b"MYID")

    ids = run(redis_cluster, scenario)
    assert sorted(ids) == sorted(
        node(redis_cluster, i).execute_command("CLUSTER MYID") for i in range(3)
    )


def test_a_dead_master_fails_only_its_slots_until_it_is_back(redis_cluster):
    keys = keys_on_every_master(redis_cluster)
    victim = redis_cluster.node_of(keys[0])

    async def write_all(client):
        return await asyncio.gather(
            *(client.execute(b"SET", key, 1) for key in keys), return_exceptions=True
        )

    async def scenario(client):
        assert await write_all(client) == [b"OK"] * len(keys)
        redis_cluster.kill(victim)
        during = await write_all(client)
        alive = await client.execute(b"PING")  # a keyless command finds a living master
        redis_cluster.restart(victim)
        return during, alive, await write_all(client)

    during, alive, after = run(redis_cluster, scenario)
    for key, outcome in zip(keys, during, strict=True):
        if redis_cluster.node_of(key) == victim:
            assert isinstance(outcome, RedisUnavailable), (key, outcome)
        else:
            assert outcome == b"OK", (key, outcome)
    assert alive == b"PONG"
    assert after == [b"OK"] * len(keys)


def test_a_master_that_answers_nothing_holds_back_no_other_masters_commands(redis_cluster):
    """A master whose process is stopped (connections open, nothing answered: a network that
    drops packets) costs its own keys a timeout; the others' commands, and the slot-map refresh
    its failures ask for, do not wait on it."""
    keys = keys_on_every_master(redis_cluster)
    silent = 0  # the master asked first for the map: the one a refresh would wait on
    others = [key for key in keys if redis_cluster.node_of(key) != silent]
    mine = [key for key in keys if redis_cluster.node_of(key) == silent]

    async def scenario(client):
        await client.execute(b"PING")
        redis_cluster.pause(silent)
        try:
            # Its keys time out (and mark the map stale); then, with the refresh due, the other
            # masters' commands are answered well within one timeout.
            lost = await asyncio.gather(
                *(client.execute(b"GET", key) for key in mine), return_exceptions=True
            )
            client._mapped_at = 0.0  # the map's refresh is due now
            async with asyncio.timeout(0.8):
                served = await asyncio.gather(*(client.execute(b"SET", key, 1) for key in others))
        finally:
            redis_cluster.resume(silent)
        return lost, served

    lost, served = run(redis_cluster, scenario)
    assert all(isinstance(outcome, RedisUnavailable) for outcome in lost), lost
    assert served == [b"OK"] * len(others)


def test_a_slot_in_migration_is_followed_by_ask_then_by_moved(redis_cluster):
    """A slot moving from one master to another, as redis-cli --cluster reshard moves it: a key
    not yet on the old master is written on the new one (ASK); once the slot has moved, the
    client's map follows it (MOVED)."""
    key = f"dmxtest-migrating-{uuid.uuid4().hex}"
    script_key = f"{{{key}}}:script"
    slot = key_slot(key.encode())
    assert key_slot(script_key.encode()) == slot
    source = redis_cluster.node_of(key)
    target = (source + 1) % 3
    source_node, target_node = node(redis_cluster, source), node(redis_cluster, target)
    source_id = source_node.execute_command("CLUSTER MYID")
    target_id = target_node.execute_command("CLUSTER MYID")

    async def scenario(client):
        await client.execute(b"PING")  # the map, from before the migration
        target_node.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", source_id)
        source_node.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", target_id)
        await client.execute(b"SET", key, "moving")
        by_script = await client.run(INCR, [script_key], [3])
        for one in (target_node, source_node):
            one.execute_command("CLUSTER SETSLOT", slot, "NODE", target_id)
        after = await client.execute(b"GET", key)
        return by_script, after

    by_script, after = run(redis_cluster, scenario)
    assert (by_script, after) == (3, b"moving")
    assert target_node.execute_command("CLUSTER COUNTKEYSINSLOT", slot) == 2
    assert source_node.execute_command("CLUSTER COUNTKEYSINSLOT", slot) == 0
    assert redis_cluster.node_of(key) == target
