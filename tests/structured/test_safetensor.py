"""``save_tensor_to_safetensor`` / ``load_tensor_from_safetensor`` with
upstream's call forms; files interoperate with the ``safetensors`` package."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.tensor_dtypes import tensor_dtypes

st = pytest.importorskip("safetensors.torch")

DTYPES = tensor_dtypes()


def sample(dtype: torch.dtype) -> torch.Tensor:
    return (torch.arange(24, dtype=torch.float32).reshape(2, 3, 4) % 5).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_save_then_load_round_trips_and_interoperates(
    store: Any, key: Any, tmp_path: Path, dtype: torch.dtype
) -> None:
    k = key("t")
    t = sample(dtype)
    assert store.put_tensor(k, t) == 0
    path = str(tmp_path / "t.safetensors")
    assert store.save_tensor_to_safetensor(k, path) == 0
    theirs = st.load_file(path)
    assert list(theirs) == [k] and torch.equal(theirs[k].view(torch.uint8), t.view(torch.uint8))
    k2 = key("t2")
    loaded = store.load_tensor_from_safetensor(k2, path)
    assert loaded.dtype == dtype and torch.equal(loaded.view(torch.uint8), t.view(torch.uint8))
    assert torch.equal(store.get_tensor(k2).view(torch.uint8), t.view(torch.uint8))


def test_files_written_by_safetensors_load(store: Any, key: Any, tmp_path: Path) -> None:
    path = str(tmp_path / "theirs.safetensors")
    a, b = torch.randn(3, 5), torch.arange(7, dtype=torch.int64)
    st.save_file({"zeta": a, "alpha": b}, path)
    k = key("zeta")
    got = store.load_tensor_from_safetensor(key=k, file_name=path)
    assert torch.equal(got, b)  # key absent from the file: the first sorted entry
    assert torch.equal(store.get_tensor(k), b)
    st.save_file({k + "x": a}, path)
    assert torch.equal(store.load_tensor_from_safetensor(k + "x", path), a)
    # key=None: the file name is the store key.
    got = store.load_tensor_from_safetensor(file_name=path)
    assert torch.equal(got, a) and torch.equal(store.get_tensor(path), a)
    store.remove(path, force=True)


def test_default_file_name_is_the_key(
    store: Any, key: Any, tmp_path: Path, monkeypatch: Any
) -> None:
    monkeypatch.chdir(tmp_path)
    k = "plain-key-" + str(os.getpid())
    assert store.put_tensor(k, torch.tensor([5.0, 6.0, 7.0])) == 0
    assert store.save_tensor_to_safetensor(k) == 0
    assert (tmp_path / k).exists()
    assert torch.equal(st.load_file(k)[k], torch.tensor([5.0, 6.0, 7.0]))
    store.remove(k, force=True)


def test_bad_files_and_missing_keys(store: Any, key: Any, tmp_path: Path, log: Any) -> None:
    assert store.save_tensor_to_safetensor(key("missing"), str(tmp_path / "m")) == -1100
    assert not (tmp_path / "m").exists()
    assert store.load_tensor_from_safetensor(key("x"), str(tmp_path / "nope.safetensors")) is None
    good = tmp_path / "good.safetensors"
    st.save_file({"w": torch.randn(64, 64)}, str(good))
    data = good.read_bytes()
    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes(data[:-100])
    corrupt = tmp_path / "corrupt.safetensors"
    corrupt.write_bytes(data[:8] + b"{not json" + data[17:])
    for bad in (truncated, corrupt):
        log.clear()
        k = key(bad.name)
        assert store.load_tensor_from_safetensor(k, str(bad)) is None
        assert store.is_exist(k) == 0
        msgs = [r.getMessage() for r in log.records if r.name == "mooncake.store"]
        assert any(str(bad) in m and "safetensors" in m for m in msgs), msgs
    with pytest.raises(TypeError, match="file_name"):
        store.load_tensor_from_safetensor("only-a-key")
