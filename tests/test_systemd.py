"""Running as a systemd service: the sd_notify datagrams a real `clawrl serve` sends on a real
NOTIFY_SOCKET, SIGTERM draining, and the unit files, rendered and checked by systemd-analyze."""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest

from clawrl.serve import sdnotify
from clawrl.ops import service
from conftest import Daemon, make_home


class NotifySocket:
    """What systemd listens on: a unix datagram socket; `messages` are (arrival time, fields)."""

    def __init__(self, address: str):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind("\0" + address[1:] if address.startswith("@") else address)
        self.address = address
        self.messages: list[tuple[float, list[str]]] = []

    def next(self, timeout: float) -> list[str] | None:
        self.sock.settimeout(timeout)
        try:
            fields = self.sock.recv(65536).decode().split("\n")
        except socket.timeout:
            return None
        self.messages.append((time.monotonic(), fields))
        return fields

    def wait_for(self, field: str, timeout: float) -> list[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            fields = self.next(max(0.01, deadline - time.monotonic()))
            if fields and field in fields:
                return fields
        raise AssertionError(f"no {field} within {timeout} s; got {[m for _, m in self.messages]}")

    def received(self, field: str, since: float = 0.0) -> int:
        return sum(field in m for t, m in self.messages if t >= since)

    def statuses(self) -> list[str]:
        return [f[len("STATUS="):] for _, m in self.messages for f in m if f.startswith("STATUS=")]

    def close(self) -> None:
        self.sock.close()


# -- the protocol ------------------------------------------------------------------------------------

def test_send_reaches_an_abstract_socket_and_is_a_no_op_without_one():
    listener = NotifySocket(f"@clawrl-test-{uuid.uuid4().hex}")
    try:
        assert sdnotify.send(listener.address, "READY=1", "STATUS=fine")
        assert listener.next(5) == ["READY=1", "STATUS=fine"]
    finally:
        listener.close()
    assert sdnotify.send(None, "READY=1") is False
    assert sdnotify.send(f"@clawrl-test-{uuid.uuid4().hex}", "READY=1") is False  # nobody listens


def test_watchdog_period_is_half_the_timeout_and_only_for_the_watched_pid():
    me = str(os.getpid())
    assert sdnotify.watchdog_period({"WATCHDOG_USEC": "60000000"}) == 30.0
    assert sdnotify.watchdog_period({"WATCHDOG_USEC": "1000000", "WATCHDOG_PID": me}) == 0.5
    assert sdnotify.watchdog_period({"WATCHDOG_USEC": "1000000", "WATCHDOG_PID": "1"}) is None
    assert sdnotify.watchdog_period({}) is None
    assert sdnotify.watchdog_period({"WATCHDOG_USEC": "soon"}) is None


# -- the daemon under a notify socket ------------------------------------------------------------------

@pytest.mark.model
def test_daemon_notifies_ready_status_watchdog_and_stopping(tmp_path):
    listener = NotifySocket(str(tmp_path / "notify.sock"))
    d = Daemon(make_home(tmp_path / "home"),
               env={"NOTIFY_SOCKET": listener.address, "WATCHDOG_USEC": "1000000"})
    failed: list[BaseException] = []

    def start():
        try:
            d.start()
        except BaseException as e:  # noqa: BLE001 - reported below
            failed.append(e)

    starter = threading.Thread(target=start, daemon=True)
    starter.start()
    try:
        ready = listener.wait_for("READY=1", timeout=300)
        # The moment READY arrives the port must accept connections and the model must be loaded.
        r = httpx.get(f"{d.url}/readyz", timeout=5)
        assert r.status_code == 200, r.text
        model = r.json()["model"]
        ready_at = listener.messages[-1][0]
        before = [m for t, m in listener.messages if t < ready_at]
        assert any("WATCHDOG=1" in m for m in before), "pings must start before the model is loaded"
        assert any(f.startswith("STATUS=loading") for m in before for f in m)
        assert any(f.startswith("STATUS=serving") and model in f for f in ready)

        starter.join(60)
        assert not failed, failed
        time.sleep(2.6)                          # pings every 0.5 s (half of WATCHDOG_USEC)
        while listener.next(0.05):
            pass
        assert listener.received("WATCHDOG=1", since=ready_at) >= 4
        assert listener.received("READY=1") == 1

        # SIGTERM mid-response: STOPPING=1 at once, the response still completes, exit 0.
        body = {"model": "m", "stream": True, "max_tokens": 48, "temperature": 0.8,
                "messages": [{"role": "user", "content": "Write a long essay about rivers."}]}
        chunks, done = [], []
        with httpx.stream("POST", f"{d.url}/v1/chat/completions", json=body, timeout=120) as resp:
            turn_id = int(resp.headers["x-clawrl-turn-id"])
            for line in resp.iter_lines():
                if line.startswith("data: ") and not chunks:
                    d.proc.send_signal(signal.SIGTERM)
                    listener.wait_for("STOPPING=1", timeout=10)
                if line == "data: [DONE]":
                    done.append(line)
                elif line.startswith("data: "):
                    chunks.append(json.loads(line[6:]))
        assert done and chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
        assert d.proc.wait(timeout=60) == 0, d.log.read_text()[-3000:]
        assert d.turn(turn_id)["status"] == "complete"
        assert listener.received("READY=1") == 1
        assert any(s.startswith("stopping") for s in listener.statuses())
    finally:
        d.stop()
        listener.close()


# -- the unit files ------------------------------------------------------------------------------------

def analyze(unit: Path, user: bool, tmp_path: Path) -> subprocess.CompletedProcess:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze is not installed (it comes with systemd)")
    runtime = tmp_path / "runtime"              # a user manager needs one, even to verify
    runtime.mkdir(mode=0o700, exist_ok=True)
    return subprocess.run([tool, *(["--user"] if user else []), "verify", str(unit)],
                          env={**os.environ, "XDG_RUNTIME_DIR": str(runtime)},
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("user", [False, True], ids=["system", "user"])
def test_rendered_units_pass_systemd_analyze_verify(tmp_path, user):
    text = service.render(user, service.exec_start(), home=str(tmp_path / "a home with 100% space"))
    assert "@EXEC_START@" not in text and "@CLAWRL_HOME@" not in text
    unit = tmp_path / "units" / "clawrl.service"
    unit.parent.mkdir()
    unit.write_text(text)
    r = analyze(unit, user, tmp_path)
    assert r.returncode == 0 and not r.stdout.strip() and not r.stderr.strip(), r.stdout + r.stderr
    # systemd-analyze checks what it checks: a unit that names a missing program must fail.
    unit.write_text(service.render(user, "/nonexistent/clawrl serve"))
    assert analyze(unit, user, tmp_path).returncode != 0


def test_units_say_type_notify_watchdog_and_where_the_home_is():
    system = service.render(False, "/opt/clawrl/bin/clawrl serve")
    user = service.render(True, "/opt/clawrl/bin/clawrl serve")
    for text in (system, user):
        assert "\nType=notify\n" in text and "\nNotifyAccess=main\n" in text
        assert "\nWatchdogSec=60\n" in text and "\nKillMode=mixed\n" in text
        assert "\nExecStart=/opt/clawrl/bin/clawrl serve\n" in text
    assert "\nEnvironment=CLAWRL_HOME=%S/clawrl\n" in system and "WantedBy=multi-user.target" in system
    assert "\nEnvironment=CLAWRL_HOME=%h/.clawrl\n" in user and "WantedBy=default.target" in user


def test_install_dry_run_runs_this_installations_clawrl(tmp_path):
    path, text, messages = service.install(user=True, dry_run=True, unit_dir=tmp_path)
    assert path == tmp_path / "clawrl.service" and not path.exists()
    (line,) = [x for x in text.splitlines() if x.startswith("ExecStart=")]
    script = Path(sys.executable).parent / "clawrl"
    want = f"{script} serve" if script.exists() else f"{sys.executable} -m clawrl serve"
    assert line == f"ExecStart={want}"
    assert any("dry run" in m for m in messages)


def test_install_writes_the_unit(tmp_path):
    target = tmp_path / "etc" / "systemd" / "system"
    path, text, messages = service.install(user=False, dry_run=False, unit_dir=target,
                                           home=str(tmp_path / "state"))
    assert path == target / "clawrl.service" and path.read_text() == text
    assert f"\nEnvironment=CLAWRL_HOME={tmp_path / 'state'}\n" in text
    assert oct(path.stat().st_mode & 0o777) == "0o644"
    assert messages == [f"wrote {path}"]           # a test root: systemd is left alone
    assert [p.name for p in target.iterdir()] == ["clawrl.service"]


def test_install_service_command_prints_the_next_steps(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("CLAWRL_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(service, "_daemon_reload", lambda user: "ran `systemctl --user daemon-reload`")
    args = type("Args", (), {"user": True, "dry_run": False})()
    assert service.cmd_install_service(args) == 0
    out = capsys.readouterr().out
    unit = tmp_path / "config" / "systemd" / "user" / "clawrl.service"
    assert f"wrote {unit}" in out and f"CLAWRL_HOME={tmp_path / 'home'}" in unit.read_text()
    assert "systemctl --user enable --now clawrl" in out and "journalctl --user -u clawrl -f" in out
