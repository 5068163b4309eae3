"""Async job ids that name the replica holding the job, so that every replica can answer for it.

A Service spreads a client's requests over the replicas, so the `GET` for a result seldom reaches
the replica that took the job, and results live in that replica's memory. A replica that knows
how its peers reach it (`address`: the pod IP and the inference port) writes that address into the
ids it hands out, signed with a key every replica of the service shares and no caller holds
(derived from the service's admin token, which each replica mounts); a replica asked for a job
whose id names another replica passes the request on to it (`job_relay`).

The signature is what makes passing requests on safe: an id whose address a caller wrote gets the
answer of an unknown id, never a request from inside the cluster to an address of the caller's
choosing. Ids without an address — a replica with no shared key or no advertised host, as one
started by hand — are served where they arrive, as before.

An id: `<random>.<address>.<lapses>.<signature>` — 128 random bits (hex), the address in URL-safe
base64, the time (Unix seconds) after which no job of that id can be held any more (`lifetime_s`
after it was made: the longest a job pends, its result's TTL and a drain's hold), and the first
128 bits of HMAC-SHA256 over the three (hex); ids made before the time was written have none
(`<random>.<address>.<signature>`). A holder deleted with its pod (a scale-down, a rollout, an
eviction) takes no connection: its address answers nothing, where a restarted one refuses. Until
the id lapses, that is a holder that may come back (504, retry); after it, one whose jobs are
gone wherever it is (404, as an unknown id) — before, its clients were answered 504 "retry" for
ever. The clock is the wall clock, read by every replica alike (`now` arguments).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from batchpilot.api.batching import ASYNC_DEADLINE_MAX_S

MAX_ID_LENGTH = 256
"""Longer ids are nobody's: not parsed, not looked up."""
_KEY_LABEL = b"batchpilot async job route v1"
_SIGNATURE_HEX = 32
SIGNED_RELAY = "r"
"""The part of an id that says its holder takes relayed requests on a signed credential and signs
its answers (`JobRoutes.signed_relay`)."""
RELAY_CREDENTIAL_S = 300.0
"""How long a relay credential is good for: the passing on takes seconds; the rest is the pods'
clocks, which may differ."""
PENDING_CAP_S = ASYNC_DEADLINE_MAX_S
"""The longest an async job is taken to pend, for its id's lapse (`lifetime`): a job waits in the
queue at most its deadline, and a queue of ten minutes is no queue. One pending longer is still
served by its holder; only a fetch whose holder does not answer is told its job is gone."""


def lifetime(*, result_ttl_s: float, drain_hold_s: float) -> float:
    """How long after its id was made a job can still be held: it pends (`PENDING_CAP_S`), its
    result is kept for `result_ttl_s`, and a draining holder keeps serving fetches for
    `drain_hold_s`."""
    return PENDING_CAP_S + result_ttl_s + drain_hold_s


def address_of(host: str, port: int) -> str:
    """`host:port` as a URL's authority: an IPv6 address in brackets."""
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


@dataclass(frozen=True, slots=True)
class JobRoutes:
    """The ids of one replica (`address`) among those sharing `key`."""

    address: str
    key: bytes
    lifetime_s: float | None = None
    """How long after it is made an id's job can still be held (`lifetime`); None: ids carry no
    lapse."""
    clock: Callable[[], float] = time.time

    @classmethod
    def from_token(
        cls, token: str, *, host: str, port: int, lifetime_s: float | None = None
    ) -> JobRoutes:
        """The routes of the replica at `host`:`port`, keyed by the service's admin token (a key
        for this use alone is derived from it: an id's signature says nothing of the token)."""
        key = hmac.new(token.encode(), _KEY_LABEL, hashlib.sha256).digest()
        return cls(address=address_of(host, port), key=key, lifetime_s=lifetime_s)

    def _sign(self, *parts: str) -> str:
        text = ".".join(parts).encode()
        return hmac.new(self.key, text, hashlib.sha256).hexdigest()[:_SIGNATURE_HEX]

    def new_id(self) -> str:
        """A fresh id naming this replica (and, with a lifetime, when its job lapses, and that
        its holder takes relayed requests signed and signs its answers: `SIGNED_RELAY`)."""
        random_part = secrets.token_hex(16)
        address_part = base64.urlsafe_b64encode(self.address.encode()).rstrip(b"=").decode()
        if self.lifetime_s is None:
            return f"{random_part}.{address_part}.{self._sign(random_part, address_part)}"
        lapses = str(int(self.clock() + self.lifetime_s))
        signature = self._sign(random_part, address_part, lapses, SIGNED_RELAY)
        return f"{random_part}.{address_part}.{lapses}.{SIGNED_RELAY}.{signature}"

    def signed_relay(self, job_id: str) -> bool:
        """Whether `job_id`'s holder takes a relayed request on a signed credential rather than
        the caller's API key, and signs its answer (`SIGNED_RELAY`): ids of older replicas do
        neither."""
        parts = self._signed(job_id)
        return parts is not None and len(parts) == 4 and parts[3] == SIGNED_RELAY

    def relay_credential(self, method: str, job_id: str, owner: str | None) -> str:
        """What a replica that passes on `method` of `job_id` for the caller whose key id it
        checked (`owner`; None without API keys) sends in the caller's key's place: the key id,
        signed with the service's shared key, good for `RELAY_CREDENTIAL_S`. A pod address
        reused by another listener gets no key of a caller's, only this, good for that job."""
        expires = str(int(self.clock() + RELAY_CREDENTIAL_S))
        who = owner or ""
        return f"{who}.{expires}.{self._sign('relay', method, job_id, who, expires)}"

    def relayed_for(self, credential: str, method: str, job_id: str) -> str | None:
        """The key id a relay credential names (`relay_credential`; "" without API keys), or
        None where it is not one of this service's, not for this request, or expired."""
        if len(credential) > MAX_ID_LENGTH or credential.count(".") < 2:
            return None
        who, expires, signature = credential.rsplit(".", 2)
        expected = self._sign("relay", method, job_id, who, expires).encode()
        if not hmac.compare_digest(signature.encode(), expected):
            return None
        if not expires.isdigit() or self.clock() > int(expires):
            return None
        return who

    def answer_signature(self, job_id: str, status: int, body: bytes) -> str:
        """The holder's signature of its answer to a relayed request: what tells the replica
        that passed it on the answer came from a replica of this service, not from whatever
        listens at a dead holder's address now."""
        digest = hashlib.sha256(body).hexdigest()
        return self._sign("answer", job_id, str(status), digest)

    def _signed(self, job_id: str) -> list[str] | None:
        """The parts of `job_id` but its signature, where a replica of this service signed it."""
        if len(job_id) > MAX_ID_LENGTH or job_id.count(".") not in (2, 3, 4):
            return None
        *parts, signature = job_id.split(".")
        expected = self._sign(*parts).encode()
        if not hmac.compare_digest(signature.encode(), expected):
            return None
        return parts

    def lapsed(self, job_id: str) -> bool:
        """Whether `job_id`, signed by a replica of this service, names a job no replica can
        hold any more (its lapse has passed)."""
        parts = self._signed(job_id)
        if parts is None or len(parts) < 3 or not parts[2].isdigit():
            return False
        return self.clock() > int(parts[2])

    def elsewhere(self, job_id: str) -> str | None:
        """The address of the replica holding `job_id` when it is another replica's, signed by a
        replica of this service; None when the id is this replica's, carries no address, or is
        not signed with the shared key (all of them looked up here, where they are unknown)."""
        parts = self._signed(job_id)
        if parts is None:
            return None
        address_part = parts[1]
        try:
            address = base64.urlsafe_b64decode(address_part + "=" * (-len(address_part) % 4))
            text = address.decode()
        except (binascii.Error, ValueError):  # UnicodeDecodeError is a ValueError
            return None
        return None if text == self.address else text
