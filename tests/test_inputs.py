"""Tests for snapstore.fingerprint.inputs: declared inputs, stable names and per-store identity."""

from __future__ import annotations

import hashlib
import os
import pickle
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from snapstore.errors import FingerprintError, SnapstoreError, StoreError
from snapstore.fingerprint.digest import hash_value
from snapstore.fingerprint.inputs import InputError, Inputs, files


def write(path: Path, data: bytes, mtime_ns: int | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    if mtime_ns is not None:
        os.utime(path, ns=(mtime_ns, mtime_ns))


T0 = 1_700_000_000_123_456_789  # a fixed mtime_ns, so tests do not depend on the clock


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """data/{a.jpg, b.jpg, notes.txt, sub/c.jpg, sub/deep/d.jpg}, all with fixed mtimes."""
    root = tmp_path / "data"
    for i, name in enumerate(["a.jpg", "b.jpg", "notes.txt", "sub/c.jpg", "sub/deep/d.jpg"]):
        write(root / name, name.encode() * 3, T0 + i)
    return root


@pytest.fixture
def mem() -> Iterator[str]:
    """A unique memory:// prefix, removed afterwards (the memory filesystem is process-global)."""
    prefix = f"/snapin-{uuid.uuid4().hex}"
    yield prefix
    fs = fsspec.filesystem("memory")
    if fs.exists(prefix):
        fs.rm(prefix, recursive=True)


def pipe(url: str, data: bytes) -> None:
    fsspec.filesystem("memory").pipe(url, data)
    time.sleep(0.002)  # memory identity is the creation time in microseconds


# -- listing and names --------------------------------------------------------------------------


def test_glob_names_are_relative_to_the_glob_base(tree: Path) -> None:
    inp = files(str(tree / "*.jpg"))
    assert list(inp.identity()) == ["a.jpg", "b.jpg"]
    assert list(inp) == [str(tree / "a.jpg"), str(tree / "b.jpg")]
    assert len(inp) == 2 and inp[0] == str(tree / "a.jpg") and inp[-1] == str(tree / "b.jpg")
    assert inp.identity()["a.jpg"] == f"size=15;mtime_ns={T0}"
    assert "files=2" in repr(inp) and "*.jpg" in repr(inp)


def test_recursive_glob_and_directory(tree: Path) -> None:
    assert list(files(str(tree / "**" / "*.jpg")).identity()) == [
        "a.jpg", "b.jpg", "sub/c.jpg", "sub/deep/d.jpg"
    ]  # fmt: skip
    assert list(files(str(tree / "*" / "*.jpg")).identity()) == ["sub/c.jpg"]
    whole = files(tree)  # a Path to a directory: every file under it
    assert list(whole.identity()) == ["a.jpg", "b.jpg", "notes.txt", "sub/c.jpg", "sub/deep/d.jpg"]
    assert files(str(tree) + "/").identity() == whole.identity()


def test_hidden_files_count_in_directories(tree: Path) -> None:
    write(tree / ".hidden", b"x")
    assert ".hidden" in files(tree).identity()
    assert ".hidden" not in files(str(tree / "*.jpg")).identity()


def test_single_file_and_explicit_list(tree: Path) -> None:
    assert list(files(tree / "sub" / "c.jpg").identity()) == ["c.jpg"]
    inp = files([tree / "sub" / "deep" / "d.jpg", str(tree / "a.jpg")])
    assert list(inp.identity()) == ["a.jpg", "sub/deep/d.jpg"]  # common parent: data/
    assert list(inp) == [str(tree / "a.jpg"), str(tree / "sub" / "deep" / "d.jpg")]


def test_list_mixing_globs_directories_and_files(tree: Path) -> None:
    inp = files([str(tree / "sub" / "*.jpg"), tree / "sub" / "deep", tree / "notes.txt"])
    assert list(inp.identity()) == ["notes.txt", "sub/c.jpg", "sub/deep/d.jpg"]


def test_overlapping_entries_are_one_input(tree: Path) -> None:
    inp = files(
        [str(tree / "*.jpg"), tree / "a.jpg", str(tree / "a*"), tree / "sub" / ".." / "a.jpg"]
    )
    assert list(inp.identity()) == ["a.jpg", "b.jpg"]
    assert len(inp) == 2


def test_same_relative_names_in_two_directories_do_not_clash(tmp_path: Path) -> None:
    write(tmp_path / "x" / "data" / "f.bin", b"1")
    write(tmp_path / "y" / "data" / "f.bin", b"22")
    inp = files([tmp_path / "x" / "data", str(tmp_path / "y" / "data" / "*.bin")])
    assert list(inp.identity()) == ["x/data/f.bin", "y/data/f.bin"]  # base: their common parent


def test_names_do_not_depend_on_what_matched(tree: Path) -> None:
    """The base comes from the declaration: a new subdirectory does not rename anything."""
    before = files(str(tree / "sub" / "**"))
    write(tree / "sub" / "new" / "e.jpg", b"e", T0)
    after = files(str(tree / "sub" / "**"))
    assert set(before.identity()) < set(after.identity())
    assert all(after.identity()[k] == v for k, v in before.identity().items())


def test_relative_paths_resolve_against_cwd(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tree.parent)
    inp = files("data/*.jpg")
    assert inp.identity() == files(str(tree / "*.jpg")).identity()
    assert list(inp) == [str(tree / "a.jpg"), str(tree / "b.jpg")]  # absolute, ready to open


def test_file_url_is_local(tree: Path) -> None:
    assert (
        files("file://" + str(tree / "*.jpg")).identity() == files(str(tree / "*.jpg")).identity()
    )


@pytest.mark.skipif(sys.platform == "win32", reason="symlinks")
def test_symlinked_directories_are_followed_and_loops_skipped(tree: Path, tmp_path: Path) -> None:
    (tree / "sub" / "loop").symlink_to(tree)  # data/sub/loop -> data
    other = tmp_path / "elsewhere"
    write(other / "e.jpg", b"e", T0)
    (tree / "linked").symlink_to(other)
    names = set(files(tree).identity())
    assert "linked/e.jpg" in names
    assert not any(n.startswith("sub/loop/") for n in names)  # a link to an ancestor is skipped


# -- identity changes (local) -------------------------------------------------------------------


def ident(tree: Path, **kw: Any) -> dict[str, str]:
    return files(str(tree / "**"), **kw).identity()


def test_rewrite_with_different_content_changes_identity(tree: Path) -> None:
    before = ident(tree)
    write(tree / "a.jpg", b"something else", T0)  # same mtime, other size
    after = ident(tree)
    assert after["a.jpg"] != before["a.jpg"]
    assert {k: v for k, v in after.items() if k != "a.jpg"} == {
        k: v for k, v in before.items() if k != "a.jpg"
    }


def test_rewrite_same_size_is_seen_through_mtime_ns(tree: Path) -> None:
    before = ident(tree)
    write(tree / "a.jpg", b"A.JPGA.JPGA.JPG", T0 + 1)  # same size; mtime differs by 1 ns
    assert ident(tree)["a.jpg"] == f"size=15;mtime_ns={T0 + 1}" != before["a.jpg"]


def test_rewrite_same_size_same_mtime_is_the_documented_blind_spot(tree: Path) -> None:
    """Metadata identity cannot see a same-size rewrite that restores the mtime; sha256 can."""
    meta, content = ident(tree), ident(tree, content_hash=True)
    write(tree / "a.jpg", b"A.JPGA.JPGA.JPG", T0)
    assert ident(tree) == meta
    assert ident(tree, content_hash=True)["a.jpg"] != content["a.jpg"]


def test_touch_changes_metadata_identity_only(tree: Path) -> None:
    meta, content = ident(tree), ident(tree, content_hash=True)
    os.utime(tree / "b.jpg", ns=(T0 + 99, T0 + 99))
    assert ident(tree)["b.jpg"] != meta["b.jpg"]
    assert ident(tree, content_hash=True) == content


def test_add_and_remove_files(tree: Path) -> None:
    before = ident(tree)
    write(tree / "z.jpg", b"z", T0)
    added = ident(tree)
    assert set(added) - set(before) == {"z.jpg"}
    (tree / "b.jpg").unlink()
    removed = ident(tree)
    assert set(added) - set(removed) == {"b.jpg"}


def test_content_hash_is_sha256_of_the_bytes(tree: Path) -> None:
    got = files(tree / "a.jpg", content_hash=True).identity()
    assert got == {"a.jpg": "sha256=" + hashlib.sha256(b"a.jpg" * 3).hexdigest()}
    assert "sha256" in repr(Inputs(tree / "a.jpg", content_hash=True))


def test_copied_tree(tree: Path, tmp_path: Path) -> None:
    """copy2 (copytree's default) keeps mtimes, so the identity is kept; a plain copy gets new
    mtimes and a new identity unless content_hash=True."""
    kept = shutil.copytree(tree, tmp_path / "copy2")
    assert ident(Path(kept)) == ident(tree)
    plain = shutil.copytree(tree, tmp_path / "plain", copy_function=shutil.copy)
    for p in Path(plain).rglob("*"):
        if p.is_file():
            os.utime(p, ns=(T0 + 10**9, T0 + 10**9))  # what a copy made a second later gets
    assert ident(Path(plain)) != ident(tree)
    assert ident(Path(plain), content_hash=True) == ident(tree, content_hash=True)


def test_ten_thousand_local_files(tmp_path: Path) -> None:
    root = tmp_path / "many"
    root.mkdir()
    for i in range(10_000):
        (root / f"{i:05d}.bin").write_bytes(b"x")
    by_glob = files(str(root / "*.bin"))
    assert len(by_glob) == 10_000 and len(by_glob.identity()) == 10_000
    by_list = files(sorted(root.iterdir()))
    assert by_list.identity() == by_glob.identity()
    assert files(root).identity() == by_glob.identity()


# -- hooks and pickling -------------------------------------------------------------------------


def test_hooks(tree: Path) -> None:
    inp = files(str(tree / "**"))
    assert inp.__snapstore_inputs__() == inp.identity()
    assert inp.__snapstore_key__() == tuple(sorted(inp.identity().items()))
    inp.identity()["a.jpg"] = "tampered"  # a copy: the cache is not exposed
    assert inp.identity()["a.jpg"] != "tampered"


def test_nested_in_a_value_hashes_through_snapstore_key(tree: Path) -> None:
    before = hash_value({"images": files(str(tree / "*.jpg")), "size": 224})
    assert before == hash_value({"images": files(str(tree / "*.jpg")), "size": 224})
    os.utime(tree / "a.jpg", ns=(T0 + 5, T0 + 5))
    assert hash_value({"images": files(str(tree / "*.jpg")), "size": 224}) != before


@pytest.mark.parametrize("content_hash", [False, True])
def test_pickle_roundtrip(tree: Path, content_hash: bool) -> None:
    inp = files(str(tree / "**"), content_hash=content_hash)
    want = inp.identity()
    clone = pickle.loads(pickle.dumps(inp))
    assert clone._identity is None and clone._fs is None  # no cached hashes, no handles
    assert list(clone) == list(inp) and len(clone) == len(inp)
    assert clone.identity() == want


def test_pickle_roundtrip_memory(mem: str) -> None:
    pipe(f"memory://{mem}/a.bin", b"abc")
    inp = files(f"memory://{mem}/*.bin", content_hash=True)
    clone = pickle.loads(pickle.dumps(inp))
    assert clone.identity() == inp.identity()


# -- errors -------------------------------------------------------------------------------------


def test_glob_matching_nothing(tree: Path) -> None:
    with pytest.raises(InputError, match=r"hold no files: '.*\*\.png'") as err:
        files(str(tree / "*.png"))
    assert isinstance(err.value, FileNotFoundError) and isinstance(err.value, SnapstoreError)
    with pytest.raises(InputError, match="hold no files"):
        files(str(tree.parent / "nowhere" / "*.jpg"))


def test_missing_files_are_all_named(tree: Path) -> None:
    with pytest.raises(InputError, match=r"2 path\(s\) do not exist: '.*x1.jpg', '.*x2.jpg'"):
        files([tree / "a.jpg", tree / "x1.jpg", tree / "x2.jpg"])
    with pytest.raises(InputError, match="do not exist"):
        files(tree / "a.jpg" / "below-a-file")


def test_empty_directory_and_empty_list(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="hold no files"):
        files(tmp_path / "empty")
    with pytest.raises(InputError, match="empty list"):
        files([])


def test_bad_declarations() -> None:
    with pytest.raises(TypeError, match="not int"):
        files(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="entries must be str"):
        files(["a", 3])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="not bytes"):
        files(b"data/*")  # type: ignore[arg-type]


def test_entries_on_two_filesystems(tree: Path, mem: str) -> None:
    with pytest.raises(ValueError, match="share one filesystem"):
        files([tree / "a.jpg", f"memory://{mem}/a.jpg"])


@pytest.mark.skipif(sys.platform == "win32", reason="symlinks")
def test_broken_symlink(tree: Path) -> None:
    (tree / "dangling.jpg").symlink_to(tree / "gone.jpg")
    with pytest.raises(InputError, match=r"dangling\.jpg.*broken symbolic link"):
        files(str(tree / "*.jpg"))


@pytest.mark.skipif(
    sys.platform == "win32" or os.geteuid() == 0, reason="root reads unreadable directories"
)
def test_unreadable_local_directory(tree: Path) -> None:
    (tree / "sub").chmod(0)
    try:
        with pytest.raises(StoreError, match="cannot list local directory"):
            files(tree)
    finally:
        (tree / "sub").chmod(0o755)


def test_unlistable_local_directory_as_any_user(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = os.scandir

    def scandir(path: Any) -> Any:
        if str(path).endswith("/sub"):
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)
    with pytest.raises(StoreError, match=r"cannot list local directory .*/sub: PermissionError"):
        files(tree)
    assert len(files(str(tree / "*.jpg"))) == 2  # a glob that does not descend is unaffected


def test_file_removed_before_hashing(tree: Path) -> None:
    inp = files(str(tree / "*.jpg"), content_hash=True)
    (tree / "a.jpg").unlink()
    with pytest.raises(InputError, match="is gone now"):
        inp.identity()


# -- memory filesystem --------------------------------------------------------------------------


def test_memory_glob_directory_and_list(mem: str) -> None:
    for name in ["a.jpg", "b.jpg", "sub/c.jpg", "notes.txt"]:
        pipe(f"memory://{mem}/data/{name}", name.encode())
    by_glob = files(f"memory://{mem}/data/**/*.jpg")
    assert list(by_glob.identity()) == ["a.jpg", "b.jpg", "sub/c.jpg"]
    assert list(by_glob) == [f"memory://{mem}/data/{n}" for n in ["a.jpg", "b.jpg", "sub/c.jpg"]]
    with fsspec.open(by_glob[2], "rb") as f:  # the URLs open as they are
        assert f.read() == b"sub/c.jpg"
    assert by_glob.identity()["a.jpg"].startswith("size=5;created_us=")
    by_dir = files(f"memory://{mem}/data")
    assert list(by_dir.identity()) == ["a.jpg", "b.jpg", "notes.txt", "sub/c.jpg"]
    by_list = files([f"memory://{mem}/data/a.jpg", f"memory://{mem}/data/sub/c.jpg"])
    assert list(by_list.identity()) == ["a.jpg", "sub/c.jpg"]
    assert by_list.identity().items() <= by_glob.identity().items()  # info() and ls() agree


def test_memory_explicit_list_is_listed_in_bulk(mem: str, monkeypatch: pytest.MonkeyPatch) -> None:
    urls = [f"memory://{mem}/d/{i:02d}.bin" for i in range(20)]
    for u in urls:
        fsspec.filesystem("memory").pipe(u, b"x")
    calls: list[str] = []
    original = MemoryFileSystem.info

    def spy(self: MemoryFileSystem, path: str, **kw: Any) -> dict[str, Any]:
        calls.append(path)
        return original(self, path, **kw)  # type: ignore[no-any-return]

    monkeypatch.setattr(MemoryFileSystem, "info", spy)
    inp = files(urls)
    assert len(inp) == 20 and not calls  # one ls() of the parent, no per-file info()
    assert inp.identity() == files(f"memory://{mem}/d/*.bin").identity()


def test_memory_identity_changes(mem: str) -> None:
    url = f"memory://{mem}/data"
    for name in ["a.bin", "b.bin", "c.bin"]:
        pipe(f"{url}/{name}", b"0123")
    before = files(f"{url}/*").identity()
    meta_c, content = before["c.bin"], files(f"{url}/*", content_hash=True).identity()
    pipe(f"{url}/a.bin", b"a different size")
    pipe(f"{url}/b.bin", b"3210")  # same size
    pipe(f"{url}/c.bin", b"0123")  # same bytes, rewritten
    pipe(f"{url}/d.bin", b"new")
    fsspec.filesystem("memory").rm(f"{url}/a.bin")
    after = files(f"{url}/*").identity()
    assert set(after) == {"b.bin", "c.bin", "d.bin"}
    assert after["b.bin"] != before["b.bin"] and after["c.bin"] != meta_c
    hashed = files(f"{url}/*", content_hash=True).identity()
    assert hashed["c.bin"] == content["c.bin"] and hashed["b.bin"] != content["b.bin"]


def test_memory_errors(mem: str) -> None:
    pipe(f"memory://{mem}/a.bin", b"a")
    with pytest.raises(InputError, match="hold no files"):
        files(f"memory://{mem}/*.png")
    with pytest.raises(InputError, match=r"do not exist: 'memory://.*/b.bin'"):
        files([f"memory://{mem}/a.bin", f"memory://{mem}/b.bin"])
    with pytest.raises(InputError, match="do not exist"):
        files(f"memory://{mem}-nothing")


def test_unreadable_remote_listing(mem: str, monkeypatch: pytest.MonkeyPatch) -> None:
    pipe(f"memory://{mem}/a.bin", b"a")

    def denied(*args: Any, **kw: Any) -> Any:
        raise PermissionError(403, "caller does not have storage.objects.list access")

    monkeypatch.setattr(MemoryFileSystem, "glob", denied)
    with pytest.raises(
        StoreError, match=r"cannot list inputs.*PermissionError.*storage_options"
    ) as e:
        files(f"memory://{mem}/*.bin")
    assert isinstance(e.value.__cause__, PermissionError)

    def offline(*args: Any, **kw: Any) -> Any:
        raise ConnectionError("network is unreachable")

    monkeypatch.setattr(MemoryFileSystem, "info", offline)
    with pytest.raises(StoreError, match="ConnectionError: network is unreachable") as e:
        files(f"memory://{mem}/a.bin")
    assert isinstance(e.value.__cause__, ConnectionError)


# -- other stores (memory-backed fakes with the metadata real stores list) ----------------------


class _FakeStore(MemoryFileSystem):
    """Memory-backed store whose listings carry `meta(path, info)` instead of `created`."""

    prefix = ""

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        if isinstance(path, str) and path.startswith(cls.prefix):
            path = "memory://" + path[len(cls.prefix) :]
        return super()._strip_protocol(path)

    def meta(self, info: dict[str, Any]) -> dict[str, Any]:
        return {}

    def _fix(self, info: dict[str, Any]) -> dict[str, Any]:
        out = {k: v for k, v in info.items() if k != "created"}
        return out | self.meta(info) if out["type"] == "file" else out

    def ls(self, path: str, detail: bool = True, **kw: Any) -> Any:
        out = super().ls(path, detail=detail, **kw)
        return [self._fix(e) for e in out] if detail else out

    def info(self, path: str, **kw: Any) -> dict[str, Any]:
        return self._fix(super().info(path, **kw))

    def find(self, path: str, *args: Any, detail: bool = False, **kw: Any) -> Any:
        out = super().find(path, *args, detail=detail, **kw)
        return {k: self._fix(v) for k, v in out.items()} if detail else out


class _NoMeta(_FakeStore):
    protocol = "snapnometa"
    prefix = "snapnometa://"


class _FakeGCS(_FakeStore):
    protocol = ("snapfakegs", "gs")
    prefix = "snapfakegs://"

    def meta(self, info: dict[str, Any]) -> dict[str, Any]:
        created = self.store[info["name"]].created
        data = self.cat_file(info["name"])
        return {
            "generation": str(int(created.timestamp() * 1e6)),
            "crc32c": hashlib.sha1(data).hexdigest()[:8],
            "metageneration": "1",
        }


class _FakeS3(_FakeStore):
    protocol = ("snapfakes3", "s3")
    prefix = "snapfakes3://"

    def meta(self, info: dict[str, Any]) -> dict[str, Any]:
        return {"ETag": '"' + hashlib.md5(self.cat_file(info["name"])).hexdigest() + '"'}


class _ETagOnly(_FakeStore):
    protocol = "snapetag"
    prefix = "snapetag://"

    def meta(self, info: dict[str, Any]) -> dict[str, Any]:
        return {"ETag": "v1", "mtime": 12.5}


@pytest.fixture
def fake(mem: str) -> Iterator[str]:
    for cls in (_NoMeta, _FakeGCS, _FakeS3, _ETagOnly):
        fsspec.register_implementation(cls.prefix[:-3], cls, clobber=True)
    pipe(f"memory://{mem}/x/a.bin", b"abc")
    pipe(f"memory://{mem}/x/b.bin", b"defg")
    yield mem.lstrip("/")


def test_store_without_version_metadata_asks_for_content_hash(fake: str) -> None:
    with pytest.raises(FingerprintError, match=r"lists no version metadata.*content_hash=True"):
        files(f"snapnometa://{fake}/x/*.bin")
    got = files(f"snapnometa://{fake}/x/*.bin", content_hash=True).identity()
    assert got["a.bin"] == "sha256=" + hashlib.sha256(b"abc").hexdigest()


def test_gcs_rule(fake: str) -> None:
    got = files(f"snapfakegs://{fake}/x/*.bin").identity()
    crc = hashlib.sha1(b"abc").hexdigest()[:8]
    assert got["a.bin"].startswith("size=3;generation=") and got["a.bin"].endswith(f";crc32c={crc}")
    assert "metageneration" not in got["a.bin"]


def test_s3_rule(fake: str) -> None:
    got = files([f"snapfakes3://{fake}/x/a.bin", f"snapfakes3://{fake}/x/b.bin"]).identity()
    assert got == {
        "a.bin": "size=3;etag=" + hashlib.md5(b"abc").hexdigest(),
        "b.bin": "size=4;etag=" + hashlib.md5(b"defg").hexdigest(),
    }


def test_generic_store_rule(fake: str) -> None:
    got = files(f"snapetag://{fake}/x").identity()
    assert got == {"a.bin": "size=3;ETag=v1;mtime=12.5", "b.bin": "size=4;ETag=v1;mtime=12.5"}


def test_benchmark_script_runs(tmp_path: Path) -> None:
    """A smoke run of benchmarks/bench_fingerprint.py (no timing is checked)."""
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_fingerprint.py"
    cmd = [sys.executable, str(script), "--counts", "20", "--repeat", "1", "--tmp", str(tmp_path)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "local glob, content_hash" in out.stdout and "memory list" in out.stdout
    assert list(tmp_path.iterdir()) == []  # the temporary tree is removed
