import pytest

from apps.keys.signing import (
    WINDOW_SECONDS,
    signature_for,
    signature_verify,
    signing_secret_decrypt,
    signing_secret_issue,
)
from dmxplatform.errors import AuthenticationError

SECRET = b"dmxsig_test"
BODY = b'{"model": "m"}'


def verify(**overrides):
    args = dict(
        secret=SECRET,
        timestamp=b"1000000",
        signature=signature_for(SECRET, "1000000", BODY).encode(),
        body=BODY,
        now=1_000_010,
    )
    args.update(overrides)
    return signature_verify(**args)


def test_a_good_signature_returns_itself_as_the_replay_nonce():
    assert verify() == signature_for(SECRET, "1000000", BODY)


@pytest.mark.parametrize(
    ("overrides", "code"),
    [
        ({"timestamp": None}, "signature_required"),
        ({"signature": None}, "signature_required"),
        ({"timestamp": b"yesterday"}, "signature_invalid"),
        ({"body": b'{"model": "other"}'}, "signature_invalid"),
        ({"secret": b"another"}, "signature_invalid"),
        ({"secret": None}, "signature_invalid"),
        ({"now": 1_000_000 + WINDOW_SECONDS + 1}, "signature_expired"),
        ({"now": 1_000_000 - WINDOW_SECONDS - 1}, "signature_expired"),
    ],
)
def test_refusals(overrides, code):
    with pytest.raises(AuthenticationError) as error:
        verify(**overrides)
    assert error.value.code == code


def test_secret_is_encrypted_at_rest_and_bound_to_the_pepper(settings):
    secret, encrypted = signing_secret_issue()
    assert secret.startswith("dmxsig_") and secret not in encrypted
    assert signing_secret_decrypt(encrypted) == secret.encode()
    settings.DMX_KEY_PEPPER = "rotated"
    assert signing_secret_decrypt(encrypted) is None
