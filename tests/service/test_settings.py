"""The service's settings check names against the registries they select from."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from kvlink_rag.runtime import policies
from kvlink_rag.runtime.admission import FifoPolicy
from service.settings import ServiceSettings


def test_an_unregistered_admission_policy_is_refused_naming_the_registered_ones():
    with pytest.raises(ValidationError) as err:
        ServiceSettings(admission_policy="lottery")
    message = str(err.value)
    assert "unknown admission policy 'lottery'" in message
    assert all(name in message for name in policies.POLICIES)


def test_a_policy_registered_in_policies_is_accepted_by_the_setting(monkeypatch):
    monkeypatch.setitem(policies.POLICIES, "lifo", FifoPolicy)
    assert ServiceSettings(admission_policy="lifo").admission_policy == "lifo"
    assert isinstance(policies.make_policy("lifo"), FifoPolicy)


def test_the_admission_policy_default_is_buckets(monkeypatch):
    monkeypatch.delenv("KVLINK_RAG_ADMISSION_POLICY", raising=False)
    assert ServiceSettings().admission_policy == "buckets"
