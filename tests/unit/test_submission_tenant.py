"""Whose job a submission is: a tenant's token decides (a spec naming no tenant is its own,
so example files need no `tenant:`); the admin token acts for no tenant and must name one."""

from __future__ import annotations

import pytest

from rota.common.auth import ADMIN, TENANT, Identity
from rota.core.errors import InvalidArgument


@pytest.mark.parametrize(("identity", "named", "tenant"), [
    (Identity(TENANT, "nlp"), "", "nlp"),      # no tenant in the file: the token's
    (Identity(TENANT, "nlp"), "nlp", "nlp"),   # its own, named
    (Identity(ADMIN), "nlp", "nlp"),           # the admin names it
])
def test_the_tenant_of_a_submission(identity: Identity, named: str, tenant: str) -> None:
    assert identity.tenant_for(named) == tenant


def test_a_tenant_token_cannot_submit_for_another_tenant() -> None:
    with pytest.raises(InvalidArgument) as refused:
        Identity(TENANT, "nlp").tenant_for("vision", "ask")
    assert refused.value.field == "tenant" and "a token of tenant 'nlp' cannot ask for 'vision'" in str(refused.value)


def test_the_admin_token_without_a_tenant_is_told_to_name_one() -> None:
    with pytest.raises(InvalidArgument) as refused:
        Identity(ADMIN).tenant_for("")
    assert refused.value.field == "tenant"
    assert "required with the admin token" in str(refused.value) and "--tenant" in str(refused.value)
