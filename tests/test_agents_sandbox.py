"""The agents' sandbox: every limit stops a misbehaving command and says which, and the next
command runs as if nothing happened. Real processes, real limits, real namespaces where the
machine has them (CI runs as root in a container: all of them); what a machine lacks is skipped
with the reason isolation() gives."""
from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from clawrl.agents.sandbox import Limits, Sandbox, isolation

TIGHT = Limits(cpu_s=1, memory_mb=256, file_mb=1, procs=16, timeout_s=3, disk_mb=4,
               output_chars=2000)


def run(box: Sandbox, *argv: str, stdin: str | None = None):
    return asyncio.run(box.run(list(argv), stdin=stdin))


def alive_as(uid: int, patience: float = 10) -> list[int]:
    """Live (not zombie) processes of `uid`, once the kernel has finished tearing the namespace
    down (SIGKILL is delivered at once, the exit of each process a moment later)."""
    deadline = time.monotonic() + patience
    while True:
        out = []
        for entry in os.listdir("/proc"):
            try:
                if entry.isdigit() and os.stat(f"/proc/{entry}").st_uid == uid and \
                        Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                    out.append(int(entry))
            except OSError:
                pass
        if not out or time.monotonic() > deadline:
            return out
        time.sleep(0.1)


@pytest.fixture
def box():
    with Sandbox(TIGHT) as b:
        yield b


def assert_still_works(box: Sandbox) -> None:
    r = run(box, "python", "-c", "print('still here')")
    assert (r.exit_code, r.stopped, r.output) == (0, None, "still here\n")


def test_a_plain_command_runs_in_its_folder(box):
    box.write("in.txt", "hello\n")
    box.seal()
    r = run(box, "bash", "-c", "cat in.txt | tr a-z A-Z > out.txt && pwd && echo $HOME")
    assert r.exit_code == 0 and r.stopped is None
    assert r.output.split() == [str(box.work), str(box.work)]
    assert box.read("out.txt") == "HELLO\n"


def test_an_endless_loop_is_stopped_by_cpu_time_or_the_timeout(box):
    r = run(box, "python", "-c", "while True: pass")
    assert r.stopped in ("cpu time", "timeout") and r.exit_code != 0
    assert_still_works(box)


def test_a_command_that_waits_forever_is_killed_at_the_timeout(box):
    r = run(box, "bash", "-c", "sleep 600")
    assert (r.stopped, r.exit_code) == ("timeout", None)
    assert_still_works(box)


@pytest.mark.parametrize("writer", [
    ["python", "-c", "f = open('big', 'wb')\nwhile True: f.write(b'x' * 65536)"],
    ["bash", "-c", "yes > big"],
], ids=["python", "shell"])
def test_a_huge_file_is_stopped_at_the_file_size_limit(box, writer):
    r = run(box, *writer)
    assert r.stopped == "file size" and r.exit_code != 0
    assert (box.work / "big").stat().st_size <= TIGHT.file_mb << 20
    assert_still_works(box)


def test_many_files_past_the_folder_quota_are_stopped_as_disk(box):
    # Each file is under the file size limit; together they pass disk_mb.
    r = run(box, "bash", "-c", "for i in $(seq 8); do head -c 900000 /dev/zero > f$i; done")
    assert r.stopped == "disk"


@pytest.mark.parametrize("bomb", [
    ["python", "-c", "import os\nwhile True: os.fork()"],
    ["bash", "-c", "while true; do sleep 60 & done"],
], ids=["python-fork", "shell-background"])
def test_forking_repeatedly_is_stopped_by_the_process_limit(box, bomb):
    if not (isolation().namespaces or isolation().own_uid or os.geteuid() != 0):
        pytest.skip(f"root without a private uid or namespaces: {isolation().notes}")
    r = run(box, *bomb)
    assert r.stopped == "processes"
    if box.uid is not None:   # nothing of it survives
        assert alive_as(box.uid) == []
    assert_still_works(box)


def test_opening_a_network_socket_stops_the_command(box):
    if not isolation().seccomp:
        pytest.skip(f"no seccomp here: {isolation().notes}")
    r = run(box, "python", "-c", "import socket\ns = socket.socket()\ns.connect(('10.1.2.3', 80))")
    assert r.stopped == "network" and r.exit_code != 0
    # Also when the socket is opened by a child the shell outlives.
    r = run(box, "bash", "-c", "python -c 'import socket; socket.socket(socket.AF_INET6)'; echo after")
    assert r.stopped == "network"
    # Unix sockets (asyncio's self-pipe, socketpair) are not network.
    r = run(box, "python", "-c", "import asyncio, socket\nsocket.socketpair()\n"
                                 "asyncio.run(asyncio.sleep(0))\nprint('ok')")
    assert (r.stopped, r.output) == (None, "ok\n")


def test_there_is_no_network_interface_but_loopback(box):
    if not isolation().namespaces:
        pytest.skip(f"no network namespace here: {isolation().notes}")
    r = run(box, "cat", "/proc/net/dev")
    names = {line.split(":")[0].strip() for line in r.output.splitlines() if ":" in line}
    assert names == {"lo"}


def test_too_much_memory_is_stopped_as_memory(box):
    r = run(box, "python", "-c", "x = bytearray(400 << 20)")
    assert r.stopped == "memory"


def test_output_is_clipped_to_its_head_and_tail(box):
    r = run(box, "bash", "-c", "echo START; yes | head -c 3000000; echo END")
    assert r.exit_code == 0 and r.stopped is None
    assert r.output.startswith("START") and r.output.rstrip().endswith("END")
    assert "bytes of output cut" in r.output and len(r.output) < 2 * TIGHT.output_chars


def test_a_process_that_leaves_the_group_is_still_killed(box):
    if box.uid is None:
        pytest.skip("without a private uid the survivors cannot be told apart")
    r = run(box, "bash", "-c", "setsid sleep 600 & sleep 600")
    assert r.stopped == "timeout"
    assert alive_as(box.uid) == []


def test_the_sandbox_cannot_read_private_files(tmp_path):
    if not isolation().own_uid:
        pytest.skip(f"commands run as this user here: {isolation().notes}")
    secret = Path("/tmp") / f"clawrl-secret-{os.getpid()}"
    secret.write_text("turn log")
    secret.chmod(0o600)
    try:
        with Sandbox(TIGHT) as b:
            r = run(b, "cat", str(secret))
        assert r.exit_code != 0 and "Permission denied" in r.output
    finally:
        secret.unlink()


def test_verifier_reads_do_not_follow_links_out_of_the_sandbox(box):
    run(box, "ln", "-s", "/etc/hostname", "count.txt")
    assert box.read("count.txt") is None
    with pytest.raises(ValueError):
        box.path("../../etc/hostname")


def test_sandboxes_run_side_by_side(box):
    async def many():
        with Sandbox(TIGHT) as other:
            return await asyncio.gather(box.run(["bash", "-c", "sleep 600"]),
                                        other.run(["python", "-c", "print(6 * 7)"]),
                                        box.run(["python", "-c", "while True: pass"]))
    slow, ok, loop = asyncio.run(many())
    assert slow.stopped == "timeout" and ok.output == "42\n" and loop.stopped in ("cpu time", "timeout")
