"""The service's settings (serve/settings.py, pydantic-settings): the command's options over
--setting over ATTNBASE_SERVE_<NAME> over the defaults; a bad value is one line naming where it
came from."""

from pathlib import Path

import pytest

from attnbase.errors import AttnbaseError
from attnbase.serve.settings import Settings, load_settings


def test_a_bad_setting_value_stops_attnbase_serve_in_one_line(cli, tmp_path):
    code, out, err = cli("serve", "--db", tmp_path, "--setting", "sql_memory_mb=lots")
    assert code == 2 and err.strip().splitlines() == [
        "error: --setting sql_memory_mb='lots': expected a int"], err


def test_a_bad_environment_value_names_the_variable(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNBASE_SERVE_KEEP_ALIVE_S", "soon")
    code, out, err = cli("serve", "--db", tmp_path)
    assert code == 2 and "ATTNBASE_SERVE_KEEP_ALIVE_S='soon': expected a float" in err
    assert len(err.strip().splitlines()) == 1


def test_options_over_settings_over_the_environment_over_defaults(monkeypatch):
    monkeypatch.setenv("ATTNBASE_SERVE_SQL_MEMORY_MB", "300")
    monkeypatch.setenv("ATTNBASE_SERVE_PORT", "9000")
    monkeypatch.setenv("ATTNBASE_SERVE_WORKERS", "3")
    s = load_settings(Path("d"), {"port": 9100, "workers": None},
                      ["sql_memory_mb=400", "max_json_bytes=2000"])
    assert (s.port, s.sql_memory_mb, s.max_json_bytes, s.workers) == (9100, 400, 2000, 3)
    assert s.sql_threads == Settings.default("sql_threads") == 8
    with pytest.raises(AttnbaseError, match=r"--setting 'no_such=1': use NAME=VALUE"):
        load_settings(Path("d"), {}, ["no_such=1"])
    with pytest.raises(AttnbaseError, match=r"^--port 'x': expected a int$"):
        load_settings(Path("d"), {"port": "x"}, [])
