"""Which delivery mode a subscription uses, and whether it can run at all. Pure functions."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from agentwake import protocol
from agentwake.config import SubscriptionConfig
from agentwake.errors import ConfigError
from agentwake.schemas import argument_errors

# Modes this client implements; webhook only with a [webhook] section (a receiver to deliver to).
CLIENT_MODES: Final[tuple[protocol.DeliveryMode, ...]] = ("poll", "push", "webhook")
WITHOUT_RECEIVER: Final[tuple[protocol.DeliveryMode, ...]] = ("poll", "push")
PREFERENCE: Final[tuple[protocol.DeliveryMode, ...]] = ("webhook", "push", "poll")


@dataclass(frozen=True, slots=True)
class SubscriptionPlan:
    subscription: SubscriptionConfig
    mode: protocol.DeliveryMode
    descriptor: protocol.EventDescriptor


def choose_mode(
    subscription: SubscriptionConfig,
    offered: list[str],
    *,
    receiver: bool = False,
) -> protocol.DeliveryMode:
    """The spec's Delivery Mode Selection: intersect, then prefer webhook, push, poll.

    Webhook is usable only with a receiver (a [webhook] section), as the spec's
    "Webhook if the client has WebhookConfig set".
    """
    name = subscription.name
    client_modes = CLIENT_MODES if receiver else WITHOUT_RECEIVER
    if subscription.delivery != "auto":
        forced = subscription.delivery
        if forced not in client_modes:
            raise ConfigError(
                f"subscription {name!r}: delivery = {forced!r} needs a [webhook] section with a public_url"
                ' the server can reach; add one, or set delivery = "auto"'
            )
        if forced not in offered:
            raise ConfigError(
                f"subscription {name!r}: event {subscription.event!r} does not offer {forced!r} delivery "
                f'(it offers {", ".join(offered) or "nothing"}); set delivery = "auto" or one of those'
            )
        return forced
    for mode in PREFERENCE:
        if mode in client_modes and mode in offered:
            return mode
    raise ConfigError(
        f"subscription {name!r}: no compatible delivery mode: event {subscription.event!r} offers "
        f"{', '.join(offered) or 'nothing'}, agentwake supports {', '.join(client_modes)}"
    )


def plan_subscription(
    subscription: SubscriptionConfig,
    descriptors: dict[str, protocol.EventDescriptor],
    *,
    receiver: bool = False,
) -> SubscriptionPlan:
    """Check a configured subscription against the server's events/list; one clear error if it cannot run."""
    name = subscription.name
    descriptor = descriptors.get(subscription.event)
    if descriptor is None:
        offered = ", ".join(sorted(descriptors)) or "no events at all"
        raise ConfigError(
            f"subscription {name!r}: server {subscription.server!r} has no event {subscription.event!r} "
            f"(it offers: {offered}); fix 'event'"
        )
    errors = argument_errors(descriptor.input_schema, subscription.arguments)
    if errors:
        raise ConfigError(
            f"subscription {name!r}: arguments do not match the inputSchema of {subscription.event!r}: "
            + "; ".join(errors)
            + "; fix 'arguments' (see 'agentwake events')"
        )
    return SubscriptionPlan(
        subscription, choose_mode(subscription, descriptor.delivery, receiver=receiver), descriptor
    )
