"""Real headless Chromium driven over the DevTools protocol on a pipe (--remote-debugging-pipe): open a page from
disk with no network, wait for a state the page sets (never a virtual-time budget, never a sleep), evaluate
JavaScript, take full-page screenshots and count their non-white pixels in the browser."""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
DEADLINE_S = 90.0  # a guard against a hung browser, not a wait: every wait below ends on a reply or an event

# Resolves once the element matching `selector` has `attribute` (a MutationObserver, no polling).
WAIT_FOR = """new Promise(resolve => {
  const done = () => { const el = document.querySelector(%(sel)s); return el && el.hasAttribute(%(attr)s); };
  if (done()) { resolve(true); return; }
  const seen = new MutationObserver(() => { if (done()) { seen.disconnect(); resolve(true); } });
  seen.observe(document, {attributes: true, subtree: true, childList: true});
})"""

# The screenshot's pixels that are not (near) white, decoded by the browser from the PNG file's bytes.
NON_WHITE = """new Promise((resolve, reject) => {
  const img = new Image();
  img.onload = () => {
    const c = document.createElement("canvas"); c.width = img.width; c.height = img.height;
    const g = c.getContext("2d"); g.drawImage(img, 0, 0);
    const d = g.getImageData(0, 0, c.width, c.height).data;
    let n = 0;
    for (let i = 0; i < d.length; i += 4) { if (d[i] < 235 || d[i + 1] < 235 || d[i + 2] < 235) { n++; } }
    resolve({width: img.width, height: img.height, nonWhite: n});
  };
  img.onerror = () => reject(new Error("not a PNG"));
  img.src = "data:image/png;base64,%s";
})"""


def _above_4(fd: int) -> int:
    """The same pipe end on a descriptor above 4 (the original closed)."""
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
    os.close(fd)
    return moved


class Browser:
    """One headless Chromium; `open` loads a page in a fresh tab and returns its session id."""

    def __init__(self, profile: Path, width: int = 1400, height: int = 1000) -> None:
        assert CHROMIUM is not None
        profile.mkdir(parents=True, exist_ok=True)
        to_chrome, self._write = os.pipe()  # Chromium reads commands on its fd 3, writes replies on fd 4
        self._read, from_chrome = os.pipe()
        to_chrome, from_chrome = (_above_4(fd) for fd in (to_chrome, from_chrome))  # `3<&N 4>&M` cannot collide
        flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--remote-debugging-pipe", f"--user-data-dir={profile}", "--allow-file-access-from-files",
                 "--proxy-server=127.0.0.1:9", "--host-resolver-rules=MAP * ~NOTFOUND",  # no network at all
                 "--hide-scrollbars", f"--window-size={width},{height}"]  # fmt: skip
        # bash moves the pipe ends onto fds 3 and 4 (a fixed script; the arguments pass through "$@" untouched)
        script = f'exec "$0" "$@" 3<&{to_chrome} 4>&{from_chrome}'
        self.proc = subprocess.Popen(["bash", "-c", script, CHROMIUM, *flags], pass_fds=(to_chrome, from_chrome),
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        os.close(to_chrome)
        os.close(from_chrome)
        self.width, self.height = width, height
        self._buffer, self._next_id = b"", 0
        self.events: list[dict[str, Any]] = []

    def close(self) -> None:
        try:
            self.send("Browser.close")
        except (OSError, AssertionError):
            pass
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._write)
        os.close(self._read)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # ---- the protocol: one JSON message per NUL-terminated frame
    def _message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            ready, _, _ = select.select([self._read], [], [], max(0.0, deadline - time.monotonic()))
            assert ready, "Chromium did not answer within the deadline"
            chunk = os.read(self._read, 1 << 20)
            assert chunk, f"Chromium closed the pipe (exit {self.proc.poll()})"
            self._buffer += chunk
        frame, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(frame)

    def send(self, method: str, session: str | None = None, **params: Any) -> dict[str, Any]:
        """Send one command and return its result (events that arrive meanwhile are kept in `events`)."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        os.write(self._write, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + DEADLINE_S
        while True:
            reply = self._message(deadline)
            if reply.get("id") == self._next_id:
                assert "error" not in reply, f"{method}: {reply['error']}"
                return reply.get("result", {})
            self.events.append(reply)

    def wait_event(self, method: str, session: str) -> dict[str, Any]:
        """The first event `method` of this session not yet consumed."""
        deadline = time.monotonic() + DEADLINE_S
        while True:
            for index, event in enumerate(self.events):
                if event.get("method") == method and event.get("sessionId") == session:
                    return self.events.pop(index)
            self.events.append(self._message(deadline))

    def evaluate(self, session: str, expression: str) -> Any:
        """The value of a JavaScript expression in the page (promises awaited); a thrown error fails the test."""
        result = self.send("Runtime.evaluate", session, expression=expression, awaitPromise=True,
                           returnByValue=True)  # fmt: skip
        assert "exceptionDetails" not in result, result["exceptionDetails"]
        return result["result"].get("value")

    # ---- pages
    def open(self, page: Path, ready: tuple[str, str] = ("html", "data-rendered-ms")) -> str:
        """Load `page` in a new tab and wait until the element `ready[0]` has the attribute `ready[1]`."""
        target = self.send("Target.createTarget", url="about:blank")["targetId"]
        session = self.send("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.send("Page.enable", session)
        self.send("Runtime.enable", session)
        self.send("Emulation.setDeviceMetricsOverride", session, width=self.width, height=self.height,
                  deviceScaleFactor=1, mobile=False)  # fmt: skip
        self.send("Page.navigate", session, url=page.resolve().as_uri())
        self.wait_event("Page.loadEventFired", session)
        selector, attribute = ready
        self.evaluate(session, WAIT_FOR % {"sel": json.dumps(selector), "attr": json.dumps(attribute)})
        return session

    def problems(self, session: str) -> list[str]:
        """Console errors and warnings and uncaught exceptions the page raised so far."""
        out = []
        for event in self.events:
            if event.get("sessionId") != session:
                continue
            params = event.get("params", {})
            if event.get("method") == "Runtime.exceptionThrown":
                out.append(json.dumps(params.get("exceptionDetails", {}))[:500])
            elif event.get("method") == "Runtime.consoleAPICalled" and params.get("type") in ("error", "warning"):
                out.append(" ".join(str(a.get("value", a.get("description"))) for a in params.get("args", [])))
        return out

    def screenshot(self, session: str, path: Path, selector: str | None = None) -> dict[str, int]:
        """A PNG of the whole page (or of the element `selector`) written to `path`; returns its size and its
        count of non-white pixels, read back from the file."""
        clip = self.evaluate(session, f"""(() => {{
          const el = {json.dumps(selector)} ? document.querySelector({json.dumps(selector)}) : null;
          const r = el ? el.getBoundingClientRect() : null;
          return r ? {{x: r.left + scrollX, y: r.top + scrollY, width: r.width, height: r.height, scale: 1}}
                   : {{x: 0, y: 0, width: document.documentElement.scrollWidth,
                      height: document.documentElement.scrollHeight, scale: 1}};
        }})()""")  # fmt: skip
        shot = self.send("Page.captureScreenshot", session, format="png", clip=clip, captureBeyondViewport=True)
        path.write_bytes(base64.b64decode(shot["data"]))
        encoded = base64.b64encode(path.read_bytes()).decode()
        return self.evaluate(session, NON_WHITE % encoded)
