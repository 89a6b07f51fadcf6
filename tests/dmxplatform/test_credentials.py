from dmxplatform import credentials


def test_issue_stores_only_a_hash_and_shows_the_secret_once():
    issued = credentials.issue("sk-dmx-")
    assert issued.plaintext.startswith(f"sk-dmx-{issued.credential_id}_")
    secret = credentials.split(issued.plaintext, "sk-dmx-")[1]
    assert secret not in issued.secret_hash
    assert len(issued.secret_hash) == 64
    assert credentials.secret_matches(secret, issued.secret_hash)
    assert not credentials.secret_matches(secret + "x", issued.secret_hash)


def test_two_credentials_differ():
    a, b = credentials.issue("sk-dmx-"), credentials.issue("sk-dmx-")
    assert a.credential_id != b.credential_id and a.plaintext != b.plaintext


def test_split():
    issued = credentials.issue("sk-dmx-")
    assert credentials.split(issued.plaintext, "sk-dmx-") == (
        issued.credential_id,
        issued.plaintext.split("_", 1)[1],
    )
    for bad in [
        "",
        "sk-dmx-",
        "sk-dmx-short_x",
        "sk-dmx-abcdefgh_",
        "sk-dmx-abcdefgh",
        "pk-abcdefgh_x",
    ]:
        assert credentials.split(bad, "sk-dmx-") is None


def test_hash_depends_on_the_pepper(settings):
    issued = credentials.issue("sk-dmx-")
    secret = credentials.split(issued.plaintext, "sk-dmx-")[1]
    settings.DMX_KEY_PEPPER = "another-pepper"
    assert not credentials.secret_matches(secret, issued.secret_hash)
