"""Admission leases: a gateway process admits a busy key's requests from a share it took in
advance, so that most requests skip the admission round trip.

When a rule set (a key's limits for one model) comes to Redis for admission and was admitted
since the last sweep, the admission asks admit.lua for a lease beside the request: requests,
tokens and concurrency slots taken from the same buckets, quotas and slot sets as any
reservation. To every other replica a lease is capacity in use, so limits hold across replicas
exactly as without leases. The process then admits that rule set's requests from the lease, in
memory, until it runs out or expires; settling is unchanged (each request gives back what it did
not use and frees its slot, a lease slot being its slot), and an ended lease gives back what is
left.

What it costs: capacity one process leased is unavailable to the others until used or given
back (at most DMX_ADMISSION_LEASE_MS). admit.lua keeps that small: a lease takes at most a
quarter of what each rule has left, and none is granted below MIN_LEASE_REQUESTS, so a key near
any limit is admitted one request at a time as before. A process that dies with a lease leaves
its unused tokens counted: per-minute buckets refill within their minute, leased slots are
reclaimed like any dead request's (ratelimit.SLOT_LEASE_MS), and a quota keeps at most the one
lease's unused tokens counted until its period ends (usage records, and so bills, are exact).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from itertools import count

from apps.keys.ratelimit import Admission, Meter, Rule

# A lease for fewer requests saves too few round trips to be worth the capacity it holds.
MIN_LEASE_REQUESTS = 4

_TOKEN_METERS = frozenset((Meter.TOKENS, Meter.QUOTA))


@dataclass(slots=True)
class Lease:
    """What one process holds of a rule set's capacity, and what it has handed out."""

    rules: tuple[Rule, ...]
    requests: int  # left to admit
    tokens: int  # left to reserve
    slots: list[str]  # free slot members, one per request left (none without a slot rule)
    remaining: tuple[tuple[int, int], ...]  # each rule's headroom when granted (for the headers)
    expires_at: float  # time.monotonic()
    used_requests: int = 0
    used_tokens: int = 0

    def take(self, request_id: str, tokens: int, now: float) -> Admission | None:
        """Admit one request reserving `tokens` from this lease, if it still has room."""
        if self.requests < 1 or self.tokens < tokens or now >= self.expires_at:
            return None
        self.requests -= 1
        self.tokens -= tokens
        self.used_requests += 1
        self.used_tokens += tokens
        return Admission(
            admitted=True,
            rules=self.rules,
            remaining=self._remaining(),
            member=self.slots.pop() if self.slots else request_id,
        )

    def _remaining(self) -> tuple[tuple[int, int], ...]:
        """The headroom at grant, less what this lease has handed out since: every other
        replica's use is missing, as it is from any rate-limit header between two requests."""
        used_tokens, used_requests = self.used_tokens, self.used_requests
        return tuple(
            (max(left - (used_tokens if rule.meter in _TOKEN_METERS else used_requests), 0), reset)
            for rule, (left, reset) in zip(self.rules, self.remaining, strict=True)
        )

    @property
    def unused(self) -> bool:
        return self.requests > 0 or self.tokens > 0 or bool(self.slots)


@dataclass(slots=True)
class LeaseBook:
    """One process's leases, keyed by rule set; plain memory touched only by its event loop."""

    requests: int  # requests a lease asks for; 0 turns leases off
    ttl: float  # seconds a lease lasts
    _leases: dict[tuple[Rule, ...], Lease] = field(default_factory=dict)
    _recent: set[tuple[Rule, ...]] = field(default_factory=set)  # admitted since the last sweep
    _asking: set[tuple[Rule, ...]] = field(default_factory=set)  # a grant is on its way
    _ended: list[Lease] = field(default_factory=list)  # replaced before they expired
    _ids: count = field(default_factory=count)
    _prefix: str = field(default_factory=lambda: "L" + os.urandom(6).hex())

    def take(self, rules: tuple[Rule, ...], request_id: str, tokens: int) -> Admission | None:
        lease = self._leases.get(rules)
        if lease is None:
            return None
        return lease.take(request_id, tokens, time.monotonic())

    def ask(self, rules: tuple[Rule, ...]) -> tuple[int, str]:
        """Requests to ask a lease for with this Redis admission (0: none) and the lease's id.

        Only for a rule set admitted before within the sweep period (a busy one), never with a
        nonce (it is good for one request) or money (a budget or a balance: money a dead
        process held would stay held until the period ends), and not while another grant for
        it is on its way."""
        if (
            not self.requests
            or rules[-1].meter == Meter.NONCE
            or rules in self._asking
            or any(rule.meter in Meter.MONEY for rule in rules)
        ):
            return 0, ""
        if rules not in self._recent and rules not in self._leases:
            self._recent.add(rules)
            return 0, ""
        self._asking.add(rules)
        return self.requests, f"{self._prefix}:{next(self._ids)}"

    def granted(
        self,
        rules: tuple[Rule, ...],
        lease_id: str,
        admission: Admission | None,
        requests: int,
        tokens: int,
    ) -> None:
        """Keep the lease granted with `admission` (none when Redis granted none or failed);
        the lease it replaces ends."""
        self._asking.discard(rules)
        self._recent.add(rules)
        if not requests:
            return
        old = self._leases.get(rules)
        if old is not None:
            self._ended.append(old)
        has_slots = any(rule.meter == Meter.CONCURRENCY for rule in rules)
        self._leases[rules] = Lease(
            rules=rules,
            requests=requests,
            tokens=tokens,
            slots=[f"{lease_id}:{j}" for j in range(1, requests + 1)] if has_slots else [],
            remaining=admission.remaining,
            expires_at=time.monotonic() + self.ttl,
        )

    def keep_ended(self, leases: list[Lease]) -> None:
        """Leases whose leftovers could not be given back: the next sweep returns them."""
        self._ended.extend(leases)

    def sweep(self, *, everything: bool = False) -> list[Lease]:
        """Remove and return the leases that ended (expired or replaced; all of them when
        `everything`) with something left to give back; forget which rule sets were busy."""
        now = time.monotonic()
        ended, self._ended = self._ended, []
        for rules, lease in list(self._leases.items()):
            if everything or lease.expires_at <= now:
                ended.append(self._leases.pop(rules))
        self._recent.clear()
        return [lease for lease in ended if lease.unused]
