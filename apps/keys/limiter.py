"""The admit and settle scripts (apps/keys/lua), run over one gateway process's Redis client,
with the process's admission leases (apps/keys/leases.py) in front of the admit script."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson

from apps.keys.leases import MIN_LEASE_REQUESTS, Lease, LeaseBook
from apps.keys.ratelimit import Admission, Meter, Once, Rule
from dmxplatform.metrics import gateway_admissions
from dmxplatform.resp import ClusterRespClient, RedisUnavailable, RespClient, Script

_LUA = Path(__file__).parent / "lua"
_VIA_LEASE = gateway_admissions.labels("lease")
_VIA_REDIS = gateway_admissions.labels("redis")


class Limiter:
    def __init__(
        self, redis: RespClient | ClusterRespClient, leases: LeaseBook | None = None
    ) -> None:
        self._redis = redis
        self._admit = Script((_LUA / "admit.lua").read_text())
        self._settle = Script((_LUA / "settle.lua").read_text())
        self.leases = leases or LeaseBook(requests=0, ttl=0.0)

    async def admit(
        self, request_id: str, rules: tuple[Rule, ...], *, tokens: int, money: int = 0
    ) -> Admission:
        """Admit a request reserving `tokens` and `money` (micro-units) against every rule:
        from this process's lease when it has room, else in one Redis round trip (which may
        bring a lease)."""
        if not rules:
            return Admission(admitted=True, rules=rules, member=request_id)
        admission = self.leases.take(rules, request_id, tokens)
        if admission is not None:
            _VIA_LEASE.inc()
            return admission
        lease_requests, lease_id = self.leases.ask(rules)
        granted = (0, 0)
        admission = None
        try:
            keys, spec = _admit_spec(rules)
            reply = await self._redis.run(
                self._admit,
                keys,
                [
                    request_id,
                    tokens,
                    spec,
                    lease_requests,
                    lease_requests * tokens,
                    lease_id,
                    MIN_LEASE_REQUESTS,
                    money,
                ],
            )
            admitted, failed, retry = int(reply[0]), int(reply[1]), int(reply[2])
            if not admitted:
                return Admission(
                    admitted=False, rules=rules, failed=rules[failed - 1], retry_after_ms=retry
                )
            granted = (int(reply[3]), int(reply[4]))
            states = reply[5:]
            admission = Admission(
                admitted=True,
                rules=rules,
                remaining=tuple(
                    (int(states[i]), int(states[i + 1])) for i in range(0, len(states), 2)
                ),
                member=request_id,
            )
            _VIA_REDIS.inc()
            return admission
        finally:
            if lease_requests:
                self.leases.granted(rules, lease_id, admission, *granted)

    async def settle(
        self,
        admission: Admission | None,
        *,
        refund: int,
        events: list[tuple[str, bytes]],
        money: int = 0,
    ) -> None:
        """Give back the reservation's overestimate (`refund` tokens, `money` micro-units),
        free the slot and append the events (durable stream key, payload), in one round trip;
        a request never admitted (None) only appends its events."""
        await (await self.submit_settle(admission, refund=refund, events=events, money=money))

    async def submit_settle(
        self,
        admission: Admission | None,
        *,
        refund: int,
        events: list[tuple[str, bytes]],
        money: int = 0,
        once: Once | None = None,
    ) -> Awaitable[Any]:
        """settle(), returning once the call is on its way to Redis (RespClient.submit), with
        Redis's answer to await; with `once`, only the first try of its request is counted."""
        if admission is None:
            rules, members, once = (), [], None  # nothing reserved: nothing to count once
        else:
            rules, members = admission.rules, [admission.member]
        keys, args = _give_back_call(rules, refund, 0, money, members, events, once)
        return await self._redis.submit(self._settle, keys, args)

    async def end_leases(self, *, everything: bool = False) -> int:
        """Give back what the ended leases (all of them when `everything`) left unused;
        returns how many were given back."""
        ended = self.leases.sweep(everything=everything)
        for done, lease in enumerate(ended):
            try:
                await self._end(lease)
            except RedisUnavailable:
                self.leases.keep_ended(ended[done:])  # the next sweep tries again
                raise
        return len(ended)

    async def _end(self, lease: Lease) -> None:
        keys, args = _give_back_call(lease.rules, lease.tokens, lease.requests, 0, lease.slots, [])
        await self._redis.run(self._settle, keys, args)


def _give_back_call(
    rules: tuple[Rule, ...],
    tokens: int,
    requests: int,
    money: int,
    members: list[str],
    events: list[tuple[str, bytes]],
    once: Once | None = None,
) -> tuple[list[str], list]:
    """settle.lua's keys and arguments (see the script)."""
    keys, spec = _settle_spec(rules)
    if once is not None:
        keys, spec = _appended(keys, spec, once.key, once.row())
    return (
        [*keys, *(stream for stream, _ in events)],
        [
            tokens,
            requests,
            money,
            spec,
            len(members),
            *members,
            *(payload for _, payload in events),
        ],
    )


# A rule set's keys and specs are the same for every request of a key, model and hour: made once.
_SPEC_CACHE = 4096
_ADMIT_COSTS = {
    Meter.TOKENS: "t",
    Meter.QUOTA: "t",
    Meter.NONCE: 0,
    Meter.BUDGET: "m",
    Meter.BALANCE: "m",
}


def _admit_row(rule: Rule) -> list:
    return [rule.kind, _ADMIT_COSTS.get(rule.meter, 1), rule.limit, rule.param]


def _settle_row(rule: Rule) -> list:
    return [rule.settle_kind, rule.limit, rule.param]


def _admit_spec(rules: tuple[Rule, ...]) -> tuple[list[str], bytes]:
    return _spec(rules, _admit_row)


def _settle_spec(rules: tuple[Rule, ...]) -> tuple[list[str], bytes]:
    return _spec(rules, _settle_row)


def _spec(rules: tuple[Rule, ...], row: Callable[[Rule], list]) -> tuple[list[str], bytes]:
    """The scripts' keys and JSON rules. A signed request's nonce rule (always last) is new
    every time: the rest comes from the cache and the nonce is appended, so signed traffic
    neither misses the cache nor evicts the entries of every other key."""
    if not rules or rules[-1].meter != Meter.NONCE:
        return _cached_spec(rules, row)
    nonce = rules[-1]
    return _appended(*_cached_spec(rules[:-1], row), nonce.key, row(nonce))


def _appended(keys: list[str], spec: bytes, key: str, row: list) -> tuple[list[str], bytes]:
    """The scripts' keys and JSON rules with one more rule, last, made for this call."""
    return [*keys, key], spec[:-1] + (b"," if keys else b"") + orjson.dumps(row) + b"]"


@functools.lru_cache(maxsize=_SPEC_CACHE)
def _cached_spec(rules: tuple[Rule, ...], row: Callable[[Rule], list]) -> tuple[list[str], bytes]:
    return [rule.key for rule in rules], orjson.dumps([row(rule) for rule in rules])
