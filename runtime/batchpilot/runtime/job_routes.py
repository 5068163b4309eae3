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

An id: `<random>.<address>.<signature>` — 128 random bits (hex), the address in URL-safe base64,
and the first 128 bits of HMAC-SHA256 over the two (hex). Pure: hmac, base64 and secrets.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from dataclasses import dataclass

MAX_ID_LENGTH = 256
"""Longer ids are nobody's: not parsed, not looked up."""
_KEY_LABEL = b"batchpilot async job route v1"
_SIGNATURE_HEX = 32


def address_of(host: str, port: int) -> str:
    """`host:port` as a URL's authority: an IPv6 address in brackets."""
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


@dataclass(frozen=True, slots=True)
class JobRoutes:
    """The ids of one replica (`address`) among those sharing `key`."""

    address: str
    key: bytes

    @classmethod
    def from_token(cls, token: str, *, host: str, port: int) -> JobRoutes:
        """The routes of the replica at `host`:`port`, keyed by the service's admin token (a key
        for this use alone is derived from it: an id's signature says nothing of the token)."""
        key = hmac.new(token.encode(), _KEY_LABEL, hashlib.sha256).digest()
        return cls(address=address_of(host, port), key=key)

    def _sign(self, random_part: str, address_part: str) -> str:
        text = f"{random_part}.{address_part}".encode()
        return hmac.new(self.key, text, hashlib.sha256).hexdigest()[:_SIGNATURE_HEX]

    def new_id(self) -> str:
        """A fresh id naming this replica."""
        random_part = secrets.token_hex(16)
        address_part = base64.urlsafe_b64encode(self.address.encode()).rstrip(b"=").decode()
        return f"{random_part}.{address_part}.{self._sign(random_part, address_part)}"

    def elsewhere(self, job_id: str) -> str | None:
        """The address of the replica holding `job_id` when it is another replica's, signed by a
        replica of this service; None when the id is this replica's, carries no address, or is
        not signed with the shared key (all of them looked up here, where they are unknown)."""
        if len(job_id) > MAX_ID_LENGTH or job_id.count(".") != 2:
            return None
        random_part, address_part, signature = job_id.split(".")
        expected = self._sign(random_part, address_part).encode()
        if not hmac.compare_digest(signature.encode(), expected):
            return None
        try:
            address = base64.urlsafe_b64decode(address_part + "=" * (-len(address_part) % 4))
            text = address.decode()
        except (binascii.Error, ValueError):  # UnicodeDecodeError is a ValueError
            return None
        return None if text == self.address else text
