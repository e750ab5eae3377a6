"""A real JupyterLab on loopback and Debian's Chromium driven by Playwright, for browser tests.

Everything runs from throw-away folders (server root, Jupyter config/data/runtime, Lab
settings, browser profile) and stops in `finally`. Playwright uses only its pip package with
`executable_path` to the system Chromium: nothing downloads a browser (never
`playwright install`); `scripts/system_deps.sh` installs Chromium where it is missing.
Pitfalls this avoids are listed in /work/shared/DESIGN.md ("Browser-test pitfalls seen").
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbformat
import psutil
import pytest
from browser_waits import WAIT_S, wait_for

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# Lab settings for a quiet, deterministic run: no autosave (the test owns the file), no news.
LAB_SETTINGS = {
    "@jupyterlab/docmanager-extension/plugin": {"autosave": False},
    "@jupyterlab/apputils-extension/notification": {"fetchNews": "false",
                                                    "checkForUpdates": False},
}


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class LabServer:
    """A running JupyterLab: its URL, token, root folder and REST API."""

    url: str
    token: str
    root: Path
    process: subprocess.Popen
    log: Path

    def api(self, path: str, method: str = "GET") -> Any:
        request = urllib.request.Request(
            f"{self.url}{path}", method=method, headers={"Authorization": f"token {self.token}"}
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            body = response.read()
        return json.loads(body) if body else None

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def _start_lab(base: Path) -> LabServer:
    root = base / "root"
    settings = base / "lab-settings"
    for name, values in LAB_SETTINGS.items():
        target = settings / f"{name}.jupyterlab-settings"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(values))
    root.mkdir()
    env = {
        **os.environ,
        "JUPYTER_CONFIG_DIR": str(base / "config"),
        "JUPYTER_DATA_DIR": str(base / "data"),
        "JUPYTER_RUNTIME_DIR": str(base / "runtime"),
        "JUPYTERLAB_SETTINGS_DIR": str(settings),
        "JUPYTERLAB_WORKSPACES_DIR": str(base / "workspaces"),
        "IPYTHONDIR": str(base / "ipython"),
    }
    port, token = _free_port(), secrets.token_hex(16)
    log = base / "lab.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "jupyterlab", "--no-browser",
             "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
             "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}",
             "--ServerApp.allow_root=True", f"--ServerApp.root_dir={root}",
             "--LabApp.news_url=", "--LabApp.extension_manager=readonly"],
            cwd=root, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
        )
    server = LabServer(f"http://127.0.0.1:{port}", token, root, process, log)

    def ready() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"JupyterLab exited with {process.returncode}:\n"
                                 f"{server.log_tail()}")
        try:
            server.api("/api/status")
        except (urllib.error.URLError, ConnectionError):
            return False
        return True

    try:
        wait_for("JupyterLab to answer /api/status", ready)
    except BaseException:
        _stop_lab(server)
        raise
    return server


def _stop_lab(server: LabServer) -> None:
    """Shut kernels down through the API, stop the server, then sweep any process it left
    (kernels run in their own sessions, so signalling the server's group would miss them)."""
    try:
        descendants = psutil.Process(server.process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        descendants = []
    if server.process.poll() is None:
        try:
            for kernel in server.api("/api/kernels"):
                server.api(f"/api/kernels/{kernel['id']}", method="DELETE")
        except (urllib.error.URLError, ConnectionError, OSError):
            pass  # the sweep below still stops them
        server.process.terminate()
        try:
            server.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait()
    for proc in descendants:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(descendants, timeout=10)


@pytest.fixture(scope="module")
def lab_server() -> Iterator[LabServer]:
    """Per test module, so no server is left a child of pytest while other tests (which check
    that they leave no child process) run."""
    base = Path(tempfile.mkdtemp(prefix="lab-test-"))
    server = _start_lab(base)
    try:
        yield server
    finally:
        _stop_lab(server)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def browser_context() -> Iterator[Any]:
    """Per test module: Playwright's sync API keeps an asyncio loop running on this thread
    while it is open, and tests after the browser ones call `asyncio.run`."""
    assert CHROMIUM.exists(), (
        f"{CHROMIUM} is missing: run `bash scripts/system_deps.sh` (apt-get install chromium)"
    )
    from playwright.sync_api import sync_playwright

    profile = tempfile.mkdtemp(prefix="chromium-profile-")
    try:
        with sync_playwright() as playwright:
            context = playwright.chromium.launch_persistent_context(
                profile, executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True,
                viewport={"width": 1280, "height": 900},
            )
            try:
                context.set_default_timeout(WAIT_S * 1000)
                yield context
            finally:
                context.close()
    finally:
        shutil.rmtree(profile, ignore_errors=True)


@dataclass
class NotebookPage:
    """One notebook open in Lab: run its cells and look inside their outputs."""

    server: LabServer
    page: Any
    path: str
    session_id: str = ""

    def cell(self, index: int) -> Any:
        return self.page.locator(".jp-NotebookPanel .jp-Notebook .jp-Cell").nth(index)

    def output(self, index: int) -> Any:
        return self.cell(index).locator(".jp-OutputArea")

    def button(self, index: int, name: str) -> Any:
        """A button in a cell's output found by its accessible name (the toolbar has buttons
        too, so never search the whole page)."""
        return self.output(index).get_by_role("button", name=name)

    @staticmethod
    def wait_until(what: str, check: Callable[[], Any], timeout: float = WAIT_S) -> Any:
        return wait_for(what, check, timeout)

    def kernel_state(self) -> str | None:
        for session in self.server.api("/api/sessions"):
            if session["path"] == self.path:
                self.session_id = session["id"]
                return session["kernel"]["execution_state"]
        return None

    def wait_kernel_idle(self) -> None:
        """Through the session's kernel status on the server: the toolbar's indicator says
        idle before a kernel is even attached."""
        wait_for(f"the kernel of {self.path} to be idle", lambda: self.kernel_state() == "idle")

    def prompt(self, index: int) -> str:
        return self.cell(index).locator(".jp-InputPrompt").inner_text().strip()

    def is_running(self, index: int) -> bool:
        return "*" in self.prompt(index)

    def run_cell(self, index: int) -> None:
        """Run one cell in place with Ctrl+Enter (Shift+Enter on the last cell appends one)
        and wait until it has started or finished."""
        before = self.prompt(index)
        editor = self.cell(index).locator(".jp-InputArea-editor")

        def focused() -> bool:
            # A click can go to leaving an output frame that had the focus: click again.
            editor.click()
            return bool(editor.evaluate("el => el.contains(document.activeElement)"))

        wait_for(f"cell {index}'s editor to have the focus", focused)
        self.page.keyboard.press("Control+Enter")
        wait_for(f"cell {index} to start", lambda: self.prompt(index) != before)

    def wait_cell_done(self, index: int) -> None:
        wait_for(f"cell {index} to finish", lambda: not self.is_running(index)
                 and any(ch.isdigit() for ch in self.prompt(index)))


@pytest.fixture
def open_notebook(
    lab_server: LabServer, browser_context: Any
) -> Iterator[Callable[..., NotebookPage]]:
    """`open_notebook(name, [cell sources], frontend="lab")` writes the notebook into the
    server's root, opens it in a new page (JupyterLab, or Notebook 7 with "notebook") and
    waits for its kernel; without sources it opens the file that is there. Pages and sessions
    are closed afterwards."""
    opened: list[NotebookPage] = []

    def open_(name: str, sources: list[str] | None = None,
              frontend: str = "lab") -> NotebookPage:
        if sources is None:
            sources = [cell.source for cell in nbformat.read(lab_server.root / name, 4).cells]
        else:
            nb = nbformat.v4.new_notebook()
            nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                         "language": "python"}
            nb.cells = [nbformat.v4.new_code_cell(src) for src in sources]
            nbformat.write(nb, lab_server.root / name)
        page = browser_context.new_page()
        notebook = NotebookPage(lab_server, page, name)
        opened.append(notebook)
        # `reset`: a fresh workspace, so no notebook of an earlier test covers this one.
        where = {"lab": "lab/tree", "notebook": "notebooks"}[frontend]
        page.goto(f"{lab_server.url}/{where}/{name}?reset&token={lab_server.token}")
        notebook.cell(len(sources) - 1).locator(".jp-InputArea-editor").wait_for()
        notebook.wait_kernel_idle()
        return notebook

    try:
        yield open_
    finally:
        for notebook in opened:
            try:
                notebook.page.close()
            finally:
                if notebook.session_id:
                    try:
                        lab_server.api(f"/api/sessions/{notebook.session_id}", method="DELETE")
                    except urllib.error.HTTPError as error:
                        if error.code != 404:
                            raise


@pytest.fixture
def roots() -> Iterator[Path]:
    """A folder with a policy (`policy.yaml`) whose `data/` folder is writable with a yes for
    each write; readable by the unprivileged uid a root kernel's sandbox runs as."""
    base = Path(tempfile.mkdtemp(prefix="sbx-browser-"))
    try:
        (base / "data").mkdir()
        for folder in (base, base / "data"):
            os.chmod(folder, 0o755)
        (base / "policy.yaml").write_text(
            "filesystem_config: {mode: read_only, readable_paths: []}\n"
            "paths:\n"
            f"  data: {{root: {base / 'data'}, mode: rw, write_approval: true}}\n"
            "resource_limits: {max_memory_mb: 512}\n"
        )
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)
