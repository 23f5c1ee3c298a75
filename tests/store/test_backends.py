"""Backends opened by URL: the blob store behind its interface, and the store sharing one LMDB environment."""

from __future__ import annotations

import pytest

from store.settings import StoreSettings
from store.backends import open_blob_store
from store.blobs.blob_store import BlobStore
from store.factory import open_store
from store.blobs.lmdb import LmdbBlobStore


def test_lmdb_url_opens_the_lmdb_blob_store(tmp_path, make_kv, same_kv):
    blobs = open_blob_store(f"lmdb://{tmp_path / 'store'}", max_map_size=64 << 20)
    assert isinstance(blobs, LmdbBlobStore) and isinstance(blobs, BlobStore)
    kv = make_kv(seed=3)
    nbytes = blobs.put("doc", kv)
    same_kv(blobs.get("doc"), kv)
    assert "doc" in blobs and blobs.keys() == ["doc"] and blobs.meta("doc")["nbytes"] == nbytes
    assert {k: row["nbytes"] for k, row in blobs.entries().items()} == {"doc": nbytes}
    blobs.ping()
    assert blobs.used_bytes() == blobs.env.used_bytes > 0
    assert blobs.delete("doc") and "doc" not in blobs and blobs.entries() == {}
    blobs.close()


@pytest.mark.parametrize("url", ["s3://bucket/kv", "/plain/path", "lmdb://", ""])
def test_other_urls_are_refused_naming_the_supported_schemes(url):
    with pytest.raises(ValueError, match="supported: lmdb://PATH"):
        open_blob_store(url)


def test_store_shares_one_lmdb_environment(tmp_path):
    st = open_store(StoreSettings(home=tmp_path, store_max_bytes=64 << 20))
    assert st.texts.env is st.blobs.env and st.index.env is st.blobs.env
    assert st.catalog.blobs is st.blobs is st.cache.blobs


def test_the_local_store_defaults_to_lmdb_under_the_store_folder(tmp_path, monkeypatch):
    monkeypatch.delenv("KVLINK_RAG_LOCAL_STORE_URL", raising=False)
    settings = StoreSettings(home=tmp_path, store_max_bytes=64 << 20)
    assert settings.local_store_url is None and settings.local_store == f"lmdb://{tmp_path / 'store'}"
    st = open_store(settings)
    assert isinstance(st.blobs, LmdbBlobStore) and st.blobs.env.path == tmp_path / "store"


def test_the_local_store_url_is_opened_through_the_registry(tmp_path, monkeypatch):
    monkeypatch.setenv("KVLINK_RAG_LOCAL_STORE_URL", f"lmdb://{tmp_path / 'elsewhere'}")
    st = open_store(StoreSettings(home=tmp_path, store_max_bytes=64 << 20))
    assert isinstance(st.blobs, LmdbBlobStore) and st.blobs.env.path == tmp_path / "elsewhere"
    assert st.texts.env is st.blobs.env and st.index.env is st.blobs.env


@pytest.mark.parametrize("url", ["s3://bucket/kv", "redis+cluster://h:1", "/plain/path", "lmdb://"])
def test_a_local_store_url_of_an_unknown_scheme_is_refused(tmp_path, url):
    with pytest.raises(ValueError, match="lmdb://PATH"):
        open_store(StoreSettings(home=tmp_path, local_store_url=url))
