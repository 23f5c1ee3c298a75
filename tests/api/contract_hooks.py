"""schemathesis hooks of the contract test (``SCHEMATHESIS_HOOKS=contract_hooks``, ``tests/api`` on the path).

``positive_data_within_rules`` is schemathesis' ``positive_data_acceptance`` (a schema-valid request must
not be refused) except for the refusals the server names as rules no JSON schema can express
(:data:`api.errors.RULES_BEYOND_SCHEMA`: the conversation's order, token counts, a bound set by another
field, a response_format schema the grammar compiler refuses): those answer 400/413/422 with their own error code. Every other refusal of schema-valid data fails.
"""

from __future__ import annotations

import json

import schemathesis
from schemathesis.openapi.checks import RejectedPositiveData
from schemathesis.specs.openapi.checks import positive_data_acceptance

from api.errors import RULES_BEYOND_SCHEMA


def error_code(response) -> str | None:
    """The ``error.code`` of a JSON error answer, else None."""
    try:
        body = json.loads(response.content)
    except (ValueError, TypeError):
        return None
    error = body.get("error") if isinstance(body, dict) else None
    return error.get("code") if isinstance(error, dict) else None


@schemathesis.check
def positive_data_within_rules(ctx, response, case):
    """``positive_data_acceptance``, less refusals by a rule in :data:`RULES_BEYOND_SCHEMA`."""
    try:
        return positive_data_acceptance(ctx, response, case)
    except RejectedPositiveData:
        if response.status_code in (400, 413, 422) and error_code(response) in RULES_BEYOND_SCHEMA:
            return None
        raise


def integral_numbers_as_integers(value):
    """``value`` with every float that is a whole number written as an integer (``2.0`` -> ``2``), nested."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
        return int(value)
    if isinstance(value, list):
        return [integral_numbers_as_integers(v) for v in value]
    if isinstance(value, dict):
        return {k: integral_numbers_as_integers(v) for k, v in value.items()}
    return value


@schemathesis.hook
def map_body(ctx, body):
    """JSON Schema counts ``2.0`` as an integer; the server, as OpenAI's API, refuses a decimal point in an
    integer field (strict types). The same number is sent as ``2``, which leaves every case as valid or as
    invalid as generated."""
    return integral_numbers_as_integers(body)
