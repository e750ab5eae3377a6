"""orbiter's `Tool`: the shape every agent tool of this layer has."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

__all__ = ["Tool"]


class Tool(ABC):
    """A named async tool with a JSON-schema for its arguments."""

    name: ClassVar[str]
    description: ClassVar[str]
    parameters: ClassVar[dict[str, Any]]

    @abstractmethod
    async def execute(self, **kwargs: Any) -> str | dict[str, Any]: ...

    def schema(self) -> dict[str, Any]:
        """The function-calling definition of this tool."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }
