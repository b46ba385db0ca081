"""Number formats for the usage and settings pages: ``{% load usage_format %}``."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

from django import template

register = template.Library()


@register.filter
def thousands(value) -> str:
    """12345 -> "12,345"; None -> "unlimited" (a limit that is not set)."""
    if value is None:
        return "unlimited"
    try:
        return f"{int(value):,}"
    except (TypeError, ValueError):
        return str(value)


@register.filter
def usd(value) -> str:
    """A USD amount to the ledger's precision without trailing zeros, at least cents:
    Decimal("0.00157500") -> "$0.001575", 4.5 -> "$4.50", 1234.5 -> "$1,234.50", 0 -> "$0.00"."""
    try:
        amount = Decimal(str(value))
    except (InvalidOperation, TypeError, ValueError):
        return str(value)
    text = f"{amount:,.8f}".rstrip("0")
    whole, _, frac = text.partition(".")
    sign = ""
    if whole.startswith("-"):
        sign, whole = "-", whole[1:]
    return f"{sign}${whole}.{frac.ljust(2, '0')}"
