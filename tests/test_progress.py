"""Progress while materializing: the display on a terminal, quiet elsewhere, callbacks, waits."""

from __future__ import annotations

import fcntl
import io
import json
import logging
import os
import pty
import struct
import subprocess
import sys
import termios
import textwrap
import types
from pathlib import Path

import numpy as np
import pytest

import snapstore
from snapstore.storage import claims
from snapstore.storage.store import LocalStore
from snapstore.write import progress
from snapstore.write.jobs import partition_layout
from snapstore.write.progress import Display, Reporter, interactive, open_reporter

SCRIPT = """
import logging, sys, threading
import numpy as np
import snapstore
from snapstore.write import progress

root = sys.argv[1]
logging.getLogger("snapstore").setLevel(logging.ERROR)  # miss explanations: not on trial here
drawn = threading.Event()
draw = progress.Display._draw

def _draw(self, force):
    draw(self, force)
    if self._bar is not None:
        drawn.set()

progress.Display._draw = _draw

@snapstore.snapshot(root=root)
def plain(n):
    for i in range(n):
        yield {"x": i}

@snapstore.snapshot(root=root, partition_by="items", engine="thread", workers=1)
def parts(items):
    for i in items:
        yield {"x": i}

@snapstore.snapshot(root=root, ignore_globals=["drawn"])
def interrupted(n):
    for i in range(n):
        yield {"x": np.full(4096, i, np.int64)}  # 32 KiB: blocks are written as it runs
    if sys.stderr.isatty():
        drawn.wait(60)  # the display has drawn a block (or its first refresh)
    raise KeyboardInterrupt  # as a Ctrl-C would

def case(name):
    print(f"== {name}", file=sys.stderr, flush=True)

case("default")
plain(300).materialize()
case("off")
plain(301).materialize(progress=False)
case("callable")
calls = []
plain(302).materialize(progress=lambda samples, stored: calls.append(samples))
case("partitioned")
parts(list(range(3))).materialize()
case("interrupted")
try:
    interrupted(40).materialize()
except KeyboardInterrupt:
    print("interrupted", file=sys.stderr, flush=True)
case("end")
print(calls[-1])
"""


def screen(text: str) -> list[str]:
    """What a terminal shows for ``text``: a carriage return goes back to the line's start."""
    lines: list[str] = []
    line: list[str] = []
    col = 0
    for char in text.replace("\r\n", "\n"):
        if char == "\n":
            lines.append("".join(line).rstrip())
            line, col = [], 0
        elif char == "\r":
            col = 0
        else:
            line[col : col + 1] = [char]
            col += 1
    return [*lines, "".join(line).rstrip()]


def cases(text: str) -> dict[str, list[str]]:
    """The screen lines printed under each ``== name`` marker of SCRIPT."""
    out: dict[str, list[str]] = {}
    name = ""
    for row in screen(text):
        if row.startswith("== "):
            name = row[3:]
            out[name] = []
        elif row.strip():
            out.setdefault(name, []).append(row)
    return out


def run_script(
    tmp_path: Path, on_pty: bool, source: str = SCRIPT, columns: int = 160
) -> tuple[str, str]:
    """SCRIPT's (or ``source``'s) stderr (on a pseudo-terminal ``columns`` wide, or a pipe)
    and stdout."""
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(source))
    args = [sys.executable, str(script), str(tmp_path / ("pty" if on_pty else "pipe"))]
    if not on_pty:
        done = subprocess.run(args, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stderr, done.stdout
    leader, follower = pty.openpty()
    # A terminal of 40 rows and 160 columns (a new pseudo-terminal has 0 of each).
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    with subprocess.Popen(
        args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=follower
    ) as proc:
        os.close(follower)
        chunks = []
        while True:
            try:
                data = os.read(leader, 1 << 16)
            except OSError:  # EIO: the script exited and the terminal closed
                break
            if not data:
                break
            chunks.append(data)
        stdout = proc.stdout.read().decode() if proc.stdout else ""
    os.close(leader)
    assert proc.returncode == 0, b"".join(chunks).decode(errors="replace")
    return b"".join(chunks).decode(), stdout


def test_a_display_on_a_terminal_and_none_in_a_pipe(tmp_path: Path) -> None:
    text, stdout = run_script(tmp_path, on_pty=True)
    shown = cases(text)
    # Redrawn in place: the bar's final line remains, then where the time went.
    line, said = shown["default"]
    assert said.startswith("snapstore: materialized 300 samples (") and "your stage" in said
    assert line.startswith("script.plain: 300 samples, ") and "B stored [00:0" in line
    assert line.endswith("B/s]") and " samples/s, " in line
    assert shown["off"] == []  # progress=False
    assert shown["callable"] == [] and stdout.strip() == "302"  # the callable, and no display
    bar, said = shown["partitioned"]
    assert said.startswith("snapstore: materialized 3 samples (") and "3 partitions" in said
    assert "100%" in bar and "3/3 partitions [" in bar and "3 samples, " in bar
    assert shown["interrupted"] == ["interrupted"]  # the display was cleared, not left half-drawn

    text, stdout = run_script(tmp_path, on_pty=False)
    assert [line for line in text.splitlines() if not line.startswith("== ")] == ["interrupted"]
    assert stdout.strip() == "302"


LOG_SCRIPT = """
import logging, sys, threading, warnings
import snapstore
from snapstore.write import progress

root = sys.argv[1]
logging.getLogger("snapstore").setLevel(logging.ERROR)  # miss explanations: not on trial here
drawn = threading.Event()
draw = progress.Display._draw

def _draw(self, force):
    draw(self, force)
    if self._bar is not None:
        drawn.set()

progress.Display._draw = _draw

@snapstore.snapshot(root=root, ignore_globals=["drawn"])
def logged(n):
    for i in range(n):
        yield {"x": i}
        if i == 1000:
            drawn.wait(60)  # the display is up
            logging.getLogger("user").warning("careful: sample %d is odd", i)
        if i == 1500 and n == 2000:
            warnings.warn(f"sample {i} is odd too", stacklevel=1)

def case(name):
    print(f"== {name}", file=sys.stderr, flush=True)

last_resort = logging.lastResort
case("no logging configured")
logged(2000).materialize()
drawn.clear()
logging.basicConfig(format="%(levelname)s %(message)s")
case("configured")
logged(2001).materialize()
case("end")
handler = logging.getLogger().handlers[0]
print(handler.stream is sys.stderr, logging.lastResort is last_resort)
print(warnings.showwarning is warnings._showwarning_orig)
"""


def test_a_warning_logged_while_the_display_is_up_is_written_above_it(tmp_path: Path) -> None:
    text, stdout = run_script(tmp_path, on_pty=True, source=LOG_SCRIPT)
    shown = cases(text)
    bare, configured = shown["no logging configured"], shown["configured"]
    assert bare[0] == "careful: sample 1000 is odd"  # a line of its own, not inside the bar
    assert bare[1].endswith(": UserWarning: sample 1500 is odd too")  # a warning, likewise
    assert bare[2].strip().startswith("warnings.warn(")  # its source line
    assert configured[0] == "WARNING careful: sample 1000 is odd"  # the handler's own format
    # Then the bar, redrawn in place, and where the time went.
    assert len(bare) == 5 and len(configured) == 3
    assert bare[3].startswith("script.logged: 2k samples, ") and bare[3].endswith("B/s]")
    assert configured[1].startswith("script.logged: 2k samples, ")
    assert bare[4].startswith("snapstore: materialized 2,000 samples (")
    assert configured[2].startswith("snapstore: materialized 2,001 samples (")
    assert stdout.split() == ["True", "True", "True"]  # the streams were put back


def test_logs_above_bar_swaps_only_the_streams_of_the_same_terminal() -> None:
    display = io.StringIO()
    same, other = logging.StreamHandler(display), logging.StreamHandler(io.StringIO())
    logger = logging.getLogger("test_progress.above")
    for handler in (same, other):
        logger.addHandler(handler)
    try:
        logs = progress.LogsAboveBar(display)
        logs.start()
        assert same.stream is not display and other.stream is not display
        logger.warning("above")
        assert display.getvalue() == "above\n"
        logs.stop()
        assert same.stream is display
    finally:
        for handler in (same, other):
            logger.removeHandler(handler)


def test_a_terminal_of_no_width_gets_80_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    """Some CI pseudo-terminals report 0 columns: tqdm drew empty lines there."""
    monkeypatch.delenv("COLUMNS", raising=False)
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 0, 0, 0, 0))
    stream = io.TextIOWrapper(os.fdopen(follower, "wb", buffering=0), write_through=True)
    try:
        assert progress.terminal_columns(stream) == progress.FALLBACK_COLUMNS == 80
        display = Display("prep.stage", file=stream)
        display(400, 4000)
        display.close(ok=True)
        os.set_blocking(leader, False)
        text = os.read(leader, 1 << 16).decode()
    finally:
        stream.close()
        os.close(leader)
    lines = [line for line in screen(text) if line]
    assert lines == [lines[-1]] and lines[-1].startswith("prep.stage: 400 samples, 4kB stored [")
    assert len(lines[-1]) <= 80


def test_terminal_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "120")
    assert progress.terminal_columns(io.StringIO()) is None  # not a terminal: nothing is cut
    assert progress.terminal_columns(None) is None
    leader, follower = pty.openpty()
    with os.fdopen(follower, "w") as stream:
        fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
        assert progress.terminal_columns(stream) == 100  # the terminal's own width first
        fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 0, 0, 0, 0))
        assert progress.terminal_columns(stream) == 120  # none: $COLUMNS
        monkeypatch.setenv("COLUMNS", "0")
        assert progress.terminal_columns(stream) == 80
    os.close(leader)


def test_interactive_means_a_terminal_or_a_jupyter_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    class Stream(io.StringIO):
        def __init__(self, tty: bool) -> None:
            super().__init__()
            self.tty = tty

        def isatty(self) -> bool:
            return super().isatty() or self.tty  # ValueError once closed, as a file's

    monkeypatch.delitem(sys.modules, "IPython", raising=False)
    assert interactive(Stream(True)) and not interactive(Stream(False))
    closed = Stream(True)
    closed.close()
    assert not interactive(closed)  # isatty on a closed stream raises ValueError
    shell = types.SimpleNamespace(config={"IPKernelApp": {}})
    ipython = types.SimpleNamespace(get_ipython=lambda: shell)
    monkeypatch.setitem(sys.modules, "IPython", ipython)
    assert interactive(Stream(False))  # a notebook: stderr is no terminal, but someone watches
    shell.config = {}  # plain IPython in a terminal: its stderr decides
    assert not interactive(Stream(False))


def test_progress_argument(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress, "interactive", lambda stream=None: False)
    assert type(open_reporter(None, "s")) is Reporter
    assert type(open_reporter(False, "s")) is Reporter
    display = open_reporter(True, "s")
    assert isinstance(display, Display)
    display.close(ok=False)  # nothing was drawn: nothing to clear
    seen: list[tuple[int, int]] = []
    stage = snapstore.snapshot(lambda n: ({"x": i} for i in range(n)), root=tmp_path)
    snap = stage(1000).materialize(progress=lambda *report: seen.append(report))
    assert seen[-1] == (1000, snap.manifest["stored_bytes"])
    with pytest.raises(TypeError, match=r"progress: expected None .* found str"):
        stage(5).materialize(progress="bar")  # type: ignore[arg-type]


def test_a_failed_display_never_fails_the_materialization(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Broken(io.StringIO):
        def write(self, s: str) -> int:
            raise OSError("stderr is gone")

    display = Display("s", file=Broken())
    with caplog.at_level(logging.WARNING, logger="snapstore"):
        display(10, 100)
        display(20, 200)
        display.close(ok=True)
    assert caplog.text.count("progress display failed") == 1


# --- waiting for another job's claim -----------------------------------------------------------


class HookClock:
    """A fake clock whose sleep advances time and runs ``hook`` (the other job's next step)."""

    def __init__(self, wall: float) -> None:
        self.wall, self.mono, self.sleeps = wall, 0.0, 0
        self.hook = lambda: None

    def time(self) -> float:
        return self.wall

    def monotonic(self) -> float:
        return self.mono

    def sleep(self, seconds: float) -> None:
        self.wall += seconds
        self.mono += seconds
        self.sleeps += 1
        self.hook()


def squares(n: int):
    for i in range(n):
        yield {"x": i * i}


def holder_commits_after(stage, args: tuple, clock: HookClock, sleeps: int):
    """Another job holds the claim on ``stage(*args)``, beating with its progress at every poll
    of the waiting job, and commits after ``sleeps`` polls."""
    snap = stage(*args)
    claim, _ = claims.acquire(snap.store, snap.fingerprint, lease=10.0, owner="holder", clock=clock)
    assert claim is not None

    def step() -> None:
        if clock.sleeps < sleeps:
            claim.report(1234 * clock.sleeps, 5_600_000 * clock.sleeps)
            claim.beat()
        elif not claim.released:
            stage._compute(stage(*args), None)
            claim.release()

    clock.hook = step
    step()
    return claim


def test_a_waiting_job_logs_the_holders_progress_at_a_modest_rate(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    stage = snapstore.snapshot(squares, root=tmp_path, lease=10.0)
    clock = HookClock(wall=1_000_000.0)
    stage.clock = clock
    holder_commits_after(stage, (7,), clock, sleeps=40)  # 80 s of polls, 2 s apart
    with caplog.at_level(logging.INFO, logger="snapstore"):
        snap = stage(7).materialize(progress=False)
    assert [s["x"] for s in snap] == [i * i for i in range(7)]
    still = [r.getMessage() for r in caplog.records if "still waiting" in r.getMessage()]
    assert len(still) == 2  # at 30 s and 60 s of the wait
    assert f"still waiting for job holder (pid {os.getpid()} on " in still[0]
    assert "), at 18,510 samples (84MB stored)" in still[0]  # its 15th beat, at 30 s
    assert "), at 37,020 samples (168MB stored)" in still[1]
    snap.close()


def test_a_waiting_jobs_display_shows_the_holder_and_its_progress(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(progress, "MIN_DRAW_SECONDS", 0.0)  # every report drawn
    stage = snapstore.snapshot(squares, root=tmp_path, lease=10.0)
    clock = HookClock(wall=1_000_000.0)
    stage.clock = clock
    holder_commits_after(stage, (7,), clock, sleeps=3)
    out = io.StringIO()
    stage(7).materialize(progress=Display(stage.name, clock, file=out))
    seen = out.getvalue().split("\r")
    assert any(f"{stage.name}: waiting for job holder (pid {os.getpid()} on " in s for s in seen)
    assert any("), at 2,468 samples (11.2MB stored) [" in s for s in seen)  # its newest beat
    (final,) = [row for row in screen(out.getvalue()) if row]  # all drawn in place
    assert final.startswith(f"{stage.name}: committed by job holder (pid {os.getpid()} on ")


def test_a_partitioned_job_shows_partitions_and_the_partitions_it_waits_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(progress, "MIN_DRAW_SECONDS", 0.0)
    stage = snapstore.snapshot(
        squares_of, root=tmp_path, lease=10.0, partition_by="items", engine="thread", workers=1
    )
    clock = HookClock(wall=1_000_000.0)
    stage.clock = clock
    snap = stage([1, 2, 3])
    where = partition_layout(stage.job(snap)).dir(2)  # parts/<stage key>/<partition fp>
    claim, _ = claims.acquire(snap.store, where, lease=10.0, owner="holder", clock=clock)
    assert claim is not None

    def step() -> None:  # the holder beats for 3 polls, then gives the partition up
        if clock.sleeps < 3:
            claim.beat()
        else:
            claim.release()

    clock.hook = step
    out = io.StringIO()
    with caplog.at_level(logging.INFO, logger="snapstore"):
        snap.materialize(progress=Display(stage.name, clock, file=out))
    seen = out.getvalue().split("\r")
    waiting = [s for s in seen if "waiting for partition 2 held by job holder" in s]
    assert waiting and "2/3 partitions [" in waiting[0] and "2 samples, " in waiting[0]
    final, said, end = screen(out.getvalue())[-3:]  # the final line, where the time went
    assert "3/3 partitions [" in final and said.startswith("snapstore: materialized 3 samples")
    assert end == ""
    assert f"waiting for job holder (pid {os.getpid()} on " in caplog.text
    assert "which is computing partition 2 (lease 10 s)" in caplog.text
    assert [s["x"] for s in snap] == [1, 4, 9]
    snap.close()


def squares_of(items: list[int]):
    for i in items:
        yield {"x": i * i}


# --- what heartbeats carry -----------------------------------------------------------------------


def test_heartbeats_carry_the_holders_progress_and_old_ones_still_read(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    clock = HookClock(wall=1_000_000.0)
    claim, _ = claims.acquire(store, "f" * 32, lease=10.0, owner="holder", clock=clock)
    assert claim is not None
    claim.beat()  # nothing reported yet: the beat says nothing of progress
    state = claims.inspect_claim(store, "f" * 32)
    assert state.beat == 0 and state.samples is None and state.stored_bytes is None
    claim.report(12, 3400)
    claim.beat()
    state = claims.inspect_claim(store, "f" * 32)
    assert (state.beat, state.samples, state.stored_bytes) == (1, 12, 3400)
    assert progress.holder_text(state).endswith(", at 12 samples (3.4kB stored)")
    beat = json.loads(store.read_bytes(f"{'f' * 32}/claims/beat-00000000-00000001"))
    assert beat == {"owner": "holder", "time": 1_000_000.0, "samples": 12, "stored_bytes": 3400}
    for odd in ({"time": 1.0}, {"time": 1.0, "samples": True, "stored_bytes": 1}, {"time": 2.0,
                "samples": "12", "stored_bytes": 3}):  # fmt: skip
        store.write_bytes(f"{'f' * 32}/claims/beat-00000000-00000009", json.dumps(odd).encode())
        state = claims.inspect_claim(store, "f" * 32)
        assert state.beat == 9 and state.samples is None and state.stored_bytes is None
        store.remove_tree(f"{'f' * 32}/claims/beat-00000000-00000009")
    claim.release()


def test_sizes_read_well() -> None:
    assert [progress.sizeof(n) for n in (0, 7, 999, 12_345, 2.5e6)] == [
        "0",
        "7",
        "999",
        "12.3k",
        "2.5M",
    ]
    assert progress.sizeof(45_100_000, "B") == "45.1MB"
    assert np.isclose(float(progress.sizeof(0.5)), 0.5)
