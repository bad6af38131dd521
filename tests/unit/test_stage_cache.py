"""The stager's cache bookkeeping and input parsing, without a network or an event loop."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentd.stage_cache import CacheFull, StageCache, entry_name
from agentd.stage_sources import StageError, parse_input


def add(cache: StageCache, key: str, size: int, source: str = "") -> Path:
    """Puts a finished entry of `size` bytes in the cache, as a transfer would."""
    cache.delete_trees(cache.reserve(size))
    staged = cache.temp_dir(key)
    staged.mkdir()
    (staged / "item").write_bytes(b"x" * size)
    cache.unreserve(size)
    cache.commit(key, staged, "item", size, source or key)
    entry = cache.get(key)
    assert entry is not None
    return cache.path(entry)


@pytest.fixture
def cache(tmp_path: Path) -> StageCache:
    c = StageCache(tmp_path / "cache", 300)
    c.load()
    return c


def test_eviction_takes_the_least_recently_used_unpinned_entries(cache: StageCache) -> None:
    a, b, c = add(cache, "a", 100), add(cache, "b", 100), add(cache, "c", 100)
    cache.touch("a")
    cache.pin("job", "b")
    trash = cache.reserve(150)  # needs 150 bytes: c (oldest unpinned), then a
    assert sorted(p.name.split("-")[1] for p in trash) == sorted([entry_name("a"), entry_name("c")])
    assert set(cache.entries) == {"b"} and b.exists() and not a.exists() and not c.exists()
    assert (cache.used_bytes, cache.reserved_bytes) == (100, 150)
    cache.delete_trees(trash)
    assert list(cache.tmp_dir.iterdir()) == []


def test_pinned_entries_and_reservations_can_leave_no_room(cache: StageCache) -> None:
    add(cache, "a", 100)
    cache.pin("job", "a")
    cache.reserve(150)
    with pytest.raises(CacheFull, match="100 bytes in use by jobs and 150 bytes held"):
        cache.reserve(100)
    assert set(cache.entries) == {"a"} and cache.reserved_bytes == 150
    cache.unpin("job")
    assert len(cache.reserve(100)) == 1 and not cache.entries


def test_a_new_version_of_a_source_replaces_the_old_unless_it_is_pinned(
    cache: StageCache,
) -> None:
    old = add(cache, "file:/d/x:1:1", 10, source="/d/x")
    newer = add(cache, "file:/d/x:2:2", 20, source="/d/x")
    assert not old.exists() and newer.exists() and cache.used_bytes == 20
    cache.pin("job", "file:/d/x:2:2")
    add(cache, "file:/d/x:3:3", 30, source="/d/x")
    assert newer.exists() and cache.used_bytes == 50


def test_load_keeps_intact_entries_and_drops_the_rest(tmp_path: Path) -> None:
    first = StageCache(tmp_path, 1000)
    first.load()
    kept, damaged = add(first, "kept", 10), add(first, "damaged", 10)
    first.pin("job", "kept")
    first.pin("gone", "missing")
    first.write_index(first.index_bytes())
    damaged.write_bytes(b"short")  # not the size the index says
    second = StageCache(tmp_path, 1000)
    report = second.load()
    assert (report.entries, report.dropped, report.leftovers) == (1, 1, 1)
    assert set(second.entries) == {"kept"} and kept.exists() and not damaged.parent.exists()
    assert second.pins == {"job": {"kept"}}
    assert second.used_bytes == 10


def test_load_shrinks_to_a_smaller_size_and_survives_a_bad_index(tmp_path: Path) -> None:
    first = StageCache(tmp_path, 1000)
    first.load()
    for key in "abc":
        add(first, key, 100)
    first.touch("a")
    first.write_index(first.index_bytes())
    smaller = StageCache(tmp_path, 150)
    smaller.load()
    assert set(smaller.entries) == {"a"}  # the most recently used one
    (tmp_path / "index.json").write_text("{not json")
    after_crash = StageCache(tmp_path, 1000)
    after_crash.load()
    assert not after_crash.entries and list(after_crash.data_dir.iterdir()) == []


def test_the_index_is_written_whole(cache: StageCache) -> None:
    add(cache, "a", 5)
    cache.write_index(cache.index_bytes())
    doc = json.loads(cache.index_path.read_text())
    assert doc["version"] == 1 and [e["key"] for e in doc["entries"]] == ["a"]
    assert not (cache.root / "index.json.tmp").exists()


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("HTTP://Example.COM:80/data/x.bin", "http://example.com/data/x.bin#part"),
        ("https://h:443/a/../b", "https://h/b"),
        ("file:///data/set/", "/data/set"),
        ("file://localhost/data//set", "/data/./set"),
    ],
)
def test_equal_inputs_parse_the_same(a: str, b: str) -> None:
    pa, pb = parse_input(a), parse_input(b)
    assert (pa.url, pa.path, pa.item) == (pb.url, pb.path, pb.item)


@pytest.mark.parametrize(
    ("raw", "item"),
    [
        ("http://h/../../etc/passwd", "passwd"),
        ("http://h/a/%2e%2e", "input"),
        ("http://h/", "input"),
        ("http://h/x/%2Fetc%2Fshadow", "shadow"),
        ("/data/train.parquet", "train.parquet"),
    ],
)
def test_the_name_in_the_cache_is_one_plain_component(raw: str, item: str) -> None:
    assert parse_input(raw).item == item


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ("s3://bucket/key", "unsupported URL scheme 's3'"),
        ("data/relative.txt", "a local path must be absolute"),
        ("file://otherhost/data", "must name a local path"),
        ("http:///no-host", "no host"),
    ],
)
def test_bad_inputs_are_refused_with_a_reason(raw: str, reason: str) -> None:
    with pytest.raises(StageError, match=reason) as caught:
        parse_input(raw)
    assert caught.value.input == raw
