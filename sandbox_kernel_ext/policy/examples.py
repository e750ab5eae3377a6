"""Policies for the common cases, chosen by name (`%config SandboxMagics.policy = "NAME"`).

Each is a policy file's text with two places filled in when it is chosen: the notebook's
folder (the kernel's working directory) and the session's workspace (a fresh folder the
magics make). `%sandbox examples` lists them; each is also a starting point to copy into a
policy file of one's own.
"""

from __future__ import annotations

import json
import os
import re

from .errors import ConfigurationError
from .models import CapabilityDeclaration
from .parser import CapabilityParser

__all__ = ["EXAMPLES", "example_policy", "example_text"]

_WORKSPACE_TABLE = """paths:
  workspace: {root: WORKSPACE, mode: rw, write_approval: false}
"""

# name -> (what it is for, the policy's text)
EXAMPLES: dict[str, tuple[str, str]] = {
    "read-notebook-folder": (
        "the notebook's folder read-only (its data files), new files in the workspace, "
        "no network",
        """filesystem_config:
  mode: read_write
  readable_paths: [NOTEBOOK]
  writable_paths: [WORKSPACE]
""" + _WORKSPACE_TABLE),
    "data-with-approvals": (
        "the notebook's folder read-only, its data/ folder writable with a person's yes "
        "for each write, new files in the workspace, no network",
        """filesystem_config:
  mode: read_write
  readable_paths: [NOTEBOOK]
  writable_paths: [WORKSPACE]
paths:
  workspace: {root: WORKSPACE, mode: rw, write_approval: false}
  data: {root: DATA, mode: rw, write_approval: true}
"""),
    "pip-from-pypi": (
        "the notebook's folder read-only, new files in the workspace, and the network only "
        "to the Python package index (for %pip install)",
        """filesystem_config:
  mode: read_write
  readable_paths: [NOTEBOOK]
  writable_paths: [WORKSPACE]
network_egress_rules:
  - {domain: pypi.org, ports: [443]}
  - {domain: files.pythonhosted.org, ports: [443]}
""" + _WORKSPACE_TABLE),
}


def example_text(name: str, notebook: str, workspace: str) -> str:
    """The example's policy text for this notebook folder and workspace."""
    if name not in EXAMPLES:
        raise ConfigurationError(f"no example policy named {name!r} (there are: "
                                 f"{', '.join(EXAMPLES)})")
    data = os.path.join(notebook, "data")
    if "DATA" in EXAMPLES[name][1] and not os.path.isdir(data):
        raise ConfigurationError(f"the example policy {name!r} needs a folder data/ beside the "
                                 f"notebook ({data}); create it, or choose another example")
    places = {"WORKSPACE": workspace, "NOTEBOOK": notebook, "DATA": data}
    # one pass, so a path holding one of the words is not filled in again; a JSON string is
    # a YAML string (non-ASCII written as itself: YAML reads a \\u surrogate pair as two)
    return re.sub(r"\b(WORKSPACE|NOTEBOOK|DATA)\b",
                  lambda match: json.dumps(places[match.group(1)], ensure_ascii=False),
                  EXAMPLES[name][1])


def example_policy(name: str, notebook: str, workspace: str) -> CapabilityDeclaration:
    """The example, parsed, for this notebook folder and workspace."""
    return CapabilityParser.from_string(example_text(name, notebook, workspace),
                                        source=f"example policy {name}")
