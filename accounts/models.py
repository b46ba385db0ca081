"""Accounts: users with a tier and a residency region; organisations with memberships."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.models import AbstractUser
from django.db import models


def default_region() -> str:
    """The region new users live in (``settings.CHAT_DEFAULT_REGION``)."""
    return settings.CHAT_DEFAULT_REGION


class Tier(models.TextChoices):
    FREE = "free", "Free"
    PAID = "paid", "Paid"
    ENTERPRISE = "enterprise", "Enterprise"


class User(AbstractUser):
    """A person who chats. ``tier`` picks limits and model pools; ``region`` is where their
    conversations are stored (data residency)."""

    tier = models.CharField(max_length=16, choices=Tier.choices, default=Tier.FREE)
    region = models.CharField(max_length=32, default=default_region)


class Organisation(models.Model):
    """A workspace that users belong to through :class:`Membership`."""

    name = models.CharField(max_length=200)
    slug = models.SlugField(unique=True)
    tier = models.CharField(max_length=16, choices=Tier.choices, default=Tier.ENTERPRISE)
    region = models.CharField(max_length=32, default=default_region)
    created_at = models.DateTimeField(auto_now_add=True)
    members = models.ManyToManyField(
        settings.AUTH_USER_MODEL, through="Membership", related_name="organisations"
    )

    def __str__(self) -> str:
        return self.name


class Membership(models.Model):
    """A user's role in an organisation."""

    class Role(models.TextChoices):
        OWNER = "owner", "Owner"
        ADMIN = "admin", "Admin"
        MEMBER = "member", "Member"

    organisation = models.ForeignKey(Organisation, on_delete=models.CASCADE)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    joined_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["organisation", "user"], name="one_membership_per_org")
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.organisation} ({self.role})"
