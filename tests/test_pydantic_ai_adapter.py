"""The PydanticAI adapter, driven by a real Agent so we test what a model actually sees."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pydantic_ai")

from pydantic_ai import Agent  # noqa: E402
from pydantic_ai.messages import (  # noqa: E402
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel  # noqa: E402
from pydantic_ai.tools import ToolDefinition  # noqa: E402

from sandbox_kernel_ext.files.pydantic_ai import as_pydantic_ai_toolset  # noqa: E402
from sandbox_kernel_ext.files.tool_schemas import FILE_TOOLS, json_schema  # noqa: E402
from sandbox_kernel_ext.files.toolset import FileSystemToolset  # noqa: E402
from sandbox_kernel_ext.policy.path_config import PathConfig, SandboxConfig  # noqa: E402
from sandbox_kernel_ext.policy.sandbox import Sandbox  # noqa: E402

Call = tuple[str, dict[str, Any]]


class Script:
    """A FunctionModel body that makes one scripted tool call per step, then answers
    'done', recording every request it received (what the model was shown)."""

    def __init__(self, calls: list[Call]) -> None:
        self.calls = list(calls)
        self.seen: list[list[ModelMessage]] = []
        self.tools: list[ToolDefinition] = []

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.seen.append(list(messages))
        self.tools = list(info.function_tools)
        step = len(self.seen) - 1
        if step < len(self.calls):
            name, args = self.calls[step]
            return ModelResponse(parts=[ToolCallPart(name, args, tool_call_id=f"call-{step}")])
        return ModelResponse(parts=[TextPart("done")])

    def parts(self, request_index: int) -> list[Any]:
        """The parts of the last request the model saw at step `request_index`."""
        last = self.seen[request_index][-1]
        assert isinstance(last, ModelRequest)
        return list(last.parts)


def assert_retried(part: Any, tool_name: str, cause: str) -> None:
    """PydanticAI 2.x sends a retry as the call's own return part marked 'retried'
    (older versions used RetryPromptPart)."""
    assert isinstance(part, ToolReturnPart), part
    assert part.tool_name == tool_name
    assert part.outcome == "retried"
    assert part.retry is not None and part.retry.cause == cause


def run(toolset: FileSystemToolset, calls: list[Call]) -> Script:
    script = Script(calls)
    agent = Agent(FunctionModel(script), toolsets=[as_pydantic_ai_toolset(toolset)])
    result = agent.run_sync("go")
    assert result.output == "done"
    return script


def test_model_sees_file_tools_with_their_schemas(tmp_path: Path) -> None:
    toolset = FileSystemToolset.create_default(tmp_path, id="files")
    script = run(toolset, [])
    seen = {t.name: t for t in script.tools}
    assert list(seen) == [spec.name for spec in FILE_TOOLS]
    for spec in FILE_TOOLS:
        assert seen[spec.name].parameters_json_schema == json_schema(spec.args)
        assert seen[spec.name].description.startswith(spec.description)
        assert "Writable: data" in seen[spec.name].description


def test_id_and_max_retries_come_from_the_toolset(tmp_path: Path) -> None:
    toolset = FileSystemToolset(
        FileSystemToolset.create_default(tmp_path).sandbox, id="fs-1", max_retries=4
    )
    assert as_pydantic_ai_toolset(toolset).id == "fs-1"
    script = run(toolset, [("read_file", {"path": "/data/missing.txt"})])
    (retry,) = script.parts(1)
    assert_retried(retry, "read_file", "model_retry")
    assert retry.retry.max_retries == 4


def test_write_then_read_roundtrip(tmp_path: Path) -> None:
    toolset = FileSystemToolset.create_default(tmp_path)
    script = run(
        toolset,
        [
            ("write_file", {"path": "/data/notes/a.txt", "content": "hello agent"}),
            ("read_file", {"path": "/data/notes/a.txt"}),
        ],
    )
    assert (tmp_path / "notes" / "a.txt").read_text() == "hello agent"
    (written,) = script.parts(1)
    assert isinstance(written, ToolReturnPart) and written.tool_name == "write_file"
    assert written.content["path"] == "data/notes/a.txt"
    (read,) = script.parts(2)
    assert isinstance(read, ToolReturnPart) and read.tool_name == "read_file"
    assert read.content["content"] == "hello agent"
    assert read.content["truncated"] is False
    json.dumps(read.content)  # JSON-safe, as FileSystemToolset.call promises


def test_list_tools_return_json_safe_entries(tmp_path: Path) -> None:
    (tmp_path / "x.txt").write_text("x")
    toolset = FileSystemToolset.create_default(tmp_path)
    script = run(toolset, [("list_directory", {"path": "/data"})])
    (listed,) = script.parts(1)
    assert listed.content == {"entries": [{"name": "x.txt", "type": "file", "size": 1}]}


def test_path_outside_sandbox_is_a_retry_prompt_with_the_sandbox_message(tmp_path: Path) -> None:
    toolset = FileSystemToolset.create_default(tmp_path)
    script = run(toolset, [("read_file", {"path": "/etc/passwd"})])
    (retry,) = script.parts(1)
    assert_retried(retry, "read_file", "model_retry")
    assert retry.content.startswith("Cannot access '/etc/passwd'")
    assert "Readable: data. Writable: data." in retry.content
    # ...and it is in the text the model is actually given.
    assert "Cannot access '/etc/passwd'" in retry.model_response_str()


def test_approval_denial_goes_back_to_the_model(tmp_path: Path) -> None:
    config = SandboxConfig(paths={"data": PathConfig(root=str(tmp_path), mode="rw", write_approval=True)})
    toolset = FileSystemToolset(Sandbox(config))  # default broker: nobody to ask, so denied
    script = run(toolset, [("write_file", {"path": "/data/a.txt", "content": "x"})])
    (retry,) = script.parts(1)
    assert_retried(retry, "write_file", "model_retry")
    assert "write of 'data/a.txt' was not approved" in retry.model_response_str()
    assert not (tmp_path / "a.txt").exists()


def test_bad_arguments_are_a_retry_prompt(tmp_path: Path) -> None:
    toolset = FileSystemToolset.create_default(tmp_path)
    script = run(toolset, [("read_file", {"path": "/data/a.txt", "offset": -1, "bogus": 1})])
    (retry,) = script.parts(1)
    assert_retried(retry, "read_file", "validation_error")
    assert isinstance(retry.content, list)
    assert {e["loc"][-1] for e in retry.content} == {"offset", "bogus"}


def test_read_only_sandbox_hides_write_tools(tmp_path: Path) -> None:
    toolset = FileSystemToolset.create_default(tmp_path, mode="ro")
    script = run(toolset, [])
    names = [t.name for t in script.tools]
    assert names == [spec.name for spec in FILE_TOOLS if not spec.writes]
    assert names == [d["function"]["name"] for d in toolset.tool_definitions()]


def test_tool_calls_run_off_the_event_loop_thread(tmp_path: Path) -> None:
    toolset = FileSystemToolset.create_default(tmp_path)
    seen: list[tuple[int, bool]] = []
    real_call: Callable[..., dict[str, Any]] = toolset.call

    def recording_call(name: str, arguments: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        try:
            asyncio.get_running_loop()
            on_loop = True
        except RuntimeError:
            on_loop = False
        seen.append((threading.get_ident(), on_loop))
        return real_call(name, arguments, **kwargs)

    toolset.call = recording_call  # type: ignore[method-assign]
    loop_threads: list[int] = []

    async def script_body(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        # An async model function runs on the event loop's own thread.
        loop_threads.append(threading.get_ident())
        if len(loop_threads) == 1:
            return ModelResponse(parts=[ToolCallPart("list_directory", {"path": "/data"})])
        return ModelResponse(parts=[TextPart("done")])

    Agent(FunctionModel(script_body), toolsets=[as_pydantic_ai_toolset(toolset)]).run_sync("go")
    ((tool_thread, on_loop),) = seen
    assert not on_loop
    assert tool_thread not in loop_threads


def test_package_imports_without_pydantic_ai() -> None:
    code = (
        "import sys\n"
        "sys.modules['pydantic_ai'] = None\n"
        "import sandbox_kernel_ext\n"
        "import sandbox_kernel_ext.files.toolset\n"
        "assert 'pydantic_ai' not in {m.split('.')[0] for m, v in sys.modules.items() if v is not None}\n"
        "try:\n"
        "    import sandbox_kernel_ext.files.pydantic_ai\n"
        "except ImportError as exc:\n"
        "    assert \"pip install 'sandbox_kernel_ext[pydantic-ai]'\" in str(exc), exc\n"
        "else:\n"
        "    raise AssertionError('adapter imported without pydantic_ai')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
