"""Keys for the people a testbed run speaks for (reviewers, operators).

A game day, mission or demo publishes revocations, policy changes and
dispositions in the names its scripts give ("gameday", "ops-oncall"); the
ledger believes such a record only when the named person's key signs it
(:mod:`ledger.authn`). The testbed plays those people, so it makes each one a
key on first use, as an operator would with ``ledger operator add``.
"""

from __future__ import annotations

from ledger.authn import ROLE_OPERATOR, SigningKey
from ledger.credentials import add_person, person_key, person_key_path
from ledger.settings import LedgerSettings
from ledger.signing import ReviewerKey, load_trusted_roles
from producers.publisher import LedgerPublisher


def can_sign(
    publisher: LedgerPublisher, settings: LedgerSettings, name: str, role: str = ROLE_OPERATOR
) -> None:
    """Let ``publisher`` sign records that name ``name``, making a key if there is none.

    An existing key of that name (under either role) is used as it is; else a
    new one is made and trusted under ``role``.

    Raises:
        LedgerError: the trusted-keys file is unreadable.
    """
    trusted = load_trusted_roles(settings.trusted_keys_path())
    if name in trusted:
        held_role = trusted[name][0]
        if person_key_path(settings, held_role, name).exists():
            publisher.credentials.add(person_key(settings, held_role, name))
            return
    key, _ = add_person(settings, role, name)
    publisher.credentials.add(SigningKey(key.key_id, key.private, role))


def reviewer(publisher: LedgerPublisher, key: ReviewerKey) -> None:
    """Let ``publisher`` sign approvals with an in-memory reviewer key."""
    publisher.credentials.add(key)
