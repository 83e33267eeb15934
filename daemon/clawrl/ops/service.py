"""Installing the daemon as a systemd service: render a unit from recipes/systemd/ and write it.

The unit runs this installation's `clawrl serve`, so the service gets the Python environment of
the command that installed it. Installing writes the unit and reloads systemd; enabling and
starting it is left to the operator, who is told the commands. What the daemon says to systemd
once it runs is serve/sdnotify.py's.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from ..config import REPO_RECIPES
from ..errors import ClawrlError

UNITS = REPO_RECIPES / "systemd"
UNIT_NAME = "clawrl.service"
SYSTEM_DIR = Path("/etc/systemd/system")
# Where the home is when none is given: the CLI's own default for a user unit, so that `clawrl
# status` and the service share a turn log; the unit's StateDirectory (/var/lib/clawrl) otherwise.
DEFAULT_HOME = {True: "%h/.clawrl", False: "%S/clawrl"}


def user_unit_dir() -> Path:
    return Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "systemd" / "user"


def _word(arg: str) -> str:
    """One word of an ExecStart= line: `%` (specifiers) and `$` (variables) are doubled, and a word
    with blanks, quotes or backslashes is double-quoted with C escapes."""
    arg = arg.replace("%", "%%").replace("$", "$$")
    if arg and not re.search(r"[\s\"'\\]", arg):
        return arg
    return '"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _assignment(name: str, value: str) -> str:
    """`NAME=value` for Environment=, quoted as a whole when it has to be."""
    text = f"{name}={value.replace('%', '%%')}"
    if not re.search(r"[\s\"'\\]", text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def exec_start() -> str:
    """This installation's `clawrl serve`: the script installed beside this Python, else
    `python -m clawrl`. Not the first `clawrl` on PATH, which may belong to another install."""
    script = Path(sys.executable).parent / "clawrl"
    argv = [str(script)] if os.access(script, os.X_OK) else [sys.executable, "-m", "clawrl"]
    return " ".join(_word(a) for a in [*argv, "serve"])


def render(user: bool, exec_start: str, home: str | None = None) -> str:
    """The unit text: the system or user template with ExecStart= and CLAWRL_HOME filled in.
    `exec_start` is a ready command line; `home` an absolute path (None: the unit's default)."""
    text = (UNITS / ("clawrl-user.service" if user else "clawrl.service")).read_text()
    home_env = _assignment("CLAWRL_HOME", home) if home else f"CLAWRL_HOME={DEFAULT_HOME[user]}"
    return text.replace("@EXEC_START@", exec_start).replace("CLAWRL_HOME=@CLAWRL_HOME@", home_env)


def _systemctl(user: bool) -> str:
    return "systemctl --user" if user else "systemctl"


def _daemon_reload(user: bool) -> str:
    cmd = f"{_systemctl(user)} daemon-reload"
    if not Path("/run/systemd/system").exists():
        return f"systemd is not running here: run `{cmd}` on the machine that runs it"
    try:
        r = subprocess.run(cmd.split(), capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"`{cmd}` did not run ({e}): run it yourself"
    if r.returncode:
        return f"`{cmd}` failed ({r.stderr.strip() or r.returncode}): run it yourself"
    return f"ran `{cmd}`"


def install(user: bool, dry_run: bool, unit_dir: Path | None = None,
            home: str | None = None) -> tuple[Path, str, list[str]]:
    """Write the unit (unless `dry_run`) and reload systemd. `unit_dir` replaces the standard
    place (tests); systemd is then left alone. Returns the path, the text and what was done."""
    path = (unit_dir or (user_unit_dir() if user else SYSTEM_DIR)) / UNIT_NAME
    if home:
        home = str(Path(home).expanduser().absolute())  # systemd expands neither ~ nor relative paths
    text = render(user, exec_start(), home)
    if dry_run:
        return path, text, [f"dry run: {path} was not written"]
    tmp = path.with_name(f".{UNIT_NAME}.tmp")   # not a unit name: systemd never reads it half-written
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text)
        tmp.chmod(0o644)
        os.replace(tmp, path)
    except PermissionError as e:
        raise ClawrlError(f"cannot write {path} ({e.strerror}): install the system unit as root "
                          "(sudo clawrl install-service), or a unit for your user with --user") from None
    messages = [f"wrote {path}"]
    if unit_dir is None:
        messages.append(_daemon_reload(user))
    return path, text, messages


def cmd_install_service(args) -> int:
    """`clawrl install-service [--user] [--dry-run]`. With --dry-run the unit goes to stdout (so it
    can be redirected to a file) and the rest to stderr."""
    user, dry_run = bool(args.user), bool(args.dry_run)
    path, text, messages = install(user, dry_run, home=os.environ.get("CLAWRL_HOME"))
    out = sys.stderr if dry_run else sys.stdout
    if dry_run:
        print(text, end="")
    for line in messages:
        print(line, file=out)
    # The service sees only its unit's environment; say so rather than lose a setting quietly.
    unseen = sorted(k for k in os.environ if k.startswith("CLAWRL_") and k != "CLAWRL_HOME")
    if unseen:
        print(f"note: the service does not see {', '.join(unseen)} from this shell; add them with "
              f"`{_systemctl(user)} edit clawrl` ([Service] Environment=NAME=value)", file=out)
    sudo = "" if user or os.geteuid() == 0 else "sudo "
    journal = "journalctl --user" if user else "journalctl"
    print("next:", file=out)
    print(f"  {sudo}{_systemctl(user)} enable --now clawrl", file=out)
    print(f"  {journal} -u clawrl -f", file=out)
    if user:
        print("  loginctl enable-linger   # to keep it running while you are logged out", file=out)
    return 0
