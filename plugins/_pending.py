"""Shared wording for families a platform has no kernel of its own for yet (shown by ``dsa-runtime plugins``)."""

from __future__ import annotations

from dsa_runtime.families import FAMILIES


def pending_family_notes(platform: str, fallback: str, planned: dict[str, str]) -> dict[str, str]:
    """family -> why it is unavailable on ``platform``: the kernel planned for it and what runs meanwhile."""
    return {
        family: f"no {platform} kernel yet (planned: {planned.get(family, 'native kernel')}); {fallback}"
        for family in FAMILIES
    }
