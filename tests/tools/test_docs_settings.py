"""The documentation site's settings page: every variable the platform reads is on it."""

from __future__ import annotations

from pathlib import Path

from tools.docs.settings import documented, settings_markdown, settings_read, settings_table


def test_every_setting_read_is_documented() -> None:
    variables, problems = settings_table()
    assert problems == []
    page = settings_markdown()
    for name in settings_read():
        assert f"| `{name}` |" in page, f"{name} is read but not on the settings page"
    assert len(variables) > 100


def test_the_scan_finds_every_way_a_setting_is_read(tmp_path: Path) -> None:
    settings = tmp_path / "dmxplatform" / "settings"
    settings.mkdir(parents=True)
    (settings / "base.py").write_text(
        "import os\n"
        "A = env_int('DMX_A', 1, minimum=0)\n"
        "B = secret_from_env(\n    'DMX_B', 'dev'\n)\n"
        "C = os.environ.get('DMX_C')\n"
        "D = os.environ['DMX_D']\n"
        "os.environ['DMX_WRITTEN'] = 'x'\n"
        "os.environ.setdefault('DMX_DEFAULTED', 'x')\n"
        "E = env_str(NAME_IN_A_VARIABLE)\n"
    )
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "dev.sh").write_text('echo "${DMX_S:-1}" $DMX_T\n')
    (tmp_path / ".env.example").write_text(
        "# --- Core ---\n"
        "# A and B share a line.\nDMX_A=1\nDMX_B=\n"
        "# C's.\nDMX_C=\n\n"
        "DMX_D=\n"
        "# Read by a script.\nDMX_S=1\n"
        "# Read by nothing.\nDMX_GONE=1\n"
    )
    assert settings_read(tmp_path) == {
        "DMX_A": ["dmxplatform/settings/base.py"],
        "DMX_B": ["dmxplatform/settings/base.py"],
        "DMX_C": ["dmxplatform/settings/base.py"],
        "DMX_D": ["dmxplatform/settings/base.py"],
    }
    assert documented(tmp_path)["DMX_B"].meaning == "A and B share a line."
    _, problems = settings_table(tmp_path)
    assert problems == [
        "DMX_D is read by dmxplatform/settings/base.py but not documented in .env.example",
        "DMX_GONE is documented in .env.example but nothing reads it",
    ]
