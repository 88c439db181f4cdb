"""The sysfs reader's group reads (one InfiniBand port's files at once) answer exactly what
reading each file alone answers, including when a file fails and its descriptor number is
taken by another file before the group is read again. (A file that fails inside a group read
is read once more on its own, so a one-off error costs nothing; one that fails again answers
None and is reopened next time, as a single read would.)"""

from __future__ import annotations

import os

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gpuwarden.collector.sources.base import FileReader


def _files(tmp_path, n):
    paths = []
    for i in range(n):
        p = tmp_path / f"counter_{i}"
        p.write_bytes(f"{i}\n".encode())
        paths.append(str(p))
    return tuple(paths)


def test_a_group_is_read_with_one_pread_per_file_and_sees_new_values(tmp_path, monkeypatch):
    paths = _files(tmp_path, 3)
    reader = FileReader()
    assert reader.read_many(paths) == [b"0\n", b"1\n", b"2\n"]
    calls = []
    real_pread = os.pread

    def counting_pread(fd, n, off):
        calls.append(fd)
        return real_pread(fd, n, off)

    monkeypatch.setattr(os, "pread", counting_pread)
    monkeypatch.setattr(os, "open", lambda *a, **k: pytest.fail("a group file was reopened"))
    with open(paths[1], "wb") as f:  # sysfs regenerates an attribute on each read from 0
        f.write(b"12345\n")
    assert reader.read_many(paths) == [b"0\n", b"12345\n", b"2\n"]
    assert len(calls) == 3
    reader.close()


def test_a_failed_file_whose_descriptor_is_reused_is_not_read_through_the_group(
    tmp_path, monkeypatch
):
    paths = _files(tmp_path, 3)
    other = tmp_path / "other"
    other.write_bytes(b"not a counter\n")
    reader = FileReader()
    reader.read_many(paths)
    failing = reader._fds[paths[1]]
    real_pread = os.pread

    def pread_failing(fd, n, off):
        if fd == failing:
            raise OSError(19, "No such device")  # a sysfs attribute whose device went away
        return real_pread(fd, n, off)

    monkeypatch.setattr(os, "pread", pread_failing)
    assert reader.read_bytes(paths[1]) is None  # read alone (another source): fails, closed
    monkeypatch.setattr(os, "pread", real_pread)
    # the freed descriptor number goes to another file...
    assert reader.read_bytes(str(other)) == b"not a counter\n"
    assert reader._fds[str(other)] == failing
    # ...and the group reopens its own file instead of reading that one
    assert reader.read_many(paths) == [b"0\n", b"1\n", b"2\n"]
    reader.close()


def test_a_missing_file_answers_none_in_its_place(tmp_path):
    paths = (*_files(tmp_path, 2), str(tmp_path / "absent"))
    reader = FileReader()
    for _ in range(2):
        assert reader.read_many(paths) == [b"0\n", b"1\n", None]
    (tmp_path / "absent").write_bytes(b"7\n")
    assert reader.read_many(paths) == [b"0\n", b"1\n", b"7\n"]
    reader.close()


def test_with_no_descriptors_kept_open_every_read_opens_the_file(tmp_path):
    paths = _files(tmp_path, 2)
    reader = FileReader(max_open=0)  # the benchmark's open-read-close baseline
    assert reader.read_many(paths) == [b"0\n", b"1\n"]
    assert reader.read_many(paths) == [b"0\n", b"1\n"]
    assert not reader._fds


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("write"), st.integers(0, 3), st.integers(0, 10**12)),
        st.tuples(st.just("delete"), st.integers(0, 3)),
        # reads of that file fail from now on, starting with one that reads it alone
        st.tuples(st.just("fail"), st.integers(0, 3)),
        st.tuples(st.just("heal"), st.integers(0, 3)),
        st.tuples(st.just("read_many"), st.just(0)),
        st.tuples(st.just("read_one"), st.integers(0, 3)),
        st.tuples(st.just("read_other"), st.integers(0, 3)),  # opens a file outside the group
    ),
    max_size=30,
)


@settings(max_examples=100, deadline=None)
@given(OPS)
# the dangerous case, spelled out: a group file fails alone, its number goes to another file
@example([("read_many", 0), ("fail", 1), ("read_other", 0), ("read_many", 0)])
def test_group_reads_answer_what_single_reads_answer(tmp_path_factory, ops):
    """Model: a second reader that reads each file alone, under the same failures. Both share
    one process's descriptor numbers, so a number one closes is soon reused by the other."""
    tmp = tmp_path_factory.mktemp("sysfs")
    paths = _files(tmp, 4)
    others = _files(tmp_path_factory.mktemp("other"), 4)
    grouped, single = FileReader(), FileReader()
    failing: set[str] = set()
    real_pread = os.pread

    def pread(fd, n, off):
        for reader in (grouped, single):
            if any(fd == open_fd and path in failing for path, open_fd in reader._fds.items()):
                raise OSError(5, "Input/output error")
        return real_pread(fd, n, off)

    os.pread = pread
    try:
        for kind, i, *value in ops:
            if kind == "write":
                with open(paths[i], "wb") as f:
                    f.write(f"{value[0]}\n".encode())
            elif kind == "delete":
                if os.path.exists(paths[i]):
                    os.unlink(paths[i])
            elif kind == "fail":
                failing.add(paths[i])
                assert grouped.read_bytes(paths[i]) == single.read_bytes(paths[i])
            elif kind == "heal":
                failing.discard(paths[i])
            elif kind == "read_other":
                assert grouped.read_bytes(others[i]) == single.read_bytes(others[i])
            elif kind == "read_one":
                assert grouped.read_bytes(paths[i]) == single.read_bytes(paths[i])
            else:
                assert grouped.read_many(paths) == [single.read_bytes(p) for p in paths]
        assert grouped.read_many(paths) == [single.read_bytes(p) for p in paths]
    finally:
        os.pread = real_pread
        grouped.close()
        single.close()


def test_the_files_of_an_hca_that_went_away_are_closed_at_rediscovery(tmp_path):
    """SR-IOV functions come and go with pods: their counter files must not stay open (the
    agent would run out of descriptors), and the HCAs that remain are still read."""
    import shutil

    from gpuwarden.collector import sources
    from gpuwarden.collector.sources.base import SourceContext
    from testbed.sysfstree import build_node_tree

    build_node_tree(tmp_path / "sys", hcas=4)
    ctx = SourceContext("c", "n", sysfs=tmp_path / "sys", procfs=tmp_path)
    ib = sources.create("infiniband", ctx, {"rediscover_cycles": 2})
    assert len(ib.collect(0)) == 4
    per_port = ib._files.open_files // 4
    shutil.rmtree(tmp_path / "sys/class/infiniband/mlx5_3")
    ib.collect(1)  # not yet rediscovered: the files it can no longer read answer nothing
    points = ib.collect(2)  # rediscovered
    assert sorted(p.tags["hca"] for p in points) == ["mlx5_0", "mlx5_1", "mlx5_2"]
    assert ib._files.open_files == 3 * per_port
    ib.close()
