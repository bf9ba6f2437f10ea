"""ENGINE=auto|funes|embedded: funes where its binary resolves, the embedded engine elsewhere."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import FakeFunes, make_server

from recall.files.engines.factory import make_engine
from recall.settings import ConfigError, Settings


def settings(**values: object) -> Settings:
    return Settings(ingest_key="k" * 16, auth_tokens_file=Path("unused.json"), **values)


def test_auto_takes_funes_when_funes_bin_is_an_executable(fake_funes: FakeFunes) -> None:
    assert make_engine(settings(engine="auto", funes_bin=str(fake_funes.path))).name == "funes"


def test_auto_falls_back_to_the_embedded_engine_without_funes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no funes on PATH either
    assert make_engine(settings(engine="auto", funes_bin=None)).name == "embedded"
    assert make_engine(settings(engine="auto", funes_bin="/no/such/funes")).name == "embedded"


def test_a_file_that_is_not_executable_is_not_funes(tmp_path: Path) -> None:
    plain = tmp_path / "funes"
    plain.write_text("not a program")
    assert make_engine(settings(engine="auto", funes_bin=str(plain))).name == "embedded"


def test_embedded_is_used_when_asked_even_where_funes_exists(fake_funes: FakeFunes) -> None:
    chosen = make_engine(settings(engine="embedded", funes_bin=str(fake_funes.path)))
    assert chosen.name == "embedded"


def test_engine_funes_without_the_binary_is_a_startup_error() -> None:
    with pytest.raises(ConfigError, match="ENGINE=funes"):
        make_engine(settings(engine="funes", funes_bin="/no/such/funes"))


def test_a_missing_embedding_model_is_a_clear_startup_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="embedding model"):
        make_engine(settings(engine="embedded", embed_model_dir=tmp_path / "no-model"))


def test_the_server_reports_and_logs_its_engine(tmp_path: Path) -> None:
    with make_server(tmp_path, ENGINE="auto", FUNES_BIN="/no/such/funes").start() as server:
        assert server.health() == {
            "status": "ok",
            "store": "files",
            "engine": "embedded",
            "indexing": 0,
        }
        assert "serving with the embedded engine" in server.log()
