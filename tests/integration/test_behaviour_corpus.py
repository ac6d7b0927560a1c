"""The behaviour corpus: the same ordinary programs on every driver, with
what must hold stated per case (exit codes and output), not "the same as
namespace". Every driver is held to the same expectation, so a difference
between drivers fails on at least one of them, unless it is a deliberate
driver limit listed in DRIVER_LIMITS below, which docs/drivers.md mirrors
("Behaviour corpus: deliberate differences"; test_limits_match_the_docs
checks that the two agree). A limit states the documented behaviour of that
driver, so it fails too when the driver stops differing.

One sandbox per driver runs the whole corpus (module-scoped fixture), each
case in a directory of its own under /workspace/corpus, so the corpus costs
one start per driver, the microVM under TCG included.

  RUNTIME_TEST_DRIVERS=namespace python3 -m pytest tests/integration/test_behaviour_corpus.py -q
  ... -k 'microvm and git'
"""
from __future__ import annotations

import difflib
import hashlib
import unicodedata
from dataclasses import dataclass, field

import pytest

from conftest import DRIVERS
from helpers import REPO, Api, Sandbox, skip_unless_driver

# Small enough that filling it is quick under TCG, big enough for the rest
# of the corpus.
DISK_MIB = 256
# Per exec: under the microVM's software emulation a python3 start costs
# seconds, and the venv case took 90-150 s at load 15-20 (pytest.ini's
# 600 s per test bounds the whole case).
STEP_TIMEOUT_MS = {"microvm": 480_000}
DEFAULT_STEP_TIMEOUT_MS = 120_000


@dataclass
class Step:
    script: str
    exit: int = 0
    stdout: str | None = None      # exact, when given
    stderr_has: str | None = None  # a substring of stderr, when given


@dataclass
class Case:
    name: str
    what: str
    steps: list[Step] = field(default_factory=list)


def lines(*ls: str) -> str:
    return "".join(line + "\n" for line in ls)


# ---------------------------------------------------------------------------
# Cases. Every script runs under `bash -c` in /workspace/corpus/<name> with
# LC_ALL=C (byte order for sort), and prints facts, not raw listings with
# times or inode numbers.

CASES: list[Case] = []


def case(name: str, what: str, *steps: Step) -> None:
    CASES.append(Case(name, what, list(steps)))


case("ls_stat_find_du", "ls, stat, find and du over a small tree with fixed times",
     Step(r"""
umask
mkdir -p tree/a/b tree/c
printf 'hello\n' > tree/a/one.txt
head -c 5000 /dev/zero > tree/a/b/two.bin
: > tree/c/empty
ln -s ../a/one.txt tree/c/link
chmod 640 tree/a/one.txt
touch -h -d @1700000000 tree/a/one.txt tree/a/b/two.bin tree/c/empty tree/c/link
ls -ln --time-style=+%s tree/c
ls -1 tree/a
stat -c '%n|%s|%a|%F|%h|%U:%G|%Y' tree/a/one.txt tree/a/b/two.bin tree/c/link tree/c/empty
stat -L -c '%n|%s|%F' tree/c/link
stat -c '%F|%a' tree/a
find tree -mindepth 1 | sort
find tree -type f -size +1k
find tree \( -name '*.txt' -o -type l \) -printf '%p|%y\n' | sort
du -s --apparent-size -B1 tree/a/b/two.bin
kib=$(du -k tree/a/b/two.bin | cut -f1); [ "$kib" -ge 5 ] && [ "$kib" -le 8 ] && echo "two.bin uses 5-8 KiB"
truncate -s 64M sparse
du -k sparse
du -k --apparent-size sparse
""", stdout=lines(
         "0022",
         "total 0",
         "-rw-r--r-- 1 0 0  0 1700000000 empty",
         "lrwxrwxrwx 1 0 0 12 1700000000 link -> ../a/one.txt",
         "b", "one.txt",
         "tree/a/one.txt|6|640|regular file|1|root:root|1700000000",
         "tree/a/b/two.bin|5000|644|regular file|1|root:root|1700000000",
         "tree/c/link|12|777|symbolic link|1|root:root|1700000000",
         "tree/c/empty|0|644|regular empty file|1|root:root|1700000000",
         "tree/c/link|6|regular file",
         "directory|755",
         "tree/a", "tree/a/b", "tree/a/b/two.bin", "tree/a/one.txt", "tree/c", "tree/c/empty",
         "tree/c/link",
         "tree/a/b/two.bin",
         "tree/a/one.txt|f", "tree/c/link|l",
         "5000\ttree/a/b/two.bin",
         "two.bin uses 5-8 KiB",
         "0\tsparse",
         "65536\tsparse")))

case("cp_a", "cp -a keeps modes, owners, times, hard links, symlinks and fifos",
     Step(r"""
mkdir -p src/sub
printf 'data\n' > src/f
ln src/f src/hard
ln -s f src/sym
mkfifo src/fifo
chown 1234:5678 src/f
chmod 0751 src/f
chown -h 42:43 src/sym
touch -d @1600000000 src/f src/sub
touch -h -d @1600000001 src/sym
cp -a src dst
cd dst
find . -mindepth 1 \( -type d -printf '%P|d|%m|%U:%G\n' \) -o -printf '%P|%y|%m|%U:%G|%n|%l\n' | sort
stat -c '%n|%Y' f hard sym sub
[ f -ef hard ] && echo "hard link kept"
[ ! f -ef ../src/f ] && echo "a copy, not a link"
cat sym
""", stdout=lines(
         "fifo|p|644|0:0|1|",  # sort's byte order: 'i' sorts before '|'
         "f|f|751|1234:5678|2|",
         "hard|f|751|1234:5678|2|",
         "sub|d|755|0:0",
         "sym|l|777|42:43|1|f",
         "f|1600000000", "hard|1600000000", "sym|1600000001", "sub|1600000000",
         "hard link kept", "a copy, not a link",
         "data")))

case("tar_zip", "tar.gz and zip round trips (zip through python3's zipfile: the image has no unzip)",
     Step(r"""
mkdir -p src/d
printf 'x%.0s' $(seq 3000) > src/d/big
printf 'a\n' > src/a
ln src/a src/h
ln -s a src/l
chmod 600 src/a
chmod 755 src/d/big
touch -d @1650000000 src/a src/d/big
tar -czf t.tgz src
tar -tzf t.tgz | sort
mkdir out
tar -xzf t.tgz -C out
diff -r src out/src && echo "tar: same content"
find out/src -mindepth 1 ! -type d -printf '%P|%y|%m|%n|%l\n' | sort
stat -c '%n|%Y|%s' out/src/a out/src/d/big
python3 - <<'EOF'
import hashlib, os, zipfile
with zipfile.ZipFile("t.zip", "w", zipfile.ZIP_DEFLATED) as z:
    for p in ("src/a", "src/d/big"):
        z.write(p)
    z.writestr("src/new.txt", "made in the zip\n")
with zipfile.ZipFile("t.zip") as z:
    print("zip:", z.namelist(), z.testzip())
    z.extractall("z")
for p in ("src/a", "src/d/big", "src/new.txt"):
    print(p, hashlib.sha256(open(os.path.join("z", p), "rb").read()).hexdigest()[:16])
EOF
cmp src/d/big z/src/d/big && echo "zip: same content"
""", stdout=lines(
         "src/", "src/a", "src/d/", "src/d/big", "src/h", "src/l",
         "tar: same content",
         "a|f|600|2|", "d/big|f|755|1|", "h|f|600|2|", "l|l|777|1|a",
         "out/src/a|1650000000|2", "out/src/d/big|1650000000|3000",
         "zip: ['src/a', 'src/d/big', 'src/new.txt'] None",
         "src/a " + hashlib.sha256(b"a\n").hexdigest()[:16],
         "src/d/big " + hashlib.sha256(b"x" * 3000).hexdigest()[:16],
         "src/new.txt " + hashlib.sha256(b"made in the zip\n").hexdigest()[:16],
         "zip: same content")))

case("links", "hard links, symlinks (relative, absolute, dangling, loops, to directories)",
     Step(r"""
echo one > f
ln f h
ln -s f s
ln -s "$PWD/f" abs
ln -s missing dangling
ln -s loop2 loop1
ln -s loop1 loop2
stat -c '%h' f
[ f -ef h ] && echo "f and h: one inode"
readlink s abs
[ "$(readlink -f s)" = "$PWD/f" ] && echo "readlink -f resolves"
[ -L dangling ] && [ ! -e dangling ] && echo "dangling"
cat dangling 2>&1; echo "cat dangling: $?"
cat loop1 2>&1; echo "cat loop: $?"
chmod 600 f; chown 7:8 f; echo two >> h
python3 -c 'import os; s = os.stat("h")
print("through the other name:", oct(s.st_mode & 0o7777), s.st_uid, s.st_gid)'
cat f
rm f
cat h
stat -c '%h' h
cat s 2>&1; echo "cat s after rm: $?"
mkdir d
ln -s d dl
touch dl/x
ls d
ln d dhard 2>&1; echo "ln dir: $?"
mv h f
cat s
python3 -c 'import os; os.link("f", "pyhard"); print(os.stat("f").st_nlink, os.path.samefile("f", "pyhard"))'
""", stdout=lines(
         "2",
         "f and h: one inode",
         "f", "/workspace/corpus/links/f",
         "readlink -f resolves",
         "dangling",
         "cat: dangling: No such file or directory", "cat dangling: 1",
         "cat: loop1: Too many levels of symbolic links", "cat loop: 1",
         "through the other name: 0o600 7 8",
         "one", "two",
         "one", "two", "1",
         "cat: s: No such file or directory", "cat s after rm: 1",
         "x",
         "ln: d: hard link not allowed for directory", "ln dir: 1",
         "one", "two",
         "2 True")))

case("chmod_owner", "modes, set-id and sticky bits, owners, a non-root user's permissions",
     Step(r"""
touch f
chmod 0640 f; stat -c '%a' f
chmod u+s,g+s f; stat -c '%a|%A' f
chmod 0 f; echo root > f && echo "root writes a mode-0 file"
mkdir sticky; chmod 1777 sticky; stat -c '%A' sticky
chown 1000:1000 f; stat -c '%u:%g' f
chown 65534:65534 f; stat -c '%u:%g' f
mkdir sg; chown :1000 sg; chmod 2775 sg
touch sg/x; mkdir sg/sub
stat -c '%n|%g|%A' sg/x sg/sub
echo root-only > rootfile; chmod 644 rootfile
mkdir mine; chown 1000:1000 mine
setpriv --reuid=1000 --regid=1000 --clear-groups bash -c '
    id -u; id -g
    cat rootfile
    echo x > rootfile; echo "write: $?"
    chmod 777 rootfile; echo "chmod: $?"
    echo ok > mine/file && stat -c "%n|%u:%g|%a" mine/file
    touch /etc/corpus 2>/dev/null; echo "touch /etc: $?"
' 2>&1
""", stdout=lines(
         "640",
         "6640|-rwSr-S---",
         "root writes a mode-0 file",
         "drwxrwxrwt",
         "1000:1000",
         "65534:65534",
         "sg/x|1000|-rw-r--r--",
         "sg/sub|1000|drwxr-sr-x",
         "1000", "1000",
         "root-only",
         "bash: line 4: rootfile: Permission denied", "write: 1",
         "chmod: changing permissions of 'rootfile': Operation not permitted", "chmod: 1",
         "mine/file|1000:1000|644",
         "touch /etc: 1")))

case("chown_high_uid", "a uid above 65535 (a real machine has 2^32 uids)",
     Step(r"""
touch f
chown 70000:70000 f 2>&1; echo "chown: $?"
stat -c '%u:%g' f
""", stdout=lines("chown: 0", "70000:70000")))

case("file_locks", "flock(1) and fcntl byte-range locks between processes",
     Step(r"""
flock -n lk -c 'echo "free lock taken"'
mkfifo ready
( exec 9>lk; flock 9; echo held > ready; exec sleep 300 ) &
holder=$!
read r < ready; echo "$r"
flock -n lk true; echo "nonblocking: $?"
flock -w 0.2 lk true; echo "with a wait: $?"
kill $holder; wait $holder; echo "holder: $?"
flock -n lk true; echo "after: $?"
python3 - <<'EOF'
import fcntl, os, subprocess, sys
fd = os.open("rl", os.O_RDWR | os.O_CREAT)
os.write(fd, b"0" * 100)
fcntl.lockf(fd, fcntl.LOCK_EX, 10, 0)
child = r'''
import errno, fcntl, os
fd = os.open("rl", os.O_RDWR)
try:
    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 10, 0)
    print("overlapping range: taken")
except OSError as e:
    print("overlapping range: refused" if e.errno in (errno.EACCES, errno.EAGAIN) else e)
fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 10, 10)
print("other range: taken")
'''
r = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True)
print(r.stdout + r.stderr, end="")
fcntl.lockf(fd, fcntl.LOCK_UN, 10, 0)
r = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True)
print(r.stdout + r.stderr, end="")
EOF
""", stdout=lines(
         "free lock taken",
         "held",
         "nonblocking: 1",
         "with a wait: 1",
         "holder: 143",
         "after: 0",
         "overlapping range: refused", "other range: taken",
         "overlapping range: taken", "other range: taken")))

case("mmap", "shared and private file mappings, and SIGBUS past the end of a file",
     Step(r"""
python3 - <<'EOF'
import mmap, os, subprocess, sys
with open("m.bin", "wb") as f:
    f.truncate(1 << 20)
fd = os.open("m.bin", os.O_RDWR)
m = mmap.mmap(fd, 1 << 20)
m[4096:4101] = b"hello"
m[-5:] = b"world"
reader = "f = open('m.bin', 'rb'); f.seek(4096); a = f.read(5); f.seek(-5, 2); print((a + f.read()).decode())"
print("another process reads:", subprocess.run([sys.executable, "-c", reader], capture_output=True,
                                               text=True).stdout.strip())
os.pwrite(fd, b"XY", 0)
print("a write(2) shows in the map:", m[:2].decode())
p = mmap.mmap(fd, 4096, flags=mmap.MAP_PRIVATE)
p[0:2] = b"pp"
print("private:", p[:2].decode(), "file:", os.pread(fd, 2, 0).decode())
m.flush()
m.close()
p.close()
print("size:", os.fstat(fd).st_size)
beyond = ("import mmap, os\n"
          "fd = os.open('small', os.O_RDWR | os.O_CREAT)\n"
          "os.ftruncate(fd, 8192)\n"
          "m = mmap.mmap(fd, 8192)\n"
          "os.ftruncate(fd, 100)\n"
          "print(m[50], flush=True)\n"
          "print(m[5000])\n")
r = subprocess.run([sys.executable, "-c", beyond], capture_output=True, text=True)
print("past the end:", r.stdout.split(), r.returncode)
EOF
""", stdout=lines(
         "another process reads: helloworld",
         "a write(2) shows in the map: XY",
         "private: pp file: XY",
         "size: 1048576",
         "past the end: ['0'] -7")))

case("large_files", "a file past 4 GiB (sparse), and a disk filled to its limit: ENOSPC, then room again",
     Step(r"""
truncate -s 5G huge
printf Z | dd of=huge bs=1 seek=$((5 * 1024 * 1024 * 1024 - 1)) conv=notrunc status=none
stat -c %s huge
tail -c 1 huge; echo
[ "$(du -k huge | cut -f1)" -le 64 ] && echo "huge is sparse"
rm huge
size=$(df -k --output=size . | tail -1)
[ "$size" -ge $((DISK_MIB * 1024 * 85 / 100)) ] && [ "$size" -le $((DISK_MIB * 1024)) ] \
    && echo "df size within diskMiB" || echo "df size $size KiB for $DISK_MIB MiB"
avail=$(df -k --output=avail . | tail -1)
fallocate -l $(( (avail - 8192) * 1024 )) fill; echo "fallocate: $?"
# dd's message goes to a pipe: a file on this full disk could not take it.
msg=$(dd if=/dev/zero of=over bs=1M count=64 2>&1); echo "dd: $?"
echo "$msg" | grep -o 'No space left on device' | head -1
over=$(stat -c %s over)
[ "$over" -gt 0 ] && [ "$over" -lt $((64 * 1024 * 1024)) ] && echo "dd wrote part"
# python3 -c, not a here-document: bash may keep one in a file on this full disk.
python3 -c '
import errno
try:
    with open("more", "wb") as f:
        for _ in range(64):
            f.write(b"y" * (1 << 20))
    print("python: no error")
except OSError as e:
    print("python:", errno.errorcode.get(e.errno, e.errno))
'
rm -f fill over more
dd if=/dev/zero of=after bs=1M count=16 status=none; echo "after rm: $?"
stat -c %s after
rm after
""", stdout=lines(
         "5368709120", "Z", "huge is sparse",
         "df size within diskMiB",
         "fallocate: 0",
         "dd: 1", "No space left on device", "dd wrote part",
         "python: ENOSPC",
         "after rm: 0", "16777216")))

case("dev_nodes", "/dev/null, /dev/zero, /dev/full, /dev/urandom, /dev/fd, /dev/shm",
     Step(r"""
for d in null zero full random urandom; do
    [ -c /dev/$d ] && echo "$d $(stat -c '%t:%T' /dev/$d)"
done
echo discarded > /dev/null; echo "write null: $?"
wc -c < /dev/null
head -c 4096 /dev/zero | tr -d '\0' | wc -c
echo x > /dev/full; echo "write full: $?"
head -c 1048576 /dev/urandom | wc -c
a=$(head -c 32 /dev/urandom | od -An -tx1); b=$(head -c 32 /dev/urandom | od -An -tx1)
[ "$a" != "$b" ] && echo "two reads differ"
python3 -c 'import os; print(len(set(os.urandom(65536))), "byte values")'
echo piped | cat /dev/stdin
cat <(echo "process substitution")
python3 -c 'import multiprocessing as mp; l = mp.Lock(); l.acquire(); l.release(); print("POSIX semaphore")'
""", stdout=lines(
         "null 1:3", "zero 1:5", "full 1:7", "random 1:8", "urandom 1:9",
         "write null: 0",
         "0", "0",
         "write full: 1",
         "1048576",
         "two reads differ",
         "256 byte values",
         "piped",
         "process substitution",
         "POSIX semaphore"),
          stderr_has="No space left on device"))

# The venv takes pip from the system site: installing a copy of pip into it
# (ensurepip) takes minutes under the microVM's software emulation.
case("python_venv_sqlite", "a venv (its own site-packages, the system's pip), and sqlite3 in WAL mode "
     "across processes",
     Step(r"""
python3 -m venv --without-pip --system-site-packages v
v/bin/python -c 'import sys; print("in a venv:", sys.prefix != sys.base_prefix)'
site=$(v/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
case "$site" in "$PWD"/v/*) echo "site-packages in the venv";; *) echo "site-packages: $site";; esac
echo 'print("venv module")' > "$site/corpus_mod.py"
v/bin/python -c 'import corpus_mod'
python3 -c 'import corpus_mod' 2>/dev/null || echo "not seen outside the venv"
v/bin/python -m pip --version | cut -d' ' -f1
v/bin/python - <<'EOF'
import sqlite3, subprocess, sys
c = sqlite3.connect("t.db", isolation_level=None)
print("journal:", c.execute("pragma journal_mode=wal").fetchone()[0])
c.execute("create table t (k integer primary key, v text)")
c.execute("begin")
c.executemany("insert into t (v) values (?)", [(f"row {i}",) for i in range(1000)])
c.execute("commit")
count = "import sqlite3; print(sqlite3.connect('t.db').execute('select count(*) from t').fetchone()[0])"
write = ("import sqlite3\n"
         "c = sqlite3.connect('t.db', timeout=0, isolation_level=None)\n"
         "try:\n"
         "    c.execute('begin immediate'); print('second writer: in')\n"
         "except sqlite3.OperationalError as e:\n"
         "    print('second writer:', e)\n")
run = lambda code: subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
c.execute("begin immediate")
c.execute("insert into t (v) values ('uncommitted')")
print("reader during a write:", run(count).stdout.strip())
print(run(write).stdout.strip())
c.execute("commit")
print("reader after commit:", run(count).stdout.strip())
print("integrity:", c.execute("pragma integrity_check").fetchone()[0])
c.execute("pragma wal_checkpoint(truncate)")
c.close()
EOF
""", stdout=lines(
         "in a venv: True",
         "site-packages in the venv",
         "venv module",
         "not seen outside the venv",
         "pip",
         "journal: wal",
         "reader during a write: 1000",
         "second writer: database is locked",
         "reader after commit: 1001",
         "integrity: ok")))


GIT_ENV = ("export GIT_AUTHOR_NAME=Corpus GIT_AUTHOR_EMAIL=corpus@example.invalid "
           "GIT_COMMITTER_NAME=Corpus GIT_COMMITTER_EMAIL=corpus@example.invalid "
           "GIT_AUTHOR_DATE='1700000000 +0000' GIT_COMMITTER_DATE='1700000000 +0000'\n")
GIT_FILES = {"a.txt": (b"hello\n", "100644"),
             "d/run.sh": (b"#!/bin/sh\necho run\n", "100755"),
             "link": (b"a.txt", "120000")}


def _git_object(kind: str, body: bytes) -> tuple[str, bytes]:
    raw = f"{kind} {len(body)}\0".encode() + body
    return hashlib.sha1(raw).hexdigest(), raw


def _git_tree(entries: dict[str, tuple[bytes, str]]) -> str:
    """The id git gives a tree of these files (mode, name, binary id; names
    sorted with a directory compared as name + '/')."""
    subdirs: dict[str, dict] = {}
    items = []
    for path, (data, mode) in entries.items():
        head, _, rest = path.partition("/")
        if rest:
            subdirs.setdefault(head, {})[rest] = (data, mode)
        else:
            items.append((path, mode, _git_object("blob", data)[0]))
    for name, sub in subdirs.items():
        items.append((name, "40000", _git_tree(sub)))
    items.sort(key=lambda t: t[0] + ("/" if t[1] == "40000" else ""))
    body = b"".join(f"{mode} {name}\0".encode() + bytes.fromhex(oid) for name, mode, oid in items)
    return _git_object("tree", body)[0]


def _git_first_commit() -> str:
    ident = "Corpus <corpus@example.invalid> 1700000000 +0000"
    body = f"tree {_git_tree(GIT_FILES)}\nauthor {ident}\ncommitter {ident}\n\nfirst\n"
    return _git_object("commit", body.encode())[0]


case("git", "git init, add, commit (the commit id git must compute), status, log, clone, fsck",
     Step(GIT_ENV + r"""
git init -q -b main repo
cd repo
printf 'hello\n' > a.txt
mkdir d
printf '#!/bin/sh\necho run\n' > d/run.sh
chmod +x d/run.sh
ln -s a.txt link
git add -A
git commit -q -m first
git rev-parse HEAD
git ls-files -s | awk '{ print $1, $4 }'
echo more >> a.txt
git status --porcelain
git diff --stat | tail -1
git commit -qam second
git log --format=%s | paste -sd, -
git gc -q && git fsck --no-progress && echo "fsck clean"
git clone -q . ../clone
../clone/d/run.sh
git -C ../clone log -1 --format=%s
""", stdout=lines(
         _git_first_commit(),
         "100644 a.txt", "100755 d/run.sh", "120000 link",
         " M a.txt",
         " 1 file changed, 1 insertion(+)",
         "second,first",
         "fsck clean",
         "run",
         "second")))

case("background_jobs", "jobs, wait, and a detached process that outlives its exec and is reaped",
     Step(r"""
sleep 0.1 & wait $!; echo "wait: $?"
(exit 7) & wait $!; echo "status: $?"
sleep 300 & s=$!
jobs | wc -l
kill $s; wait $s; echo "killed: $?"
for i in 1 2 3; do (echo "job $i" > out.$i) & done; wait
cat out.1 out.2 out.3
nohup sh -c 'echo started > bg.out; while [ ! -e bg.stop ]; do sleep 0.05; done; echo stopped >> bg.out' \
    > /dev/null 2>&1 &
echo $! > bg.pid
while [ ! -s bg.out ]; do sleep 0.05; done
echo "detached: running"
"""),
     Step(r"""
pid=$(cat bg.pid)
kill -0 "$pid" && echo "still running in the next exec"
touch bg.stop
# kill -0 succeeds on a zombie too: the loop ends only once PID 1 reaped it.
while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
cat bg.out
ps -eo stat= | awk '/^Z/ { n++ } END { print n + 0 }'
""", stdout=lines("still running in the next exec", "started", "stopped", "0")))

case("signals", "traps, exit statuses of signals, SIGPIPE, timeout(1), stop and continue",
     Step(r"""
bash -c 'trap "echo got TERM; exit 3" TERM; kill -TERM $$; echo not reached'; echo "trap: $?"
bash -c 'kill -KILL $$'; echo "KILL: $?"
timeout 0.5 sleep 30; echo "timeout: $?"
timeout -s KILL 0.5 sleep 30; echo "timeout -s KILL: $?"
yes | head -c 2 > /dev/null; echo "SIGPIPE: ${PIPESTATUS[0]}"
sleep 300 & p=$!
kill -STOP $p
until [ "$(cut -d' ' -f3 /proc/$p/stat)" = T ]; do sleep 0.02; done; echo "stopped: T"
kill -CONT $p
while [ "$(cut -d' ' -f3 /proc/$p/stat)" = T ]; do sleep 0.02; done; echo "continued"
kill -HUP $p; wait $p; echo "HUP: $?"
python3 - <<'EOF'
import os, signal, time
got = []
signal.signal(signal.SIGUSR1, lambda s, f: got.append("USR1"))
signal.signal(signal.SIGALRM, lambda s, f: got.append("ALRM"))
os.kill(os.getpid(), signal.SIGUSR1)
signal.setitimer(signal.ITIMER_REAL, 0.05)
deadline = time.monotonic() + 30
while len(got) < 2 and time.monotonic() < deadline:
    signal.pause()
print("handlers:", got)
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2})
os.kill(os.getpid(), signal.SIGUSR2)
print("pending:", signal.SIGUSR2 in signal.sigpending())
print("sigwait:", signal.Signals(signal.sigwait({signal.SIGUSR2})).name)
pid = os.fork()
if pid == 0:
    signal.pause()
    os._exit(0)
os.kill(pid, signal.SIGTERM)
_, status = os.waitpid(pid, 0)
print("child:", signal.Signals(os.WTERMSIG(status)).name)
EOF
""", stdout=lines(
         "got TERM", "trap: 3",
         "KILL: 137",
         "timeout: 124",
         "timeout -s KILL: 137",
         "SIGPIPE: 141",
         "stopped: T",
         "continued",
         "HUP: 129",
         "handlers: ['USR1', 'ALRM']",
         "pending: True",
         "sigwait: SIGUSR2",
         "child: SIGTERM")))

# Names in several scripts, both normal forms of one accented letter (two
# different byte strings, so two files), and the 255-byte limit of a name.
UNICODE_NAMES = ["café.txt", "naïve résumé", "日本語.md", "Ελληνικά", "emoji_🙂", "العربية", "קובץ",
                 "mixed ñ-ß-ø", unicodedata.normalize("NFC", "é"), unicodedata.normalize("NFD", "é")]


def _unicode_expected() -> str:
    names = sorted(UNICODE_NAMES, key=lambda n: n.encode())
    out = list(names)
    out += [f"{n}|{n.upper()}" for n in names]
    out += ["./日本語.md"]
    out += ["tar: same names"]
    out += ["renamed: ünïcødé → 終わり"]
    out += ["python listdir: 10 names, 9 after NFC"]
    out += ["raw bytes: [b'\\xff\\xfe.bin']"]
    out += ["255 bytes: ok", "256 bytes: ENAMETOOLONG"]
    return lines(*out)


case("unicode_names", "file names in several scripts and normal forms, raw bytes, the 255-byte limit",
     Step("""
mkdir n && cd n
python3 - <<'EOF'
for n in %r:
    with open(n, "w") as f:
        f.write(n.upper() + "\\n")
EOF
ls -1
for f in *; do printf '%%s|%%s\\n' "$f" "$(cat "$f")"; done
find . -name '*本*'
cd ..
tar -cf n.tar n && mkdir t && tar -xf n.tar -C t
a=$(ls -1 n) && b=$(ls -1 t/n) && [ -n "$a" ] && [ "$a" = "$b" ] && echo "tar: same names"
mkdir r && echo x > 'r/ünïcødé' && mv 'r/ünïcødé' 'r/終わり' && echo "renamed: ünïcødé → $(ls r)"
python3 - <<'EOF'
import errno, os, unicodedata
names = os.listdir("n")
print(f"python listdir: {len(names)} names,",
      len({unicodedata.normalize("NFC", n) for n in names}), "after NFC")
os.mkdir("raw")
open(b"raw/\\xff\\xfe.bin", "wb").close()
print("raw bytes:", os.listdir(b"raw"))
os.mkdir("long")
open("long/" + "日" * 85, "w").close()
print("255 bytes: ok")
try:
    open("long/" + "日" * 85 + "x", "w").close()
    print("256 bytes: created")
except OSError as e:
    print("256 bytes:", errno.errorcode.get(e.errno, e.errno))
EOF
""" % (UNICODE_NAMES,), stdout=_unicode_expected()))


# ---------------------------------------------------------------------------
# Deliberate driver limits. docs/drivers.md, "Behaviour corpus: deliberate
# differences", lists the same (case, driver) pairs with the same reason.


@dataclass
class Limit:
    reason: str
    steps: list[Step]   # what that driver does instead, step for step


def _case(name: str) -> Case:
    return next(c for c in CASES if c.name == name)


# The uid range both namespace-based drivers map (docs/drivers.md, "Uid mapping").
_UID_RANGE = Limit("the user namespace maps uids and gids 0-65535 only",
                   [Step(_case("chown_high_uid").steps[0].script,
                         stdout=lines("chown: changing ownership of 'f': Invalid argument",
                                      "chown: 1", "0:0"))])



def _instead(name: str, replace: dict[str, str | None], **step: object) -> list[Step]:
    """The case's one step with lines of its expected stdout replaced
    (None drops the line): for a limit that changes a line or two."""
    (orig,) = _case(name).steps
    out = [replace.get(line, line) for line in orig.stdout.splitlines()]
    return [Step(orig.script, exit=step.get("exit", orig.exit),
                 stdout="".join(line + "\n" for line in out if line is not None),
                 stderr_has=step.get("stderr_has", orig.stderr_has))]


# gVisor (the pinned runsc, --file-access=shared), docs/drivers.md "gvisor
# (runsc)". A chown outside the mapped range is not refused but has no effect.
_GVISOR_UID_RANGE = Limit(
    "the user namespace maps uids and gids 0-65535 only; runsc answers a chown outside them with success and "
    "leaves the owner as it was",
    [Step(_case("chown_high_uid").steps[0].script, stdout=lines("chown: 0", "0:0"))])
# Its gofer reports st_blocks from the size, not from the blocks the host
# file holds. (runsc 20240729 also failed ls -l's ACL look at a symlink with
# "Bad file descriptor"; the pinned build does not.)
_GVISOR_BLOCKS = Limit(
    "st_blocks follows the size (a sparse file is not sparse to du)",
    _instead("ls_stat_find_du", {"total 0": "total 1", "0\tsparse": "65536\tsparse"}))
_GVISOR_SPARSE = Limit(
    "st_blocks follows the size (a sparse file is not sparse to du)",
    _instead("large_files", {"huge is sparse": None}))
_GVISOR_FIFO = Limit(
    "a fifo on the gofer has two links and refuses chmod, so cp -a copies it without its mode",
    _instead("cp_a", {"fifo|p|644|0:0|1|": "fifo|p|644|0:0|2|"},
             stderr_has="cp: preserving permissions for 'dst/fifo': Operation not permitted"))
# Split where the signals case stops a background job: gVisor hangs up the
# exec's whole process group when another child exits while one is stopped
# (bash's $(cut ...) in the wait loop), even one in a session of its own.
# The same stop, continue and hang-up hold while no other child exits (a
# loop of python3's own), and everything else as written.
_SIG = _case("signals").steps[0]
_SIG_HEAD, _SIG_REST = _SIG.script.split("sleep 300 & p=$!\n", 1)
_SIG_JOB, _SIG_PY = _SIG_REST.split("python3 - <<'EOF'\n", 1)
_SIG_JOB_PY = r"""python3 - <<'EOF'
import os, signal, subprocess, time
p = subprocess.Popen(["sleep", "300"])
def state():
    with open(f"/proc/{p.pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]
os.kill(p.pid, signal.SIGSTOP)
while state() != "T":
    time.sleep(0.02)
print("stopped: T")
os.kill(p.pid, signal.SIGCONT)
while state() == "T":
    time.sleep(0.02)
print("continued")
os.kill(p.pid, signal.SIGHUP)
print("HUP:", 128 - p.wait())
EOF
"""
_GVISOR_SIGHUP = Limit(
    "stopping a background job hangs up the exec's process group (bash exits 129) at the next child's exit",
    [Step(_SIG_HEAD, stdout=lines("got TERM", "trap: 3", "KILL: 137", "timeout: 124", "timeout -s KILL: 137",
                                  "SIGPIPE: 141")),
     Step("sleep 300 & p=$!\n" + _SIG_JOB, exit=129),
     Step(_SIG_JOB_PY, stdout=lines("stopped: T", "continued", "HUP: 129")),
     Step("python3 - <<'EOF'\n" + _SIG_PY,
          stdout=lines("handlers: ['USR1', 'ALRM']", "pending: True", "sigwait: SIGUSR2", "child: SIGTERM"))])

DRIVER_LIMITS: dict[tuple[str, str], Limit] = {
    ("chown_high_uid", "namespace"): _UID_RANGE,
    ("chown_high_uid", "gvisor"): _GVISOR_UID_RANGE,
    ("ls_stat_find_du", "gvisor"): _GVISOR_BLOCKS,
    ("large_files", "gvisor"): _GVISOR_SPARSE,
    ("cp_a", "gvisor"): _GVISOR_FIFO,
    ("signals", "gvisor"): _GVISOR_SIGHUP,
}

DOCS = REPO / "docs" / "drivers.md"
DOCS_SECTION = "## Behaviour corpus: deliberate differences"


def documented_limits() -> dict[tuple[str, str], str]:
    """(case, driver) -> reason, from the table of the docs section."""
    text = DOCS.read_text()
    assert DOCS_SECTION in text, f"{DOCS} lacks the section {DOCS_SECTION!r}"
    section = text.split(DOCS_SECTION, 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) < 3 or set(cells[0]) <= set("-: "):
            continue
        if cells[0] == "case":
            continue
        rows[(cells[0].strip("`"), cells[1].strip("`"))] = cells[2]
    return rows


# ---------------------------------------------------------------------------
# Running


CASE_ROOT = "/workspace/corpus"


@pytest.fixture(scope="module", params=DRIVERS)
def corpus_box(request, daemon):
    """One sandbox per driver for the whole corpus."""
    skip_unless_driver(daemon, request.param)
    api = Api(daemon, timeout=max(STEP_TIMEOUT_MS.values()) / 1000 + 60)
    try:
        box = api.create_sandbox(driver=request.param, diskMiB=DISK_MIB, timeoutSeconds=3600)
        yield box
    finally:
        problems = api.delete_all()
        api.close()
        assert not problems, problems


def run_step(box: Sandbox, name: str, step: Step) -> dict:
    script = (f"export LC_ALL=C DISK_MIB={DISK_MIB}\n"
              f"mkdir -p {CASE_ROOT}/{name} && cd {CASE_ROOT}/{name} || exit 99\n" + step.script)
    # As root: cases chown, setpriv and write as root by design (the kernel's
    # behaviour is what they compare); test_sandbox_user.py covers the user.
    return box.exec(script, timeoutMs=STEP_TIMEOUT_MS.get(box.driver, DEFAULT_STEP_TIMEOUT_MS), user="root")


def check_step(res: dict, step: Step) -> list[str]:
    wrong = []
    if res["timedOut"]:
        wrong.append("timed out")
    if res["exitCode"] != step.exit:
        wrong.append(f"exit code {res['exitCode']}, expected {step.exit}")
    if step.stdout is not None and res["stdout"] != step.stdout:
        diff = difflib.unified_diff(step.stdout.splitlines(), res["stdout"].splitlines(),
                                    "expected", "got", n=1, lineterm="")
        wrong.append("stdout differs:\n" + "\n".join(list(diff)[2:40]))
    if step.stderr_has is not None and step.stderr_has not in res["stderr"]:
        wrong.append(f"stderr lacks {step.stderr_has!r}")
    return wrong


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_corpus(corpus_box, case):
    limit = DRIVER_LIMITS.get((case.name, corpus_box.driver))
    steps = limit.steps if limit else case.steps
    for i, step in enumerate(steps):
        res = run_step(corpus_box, case.name, step)
        wrong = check_step(res, step)
        if wrong:
            what = (f"documented limit of {corpus_box.driver} ({limit.reason}) no longer holds"
                    if limit else f"{case.what}: differs on {corpus_box.driver}")
            pytest.fail(f"{case.name} step {i + 1}: {what}\n" + "\n".join(wrong) +
                        f"\n--- stdout\n{res['stdout'][-3000:]}\n--- stderr\n{res['stderr'][-3000:]}",
                        pytrace=False)


def test_limits_match_the_docs():
    documented = documented_limits()
    ours = {k: v.reason for k, v in DRIVER_LIMITS.items()}
    assert documented == ours, (f"docs/drivers.md ({DOCS_SECTION}) and DRIVER_LIMITS differ:\n"
                                f"  only in the docs: {sorted(set(documented) - set(ours))}\n"
                                f"  only in the test: {sorted(set(ours) - set(documented))}\n"
                                f"  reasons: docs {documented}\n           test {ours}")
    names = {c.name for c in CASES}
    for case_name, driver in DRIVER_LIMITS:
        assert case_name in names, f"a limit names no case: {case_name}"
        assert driver in ("namespace", "gvisor", "microvm"), f"a limit names no driver: {driver}"
