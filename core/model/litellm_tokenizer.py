"""litellm's packaged Anthropic tokenizer, read when it is used instead of parsed at import.

Why: `import litellm` runs `litellm.utils`, which parses the 1.8 MB tokenizer JSON
into ~14 MB of dicts, validates them with pydantic and dumps them back into a 2.4 MB
string (`claude_json_str`), the only form anything reads, and only to count tokens of
a Claude model locally. The parse is the peak of the import (bench rss:
`import litellm` peaks 16.5 MB higher and stays 10.7 MB higher than without it), and
Steward never counts tokens locally (providers report usage).

How: while litellm is imported, `importlib.resources.files` answers "null" for that
one file (`claude_json_str` becomes "null"); afterwards `claude_json_str` is removed
from `litellm.utils` and served by the module's `__getattr__` (PEP 562), which reads
the file as it is on disk the first time anything asks
(`from litellm.utils import claude_json_str`, as litellm's tokenizer does). The text
is the packaged JSON itself rather than litellm's re-dump of it: the same JSON
document. litellm is not modified; every other resource passes through untouched.
"""

from __future__ import annotations

import contextlib
import importlib.resources
import io
import sys
from collections.abc import Iterator
from typing import Any

PACKAGE = "litellm.litellm_core_utils.tokenizers"
FILE = "anthropic_tokenizer.json"
NAME = "claude_json_str"


class _Null:
    """The tokenizer file as `litellm.utils` opens it during the import: JSON null."""

    def open(self, *_args: Any, **_kwargs: Any) -> io.StringIO:
        return io.StringIO("null")


class _Package:
    """The tokenizers package's resources, except for the one file parsed at import."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def joinpath(self, *names: str) -> Any:
        return _Null() if names == (FILE,) else self._real.joinpath(*names)

    def __truediv__(self, name: str) -> Any:
        return self.joinpath(name)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._real, attr)


@contextlib.contextmanager
def unparsed() -> Iterator[None]:
    """Around `import litellm` (under the caller's import lock): the file reads as null."""
    real = importlib.resources.files

    def files(anchor: Any = None) -> Any:
        found = real(anchor)
        return _Package(found) if anchor == PACKAGE else found

    importlib.resources.files = files  # type: ignore[assignment]
    try:
        yield
    finally:
        importlib.resources.files = real


def read_on_use() -> None:
    """After the import: `claude_json_str` is read from the package file when first asked."""
    utils = sys.modules.get("litellm.utils")
    if utils is None or getattr(utils, NAME, None) != "null":
        return  # imported before `unparsed`, or a litellm that loads it differently
    delattr(utils, NAME)
    previous = getattr(utils, "__getattr__", None)

    def module_getattr(name: str) -> Any:
        if name == NAME:
            text = importlib.resources.files(PACKAGE).joinpath(FILE).read_text(encoding="utf-8")
            setattr(utils, NAME, text)  # read once; later lookups find it in the module
            return text
        if previous is not None:
            return previous(name)
        raise AttributeError(f"module 'litellm.utils' has no attribute {name!r}")

    utils.__getattr__ = module_getattr  # type: ignore[method-assign]
