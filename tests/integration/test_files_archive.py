"""Archives: a directory out as a tar (gzip or not, with excludes), and a tar into a directory,
unpacked by the agent's own bounded reader inside the sandbox. The attacks an archive can carry
are refused with the member named: absolute names, "..", a link that leads out (and a member
written through one), a hard link to a file outside, devices and FIFOs, a bad checksum, an
archive cut short."""
from __future__ import annotations

import gzip as gz
import io
import tarfile

import pytest

from helpers import assert_error


def get_archive(sandbox, path, **params):
    return sandbox.api.get(f"/v1/sandboxes/{sandbox.id}/files/archive", params={"path": path, **params})


def put_archive(sandbox, path, data, **params):
    return sandbox.api.put(f"/v1/sandboxes/{sandbox.id}/files/archive", params={"path": path, **params},
                           content=data)


def make_tar(members, compress=True) -> bytes:
    """members: (TarInfo, bytes or None)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz" if compress else "w") as t:
        for info, data in members:
            t.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def info(name, type=tarfile.REGTYPE, size=0, link="", mode=0o644):
    i = tarfile.TarInfo(name)
    i.type, i.size, i.linkname, i.mode = type, size, link, mode
    return i


@pytest.mark.microvm_subset
def test_directory_out_gzip_or_not(sandbox):
    long = "n" * 150
    sandbox.run(f"mkdir -p /workspace/t/sub/empty /workspace/t/skip && cd /workspace/t && printf hello > a.txt && "
                f"printf 12345 > sub/{long} && ln -s a.txt link && ln a.txt hard && chmod 750 sub && "
                f"touch skip/x && mkfifo fifo")
    r = get_archive(sandbox, "/workspace/t", exclude="skip")
    assert r.status_code == 200 and r.headers["content-type"] == "application/gzip", r.text[:300]
    with tarfile.open(fileobj=io.BytesIO(r.content), mode="r:gz") as t:
        names = {m.name.rstrip("/"): m for m in t.getmembers()}
        assert set(names) == {".", "./a.txt", "./sub", "./sub/empty", f"./sub/{long}", "./link", "./hard"}, names
        assert t.extractfile("./a.txt").read() == b"hello"
        assert t.extractfile(f"./sub/{long}").read() == b"12345"
        assert names["./link"].issym() and names["./link"].linkname == "a.txt"
        hard = [names["./a.txt"], names["./hard"]]
        assert sorted(m.islnk() for m in hard) == [False, True]  # the second name is a hard link
        assert names["./sub"].mode & 0o777 == 0o750
    plain = get_archive(sandbox, "/workspace/t", gzip="false")
    assert plain.status_code == 200 and plain.headers["content-type"] == "application/x-tar"
    with tarfile.open(fileobj=io.BytesIO(plain.content)) as t:
        assert sorted(t.getmember(n).size for n in ("./a.txt", "./hard")) == [0, 5]  # one carries the bytes
    assert_error(get_archive(sandbox, "/workspace/none"), 404, "not_found")
    assert_error(get_archive(sandbox, "/workspace/t/a.txt"), 400, "invalid_request")
    assert_error(get_archive(sandbox, "/workspace/t", gzip="maybe"), 400, "invalid_request")
    assert_error(get_archive(sandbox, "/workspace/t", user="mallory"), 400, "invalid_request")


@pytest.mark.microvm_subset
def test_directory_in_merges(sandbox):
    sandbox.run("mkdir -p /workspace/in/keep && printf old > /workspace/in/keep/k.txt && printf old > /workspace/in/a.txt")
    data = make_tar([(info("./", tarfile.DIRTYPE, mode=0o755), None),
                     (info("./a.txt", size=3, mode=0o755), b"new"),
                     (info("./d/deep/f.bin", size=4), b"\x00\x01\x02\x03"),
                     (info("./d/l", tarfile.SYMTYPE, link="deep/f.bin"), None),
                     (info("./d/h", tarfile.LNKTYPE, link="./a.txt"), None),
                     (info("x" * 200, size=2), b"ok")])
    r = put_archive(sandbox, "/workspace/in", data)
    assert r.status_code == 200, r.text
    assert r.json() == {"path": "/workspace/in", "entries": 6, "bytes": 9}
    assert sandbox.read("/workspace/in/a.txt") == b"new"
    assert sandbox.read("/workspace/in/keep/k.txt") == b"old"  # merged, not replaced
    assert sandbox.read("/workspace/in/d/l") == b"\x00\x01\x02\x03"
    assert sandbox.run("stat -c %h /workspace/in/a.txt") == "2\n"
    assert sandbox.read("/workspace/in/" + "x" * 200) == b"ok"
    assert sandbox.stat("/workspace/in/a.txt").json()["mode"] == "0755"
    # Plain tar too, into a directory that does not exist yet.
    plain = make_tar([(info("p.txt", size=1), b"p")], compress=False)
    assert put_archive(sandbox, "/workspace/new/dir", plain).status_code == 200
    assert sandbox.read("/workspace/new/dir/p.txt") == b"p"


HOSTILE = {
    "absolute": [(info("/etc/evil", size=1), b"x")],
    "dotdot": [(info("a/../../evil", size=1), b"x")],
    "link_absolute": [(info("l", tarfile.SYMTYPE, link="/etc"), None)],
    "link_up": [(info("sub/l", tarfile.SYMTYPE, link="../../.."), None)],
    "write_through_link": [(info("l", tarfile.SYMTYPE, link="."), None), (info("l2", tarfile.SYMTYPE, link="/tmp"), None)],
    "hardlink_out": [(info("h", tarfile.LNKTYPE, link="/etc/passwd"), None)],
    "hardlink_up": [(info("h", tarfile.LNKTYPE, link="../outside.txt"), None)],
    "chardev": [(info("dev", tarfile.CHRTYPE), None)],
    "blockdev": [(info("dev", tarfile.BLKTYPE), None)],
    "fifo": [(info("fifo", tarfile.FIFOTYPE), None)],
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_members_are_refused(sandbox, case):
    sandbox.run("mkdir -p /workspace/h && printf secret > /workspace/outside.txt")
    r = put_archive(sandbox, "/workspace/h/x", make_tar(HOSTILE[case]))
    assert_error(r, 400, "invalid_request")
    assert "refusing" in r.json()["error"]["message"], r.text
    # Nothing was made outside, and no link out is left behind.
    assert sandbox.run("test ! -e /etc/evil && test ! -e /workspace/h/evil && test ! -e /workspace/evil && "
                       "find /workspace/h -type l | wc -l") == "0\n"
    assert sandbox.read("/workspace/outside.txt") == b"secret"


def test_member_through_a_link_the_archive_made(sandbox):
    """A link x -> /tmp first, then x/evil: the link is made last and checked, so the file is
    never written through it; the link itself is refused."""
    data = make_tar([(info("x", tarfile.SYMTYPE, link="/tmp"), None), (info("x/evil", size=1), b"x")])
    r = put_archive(sandbox, "/workspace/lk", data)
    assert_error(r, 400, "invalid_request")
    assert sandbox.run("test ! -e /tmp/evil && echo clean") == "clean\n"
    # A link already in the target is not written through either.
    sandbox.run("mkdir -p /workspace/lk2 && ln -s /tmp /workspace/lk2/x")
    r = put_archive(sandbox, "/workspace/lk2", make_tar([(info("x/evil2", size=1), b"x")]))
    assert_error(r, 400, "invalid_request")
    assert sandbox.run("test ! -e /tmp/evil2 && echo clean") == "clean\n"


def test_malformed_archives(sandbox):
    good = make_tar([(info("a.txt", size=5), b"hello")], compress=False)
    bad_sum = bytearray(good)
    bad_sum[0] ^= 0x01  # the name changes, the checksum no longer matches
    for data in (bytes(bad_sum), good[:700], gz.compress(good)[:-20], b"not a tar at all" * 64):
        r = put_archive(sandbox, "/workspace/m", data)
        assert_error(r, 400, "invalid_request")
    assert_error(put_archive(sandbox, "/workspace/m", good, user="mallory"), 400, "invalid_request")
    sandbox.write("/workspace/file", b"x")
    assert_error(put_archive(sandbox, "/workspace/file", good), 400, "invalid_request")


def test_unarchive_where_the_user_may_not_write_is_403(sandbox):
    # The filesystem's answer, by class: the sandbox user may not make a directory in /usr.
    data = make_tar([(info("a.txt", size=5), b"hello")])
    err = assert_error(put_archive(sandbox, "/usr/share/not-mine", data), 403, "forbidden")
    assert "/usr/share/not-mine" in err["message"], err
    # As root it may.
    r = put_archive(sandbox, "/usr/share/not-mine", data, user="root")
    assert r.status_code == 200, r.text
    assert sandbox.run("cat /usr/share/not-mine/a.txt") == "hello"


def test_unarchive_that_fills_the_disk_is_413(api, driver):
    sbx = api.create_sandbox(driver=driver, diskMiB=512)
    # Fill the sandbox's disk (dd ends on ENOSPC), then unpack a little more than is left.
    sbx.exec("dd if=/dev/zero of=/workspace/fill bs=1M 2>/dev/null; sync", timeoutMs=300000)
    free = int(sbx.run("df --output=avail -B1 /workspace | tail -1").strip())
    blob = bytes(range(256)) * (4 * 1024 + (free // 256) + 1)  # not zeros: no sparse write saves room
    data = make_tar([(info("big.bin", size=len(blob)), blob)])
    err = assert_error(put_archive(sbx, "/workspace/more", data), 413, "payload_too_large")
    assert "disk is full" in err["message"], err
    # The sandbox goes on: freeing the space lets the same archive in.
    sbx.run("rm -f /workspace/fill /workspace/more/big.bin")
    r = put_archive(sbx, "/workspace/more", data)
    assert r.status_code == 200, r.text
