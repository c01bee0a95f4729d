"""The SSRF guard of webhook delivery: which addresses a callback may reach, checked at connect time.

Every delivery and verification POST resolves the callback's host anew, drops
every address that is not globally reachable (the IANA IPv4 and IPv6
Special-Purpose Address Registries) unless an operator allowlisted it, and
hands aiohttp only the addresses that passed, so the connection goes to
exactly an address that was checked while the Host header and TLS SNI stay the
hostname. A DNS answer that changes between subscribe and delivery (rebinding)
is caught because the check runs for every connection, not once.

``ipaddress.is_global`` is not enough on its own: Python 3.11 calls a few
non-global blocks global (``192.0.0.0/24``, the 2024 IPv6 registrations,
deprecated site-local and IPv4-compatible space) and every multicast address
global. ``EXTRA_NON_GLOBAL`` lists those; multicast is refused outright; and an
IPv6 address that embeds an IPv4 one (IPv4-mapped, 6to4, NAT64) is refused when
the embedded address would be.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Final

from aiohttp.abc import AbstractResolver, ResolveResult

logger = logging.getLogger(__name__)

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolve = Callable[[str], Awaitable[Sequence[str]]]
"""An injectable DNS lookup: hostname -> IP address strings (tests map names to loopback)."""

# Registry entries that Python 3.11's is_global reports as global although they are not
# globally reachable (or are deprecated space nobody should deliver to).
EXTRA_NON_GLOBAL: Final[tuple[IPNetwork, ...]] = tuple(
    ipaddress.ip_network(block)
    for block in (
        "192.0.0.0/24",  # IETF protocol assignments (RFC 6890)
        "192.88.99.0/24",  # deprecated 6to4 relay anycast (RFC 7526)
        "::/96",  # deprecated IPv4-compatible IPv6 (RFC 4291); covers :: and ::1 too
        "64:ff9b:1::/48",  # local-use IPv4/IPv6 translation (RFC 8215)
        "100:0:0:1::/64",  # dummy IPv6 prefix (RFC 9780)
        "3fff::/20",  # documentation (RFC 9637)
        "5f00::/16",  # segment routing SIDs (RFC 9602)
        "fec0::/10",  # deprecated site-local (RFC 3879)
    )
)
NAT64_PREFIX: Final = ipaddress.IPv6Network("64:ff9b::/96")
_NUMERIC_FLAGS: Final = socket.AI_NUMERICHOST | socket.AI_NUMERICSERV


class DestinationRefused(OSError):
    """A callback host with no address the guard lets us connect to. Never carries the addresses."""

    def __init__(self, host: str) -> None:
        super().__init__(f"{host} has no globally reachable address")
        self.host = host


def parse_networks(blocks: Iterable[str | IPNetwork]) -> tuple[IPNetwork, ...]:
    """CIDR blocks for ``allow_networks``; ValueError on a malformed one."""
    return tuple(
        block
        if isinstance(block, ipaddress.IPv4Network | ipaddress.IPv6Network)
        else ipaddress.ip_network(block)
        for block in blocks
    )


def _embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address in NAT64_PREFIX:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def is_public(address: IPAddress) -> bool:
    """Whether ``address`` is globally reachable per the IANA special-purpose registries."""
    if address.is_multicast or not address.is_global:
        return False
    if any(address in block for block in EXTRA_NON_GLOBAL if block.version == address.version):
        return False
    if isinstance(address, ipaddress.IPv6Address):
        embedded = _embedded_ipv4(address)
        if embedded is not None:
            return is_public(embedded)
    return True


class AddressPolicy:
    """Public addresses pass; so does anything inside an ``allow`` block, exactly as written."""

    def __init__(self, allow: Iterable[IPNetwork] = ()) -> None:
        self.allow = tuple(allow)

    def permits(self, address: IPAddress) -> bool:
        # An allowlisted IPv4 block does not cover its IPv4-mapped IPv6 spelling: list that too if wanted.
        if any(address in block for block in self.allow if block.version == address.version):
            return True
        return is_public(address)

    def permits_host(self, host: str) -> bool | None:
        """For an IP-literal host, whether it may be reached; None when ``host`` is a name."""
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return None
        return self.permits(address)


class GuardedResolver(AbstractResolver):
    """An aiohttp resolver that returns only the addresses ``policy`` permits (the SSRF guard).

    aiohttp does not consult a resolver for IP-literal hosts; the sender checks
    those itself with ``AddressPolicy.permits_host`` before connecting.
    """

    def __init__(self, policy: AddressPolicy, lookup: Resolve | None = None) -> None:
        self._policy = policy
        self._lookup = lookup

    async def _addresses(self, host: str, port: int, family: socket.AddressFamily) -> list[IPAddress]:
        if self._lookup is not None:
            found = list(await self._lookup(host))
        else:
            infos = await asyncio.get_running_loop().getaddrinfo(
                host, port, type=socket.SOCK_STREAM, family=family
            )
            found = [str(info[4][0]) for info in infos]
        addresses: list[IPAddress] = []
        for text in found:
            try:
                addresses.append(ipaddress.ip_address(text))
            except ValueError:  # a scoped or malformed answer: not something we connect to
                continue
        return addresses

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        addresses = await self._addresses(host, port, family)
        permitted = [address for address in addresses if self._policy.permits(address)]
        if not permitted:
            logger.warning("webhook host %s resolves to no permitted address; not connecting", host)
            raise DestinationRefused(host)
        return [
            ResolveResult(
                hostname=host,
                host=str(address),
                port=port,
                family=socket.AF_INET6 if address.version == 6 else socket.AF_INET,
                proto=0,
                flags=_NUMERIC_FLAGS,
            )
            for address in permitted
        ]

    async def close(self) -> None:
        return None
