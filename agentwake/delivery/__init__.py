"""Delivery loops (one per subscription) and the choice of delivery mode."""

from agentwake.delivery.poll import PollLoop
from agentwake.delivery.select import CLIENT_MODES, SubscriptionPlan, choose_mode, plan_subscription

__all__ = ["CLIENT_MODES", "PollLoop", "SubscriptionPlan", "choose_mode", "plan_subscription"]
